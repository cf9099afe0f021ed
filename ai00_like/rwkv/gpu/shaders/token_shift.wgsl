// The token shift over the stacked rows of a batch step (rwkv-spec §4.2).
// `plan` holds per row (slot, is-first-of-segment) and, from seg_base, per segment
// (slot, first row, row count). `shift`: prev = the row above, or the slot's saved row for
// a segment's first row. `save`: each slot keeps its segment's last row for the next step.

struct Params {
    width: u32,
    seg_base: u32,
    src_off: u32,     // the rows shifted (z)
    dst_off: u32,     // where the shifted rows go (prev)
    state_off: u32,   // this layer's row within a slot's shift state
    slot_stride: u32, // floats per slot in the shift state
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read> plan: array<u32>;

@compute @workgroup_size(64)
fn shift(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let row = gid.y;
    if (c >= p.width) {
        return;
    }
    let slot = plan[2u * row];
    let first = plan[2u * row + 1u];
    var v: f32;
    if (first == 1u) {
        v = state[p.state_off + slot * p.slot_stride + c];
    } else {
        v = act[p.src_off + (row - 1u) * p.width + c];
    }
    act[p.dst_off + row * p.width + c] = v;
}

@compute @workgroup_size(64)
fn save(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let seg = p.seg_base + 3u * gid.y;
    if (c >= p.width) {
        return;
    }
    let last = plan[seg + 1u] + plan[seg + 2u] - 1u;
    state[p.state_off + plan[seg] * p.slot_stride + c] = act[p.src_off + last * p.width + c];
}
