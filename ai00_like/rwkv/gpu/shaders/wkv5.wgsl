// The RWKV-5/6 recurrence over each segment of a batch step (rwkv-spec §2.3–2.4):
//   y[j] = Σ_i r[i] (u[i] k[i] v[j] + S[i, j]);   S[i, j] ← decay[i] S[i, j] + k[i] v[j]
// S is key-major (S[key, value]) per head, slot-first in the state buffer. One workgroup
// per (head, segment); thread j owns column j of S (value j). The log decay comes per row
// from the activations (v6) or per channel from `vecs` (v5).

struct Params {
    width: u32,
    head_size: u32,
    seg_base: u32,
    dynamic_decay: u32,
    r_off: u32,
    w_off: u32,
    k_off: u32,
    v_off: u32,
    y_off: u32,
    state_off: u32,
    slot_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read> plan: array<u32>;
@group(0) @binding(4) var<storage, read> vecs: array<f32>; // bonus u, then v5's log decay or v6's λ (each width)

var<workgroup> sr: array<f32, 64>;
var<workgroup> sw: array<f32, 64>;
var<workgroup> sk: array<f32, 64>;
var<workgroup> su: array<f32, 64>;
var<workgroup> count: u32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n = p.head_size;
    let j = lid.x;
    let valid = j < n;
    let h = wg.x;
    let seg = p.seg_base + 3u * wg.y;
    let slot = plan[seg];
    let start = plan[seg + 1u];
    if (j == 0u) {
        count = plan[seg + 2u];
    }
    let tokens = workgroupUniformLoad(&count);
    let jj = min(j, n - 1u);
    let base = p.state_off + slot * p.slot_stride + h * n * n + jj;
    var s: array<f32, 64>;
    if (valid) {
        su[j] = vecs[h * n + j];
        for (var i = 0u; i < n; i++) {
            s[i] = state[base + i * n];
        }
    }
    for (var t = 0u; t < tokens; t++) {
        let off = (start + t) * p.width + h * n;
        if (valid) {
            sr[j] = act[p.r_off + off + j];
            sk[j] = act[p.k_off + off + j];
            if (p.dynamic_decay == 1u) { // v6: decay = exp(−exp(λ + LoRA))
                sw[j] = exp(-exp(vecs[p.width + h * n + j] + act[p.w_off + off + j]));
            } else {
                sw[j] = exp(vecs[p.width + h * n + j]);
            }
        }
        workgroupBarrier();
        if (valid) {
            let v = act[p.v_off + off + j];
            var y = 0.0;
            for (var i = 0u; i < n; i++) {
                let kv = sk[i] * v;
                y += sr[i] * (su[i] * kv + s[i]);
                s[i] = sw[i] * s[i] + kv;
            }
            act[p.y_off + off + j] = y;
        }
        workgroupBarrier();
    }
    if (valid) {
        for (var i = 0u; i < n; i++) {
            state[base + i * n] = s[i];
        }
    }
}
