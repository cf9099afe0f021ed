// Token-shift mixing, v6/v7 form: out_q = z + (prev − z) ⊙ μ_q for `count` coefficient rows μ,
// each output into its own region of the activation buffer (out_off + q·out_stride).

struct Params {
    width: u32,
    z_off: u32,
    prev_off: u32,
    out_off: u32,
    out_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> mu: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let row = gid.y;
    let q = gid.z;
    if (c >= p.width) {
        return;
    }
    let e = row * p.width + c;
    let z = act[p.z_off + e];
    act[p.out_off + q * p.out_stride + e] = z + (act[p.prev_off + e] - z) * mu[q * p.width + c];
}

// v6's data-dependent mix, in place over the LoRA's output d_q already in region q:
// out_q = z + (prev − z) ⊙ (μ_q + d_q).
@compute @workgroup_size(64)
fn dynamic(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let row = gid.y;
    let q = gid.z;
    if (c >= p.width) {
        return;
    }
    let e = row * p.width + c;
    let z = act[p.z_off + e];
    let o = p.out_off + q * p.out_stride + e;
    act[o] = z + (act[p.prev_off + e] - z) * (mu[q * p.width + c] + act[o]);
}
