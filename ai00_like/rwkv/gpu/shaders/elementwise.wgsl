// dst = a ⊙ b (+ dst when accumulating), over `rows` rows of `width` values.

struct Params {
    width: u32,
    a_off: u32,
    b_off: u32,
    dst_off: u32,
    accumulate: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;

@compute @workgroup_size(64)
fn mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.width) {
        return;
    }
    let e = gid.y * p.width + c;
    var v = act[p.a_off + e] * act[p.b_off + e];
    if (p.accumulate == 1u) {
        v += act[p.dst_off + e];
    }
    act[p.dst_off + e] = v;
}
