// The RWKV-7 recurrence over each segment of a batch step (rwkv-spec §2.5, §4.2):
//   S ← S (diag(decay) + a bᵀ) + v kᵀ;   y = S r
// S is value-major (S[value, key]) per head, slot-first in the state buffer. One
// workgroup per (head, segment); thread i owns row i of S (value i) in registers and walks
// the segment's tokens in order, staging r, decay, k, a, b of each token in shared memory.

struct Params {
    width: u32,
    head_size: u32,
    seg_base: u32,
    r_off: u32,
    w_off: u32,       // log decay
    k_off: u32,
    v_off: u32,
    a_off: u32,
    b_off: u32,
    y_off: u32,
    state_off: u32,   // this layer's WKV state within a slot
    slot_stride: u32, // floats per slot in the state buffer
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read> plan: array<u32>;

const MAX_N: u32 = 64u;
var<workgroup> sr: array<f32, 64>;
var<workgroup> sw: array<f32, 64>;
var<workgroup> sk: array<f32, 64>;
var<workgroup> sa: array<f32, 64>;
var<workgroup> sb: array<f32, 64>;
var<workgroup> count: u32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n = p.head_size;
    let i = lid.x;
    let valid = i < n;
    let h = wg.x;
    let seg = p.seg_base + 3u * wg.y;
    let slot = plan[seg];
    let start = plan[seg + 1u];
    if (i == 0u) {
        count = plan[seg + 2u];
    }
    let tokens = workgroupUniformLoad(&count);
    let base = p.state_off + slot * p.slot_stride + h * n * n + min(i, n - 1u) * n;
    var s: array<f32, 64>;
    if (valid) {
        for (var j = 0u; j < n; j++) {
            s[j] = state[base + j];
        }
    }
    for (var t = 0u; t < tokens; t++) {
        let off = (start + t) * p.width + h * n;
        if (valid) {
            sr[i] = act[p.r_off + off + i];
            sw[i] = exp(act[p.w_off + off + i]);
            sk[i] = act[p.k_off + off + i];
            sa[i] = act[p.a_off + off + i];
            sb[i] = act[p.b_off + off + i];
        }
        workgroupBarrier();
        if (valid) {
            var s_a = 0.0;
            for (var j = 0u; j < n; j++) {
                s_a += s[j] * sa[j];
            }
            let v = act[p.v_off + off + i];
            var y = 0.0;
            for (var j = 0u; j < n; j++) {
                s[j] = s[j] * sw[j] + s_a * sb[j] + v * sk[j];
                y += s[j] * sr[j];
            }
            act[p.y_off + off + i] = y;
        }
        workgroupBarrier();
    }
    if (valid) {
        for (var j = 0u; j < n; j++) {
            state[base + j] = s[j];
        }
    }
}
