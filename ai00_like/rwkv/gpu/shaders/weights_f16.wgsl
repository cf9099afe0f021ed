// fp16 weights for matmul.wgsl (prepended to it): packed f16 pairs, eight per 16-byte load
// (the buffer is padded to 16 bytes), unpacked to f32 (rwkv-spec §7.2: no shader-f16
// feature needed; arithmetic stays f32).
@group(0) @binding(2) var<storage, read> weight: array<vec4<u32>>;

fn weight_at(i: u32) -> f32 {
    let pair = unpack2x16float(weight[i >> 3u][(i >> 1u) & 3u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

// weights 8j … 8j+7 as two vec4: one 16-byte load
fn weight8(j: u32) -> mat2x4<f32> {
    let w = weight[j];
    return mat2x4<f32>(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
                       vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));
}
