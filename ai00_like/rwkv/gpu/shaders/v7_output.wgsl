// RWKV-7 time-mix output before W_o, one workgroup per (head, row), in place on y:
//   y = (GroupNorm_h(y) ⊙ ln_x.w + ln_x.b + (Σ_i r_i k'_i r_k[h, i]) v) ⊙ g

struct Params {
    width: u32,
    head_size: u32,
    y_off: u32,
    r_off: u32,
    k_off: u32,
    v_off: u32,
    g_off: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> vecs: array<f32>; // ln_x.weight, ln_x.bias, r_k (each width)

const THREADS: u32 = 64u;
var<workgroup> red: array<f32, 64>;

fn sum_all(v: f32, i: u32) -> f32 {
    red[i] = v;
    workgroupBarrier();
    for (var s = THREADS / 2u; s > 0u; s >>= 1u) {
        if (i < s) {
            red[i] += red[i + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = lid.x;
    let valid = i < p.head_size;
    let n = f32(p.head_size);
    let c = wg.x * p.head_size + min(i, p.head_size - 1u);
    let e = wg.y * p.width + c;
    let y = select(0.0, act[p.y_off + e], valid);
    let mean = sum_all(y, i) / n;
    let d = select(0.0, y - mean, valid);
    let variance = sum_all(d * d, i) / n;
    let rk = select(0.0, act[p.r_off + e] * act[p.k_off + e] * vecs[2u * p.width + c], valid);
    let bonus = sum_all(rk, i);
    if (valid) {
        let normed = d / sqrt(variance + p.eps) * vecs[c] + vecs[p.width + c];
        act[p.y_off + e] = (normed + bonus * act[p.v_off + e]) * act[p.g_off + e];
    }
}
