// fp16 weights for matmul.wgsl (prepended to it): packed f16 pairs, eight per 16-byte load
// (the buffer is padded to 16 bytes), widened to f32 (rwkv-spec §7.2: no shader-f16 feature
// needed; arithmetic stays f32).
@group(0) @binding(2) var<storage, read> weight: array<vec4<u32>>;

// f16 bit patterns (low 16 bits) to f32 with integer ops and one multiply: the exponent
// bias moves by 2^112, which also makes zeros and subnormals exact. unpack2x16float does
// the same on GPUs but is emulated slowly by software drivers (lavapipe: 8× slower).
// Weights hold no infinities or NaNs.
fn widen(h: vec4<u32>) -> vec4<f32> {
    let bits = ((h & vec4<u32>(0x7fffu)) << vec4<u32>(13u)) | ((h & vec4<u32>(0x8000u)) << vec4<u32>(16u));
    return bitcast<vec4<f32>>(bits) * 5.192296858534828e33;
}

fn weight_at(i: u32) -> f32 {
    let word = weight[i >> 3u][(i >> 1u) & 3u];
    return widen(vec4<u32>(select(word, word >> 16u, (i & 1u) == 1u) & 0xffffu)).x;
}

// weights 8j … 8j+7 as two vec4: one 16-byte load
fn weight8(j: u32) -> mat2x4<f32> {
    let w = weight[j];
    let even = widen(w & vec4<u32>(0xffffu));
    let odd = widen(w >> vec4<u32>(16u));
    return mat2x4<f32>(vec4<f32>(even.x, odd.x, even.y, odd.y), vec4<f32>(even.z, odd.z, even.w, odd.w));
}

// called by every invocation at the start of a matmul.wgsl kernel, before a barrier
fn setup_weights(t: u32) {}
