// fp16 weights for matmul.wgsl (prepended to it): packed f16 pairs, eight per 16-byte load
// (the buffer is padded to 16 bytes), widened to f32 (rwkv-spec §7.2: no shader-f16 feature
// needed; arithmetic stays f32).
@group(0) @binding(2) var<storage, read> weight: array<vec4<u32>>;

// f16 bit patterns in the HIGH 16 bits of each u32 to f32, with three vector ops: an
// arithmetic shift by 3 puts the exponent and mantissa where f32 has them (keeping the sign
// in bit 31), a mask drops the low half and the sign's copies, and multiplying by 2^112
// moves the exponent bias from 15 to 127 (exact for zeros and subnormals too). GPUs have
// unpack2x16float for this, but software drivers emulate it slowly (lavapipe: 8× slower).
// Weights hold no infinities or NaNs.
fn widen_high(w: vec4<u32>) -> vec4<f32> {
    let bits = bitcast<vec4<u32>>(bitcast<vec4<i32>>(w) >> vec4<u32>(3u)) & vec4<u32>(0x8fffe000u);
    return bitcast<vec4<f32>>(bits) * 5.192296858534828e33;
}

fn weight_at(i: u32) -> f32 {
    let word = weight[i >> 3u][(i >> 1u) & 3u];
    return widen_high(vec4<u32>(select(word << 16u, word, (i & 1u) == 1u))).x;
}

// weights 8j … 8j+7 as two vec4: one 16-byte load
fn weight8(j: u32) -> mat2x4<f32> {
    let w = weight[j];
    let even = widen_high(w << vec4<u32>(16u));
    let odd = widen_high(w);
    return mat2x4<f32>(vec4<f32>(even.x, odd.x, even.y, odd.y), vec4<f32>(even.z, odd.z, even.w, odd.w));
}

// called by every invocation at the start of a matmul.wgsl kernel, before a barrier
fn setup_weights(t: u32) {}
