// The RWKV-4 recurrence per channel over each segment (rwkv-spec §2.2), with the running
// maximum exponent pp keeping the sums finite. State per layer (aa, bb, pp) × width,
// slot-first. One thread per (channel, segment); the output is r ⊙ wkv with r = σ(·)
// already in the r region.

struct Params {
    width: u32,
    seg_base: u32,
    r_off: u32,
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
@group(0) @binding(4) var<storage, read> vecs: array<f32>; // log decay w (< 0), bonus u (each width)

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.width) {
        return;
    }
    let seg = p.seg_base + 3u * gid.y;
    let base = p.state_off + plan[seg] * p.slot_stride + c;
    var aa = state[base];
    var bb = state[base + p.width];
    var pp = state[base + 2u * p.width];
    let w = vecs[c];
    let u = vecs[p.width + c];
    for (var t = 0u; t < plan[seg + 2u]; t++) {
        let e = (plan[seg + 1u] + t) * p.width + c;
        let k = act[p.k_off + e];
        let v = act[p.v_off + e];
        var q = max(pp, u + k);
        var e1 = exp(pp - q);
        var e2 = exp(u + k - q);
        act[p.y_off + e] = act[p.r_off + e] * (e1 * aa + e2 * v) / (e1 * bb + e2);
        let decayed = pp + w;
        q = max(decayed, k);
        e1 = exp(decayed - q);
        e2 = exp(k - q);
        aa = e1 * aa + e2 * v;
        bb = e1 * bb + e2;
        pp = q;
    }
    state[base] = aa;
    state[base + p.width] = bb;
    state[base + 2u * p.width] = pp;
}
