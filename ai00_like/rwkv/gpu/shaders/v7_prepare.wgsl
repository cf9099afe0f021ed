// RWKV-7 time mix between the projections and the WKV recurrence (rwkv-spec §2.5), one
// workgroup per (head, row), thread i = channel i of the head:
//   log decay  = −e^{−1/2} σ(w0 + lora_w)          (in the w region, over its LoRA output)
//   α          = σ(a0 + lora_a)
//   κ̂          = normalize(k ⊙ k_k) over the head
//   k'         = k ⊙ (1 + (α − 1) ⊙ k_a)
//   v          = v + (v_first − v) ⊙ σ(v0 + lora_v)  (layer 0 keeps v as v_first instead)
//   a = −κ̂,  b = κ̂ ⊙ α                             (a over the α LoRA, b over the v LoRA)

struct Params {
    width: u32,
    head_size: u32,
    first_layer: u32,
    k_off: u32,
    v_off: u32,
    w_off: u32,
    a_off: u32,
    b_off: u32,       // holds the value-residual LoRA output on entry
    vfirst_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> vecs: array<f32>; // w0, a0, v0, k_k, k_a (each width)

const THREADS: u32 = 64u;
const DECAY_SCALE: f32 = 0.606531;
var<workgroup> red: array<f32, 64>;

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = lid.x;
    let valid = i < p.head_size;
    let c = wg.x * p.head_size + min(i, p.head_size - 1u);
    let e = wg.y * p.width + c;
    let k = act[p.k_off + e];
    let kk = k * vecs[3u * p.width + c];
    red[i] = select(0.0, kk * kk, valid);
    workgroupBarrier();
    for (var s = THREADS / 2u; s > 0u; s >>= 1u) {
        if (i < s) {
            red[i] += red[i + s];
        }
        workgroupBarrier();
    }
    let kappa = kk / max(sqrt(red[0]), 1e-12);
    if (!valid) {
        return;
    }
    let alpha = sigmoid(vecs[p.width + c] + act[p.a_off + e]);
    act[p.k_off + e] = k * (1.0 + (alpha - 1.0) * vecs[4u * p.width + c]);
    act[p.w_off + e] = -DECAY_SCALE * sigmoid(vecs[c] + act[p.w_off + e]);
    let v = act[p.v_off + e];
    if (p.first_layer == 1u) {
        act[p.vfirst_off + e] = v;
    } else {
        act[p.v_off + e] = v + (act[p.vfirst_off + e] - v) * sigmoid(vecs[2u * p.width + c] + act[p.b_off + e]);
    }
    act[p.a_off + e] = -kappa;
    act[p.b_off + e] = kappa * alpha;
}
