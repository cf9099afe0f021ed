// Layer norm of `rows` rows of `width` values, in groups (1 group: LayerNorm). One
// workgroup per (group, row): mean, then the variance of the centred values, then the
// affine map. In place when in_off == out_off (each thread writes only what it read).

struct Params {
    rows: u32,
    width: u32,
    groups: u32,
    in_off: u32,
    out_off: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;

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
    let n = p.width / p.groups;
    let g = wg.x;
    let row = wg.y;
    let src = p.in_off + row * p.width + g * n;
    let dst = p.out_off + row * p.width + g * n;
    var s = 0.0;
    for (var i = lid.x; i < n; i += THREADS) {
        s += act[src + i];
    }
    let mean = sum_all(s, lid.x) / f32(n);
    var q = 0.0;
    for (var i = lid.x; i < n; i += THREADS) {
        let d = act[src + i] - mean;
        q += d * d;
    }
    let inv = 1.0 / sqrt(sum_all(q, lid.x) / f32(n) + p.eps);
    for (var i = lid.x; i < n; i += THREADS) {
        let c = g * n + i;
        act[dst + i] = (act[src + i] - mean) * inv * weight[c] + bias[c];
    }
}
