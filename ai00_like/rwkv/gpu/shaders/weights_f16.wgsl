// fp16 weights for matmul.wgsl (prepended to it): two halves per u32, unpacked to f32
// (rwkv-spec §7.2: no shader-f16 feature needed; arithmetic stays f32).
@group(0) @binding(2) var<storage, read> weight: array<u32>;

fn weight_at(i: u32) -> f32 {
    let pair = unpack2x16float(weight[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}
