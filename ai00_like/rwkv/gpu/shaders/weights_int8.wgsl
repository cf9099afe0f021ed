// Int8 weights for matmul.wgsl (prepended to it), rwkv-spec §6: four per u32; per block of
// 128 weights (min, max) as two f16 in one u32 of `scales`; ŵ = min + (max − min)·q/255.
@group(0) @binding(2) var<storage, read> weight: array<vec2<u32>>;  // 8 weights per load
@group(0) @binding(4) var<storage, read> scales: array<u32>;

fn weight_at(i: u32) -> f32 {
    let q = unpack4x8unorm(weight[i >> 3u][(i >> 2u) & 1u])[i & 3u];
    let bounds = unpack2x16float(scales[i >> 7u]);
    return fma(q, bounds.y - bounds.x, bounds.x);
}

// weights 8j … 8j+7 (one load, one block)
fn weight8(j: u32) -> mat2x4<f32> {
    let bounds = unpack2x16float(scales[j >> 4u]);
    let span = vec4<f32>(bounds.y - bounds.x);
    let low = vec4<f32>(bounds.x);
    let w = weight[j];
    return mat2x4<f32>(fma(unpack4x8unorm(w.x), span, low), fma(unpack4x8unorm(w.y), span, low));
}

// called by every invocation at the start of a matmul.wgsl kernel, before a barrier
fn setup_weights(t: u32) {}
