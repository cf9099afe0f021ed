// fp32 weights for matmul.wgsl (prepended to it).
@group(0) @binding(2) var<storage, read> weight: array<f32>;

fn weight_at(i: u32) -> f32 {
    return weight[i];
}
