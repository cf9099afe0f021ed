// fp32 weights for matmul.wgsl (prepended to it), read 4 at a time (the buffer is padded to 16 bytes).
@group(0) @binding(2) var<storage, read> weight: array<vec4<f32>>;

fn weight_at(i: u32) -> f32 {
    return weight[i >> 2u][i & 3u];
}

// weights 8j … 8j+7 as two vec4
fn weight8(j: u32) -> mat2x4<f32> {
    return mat2x4<f32>(weight[2u * j], weight[2u * j + 1u]);
}

// called by every invocation at the start of a matmul.wgsl kernel, before a barrier
fn setup_weights(t: u32) {}
