// Copies the rows listed in plan[list_base..] (the rows whose logits are wanted) together.

struct Params {
    width: u32,
    list_base: u32,
    src_off: u32,
    dst_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> plan: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let i = gid.y;
    if (c >= p.width) {
        return;
    }
    act[p.dst_off + i * p.width + c] = act[p.src_off + plan[p.list_base + i] * p.width + c];
}
