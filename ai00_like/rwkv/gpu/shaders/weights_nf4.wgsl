// NF4 weights for matmul.wgsl (prepended to it), rwkv-spec §6: eight 4-bit level indices per
// u32, low nibble first; per block of 64 weights absmax as f16 (two per u32 of `scales`);
// ŵ = level[q]·absmax.
@group(0) @binding(2) var<storage, read> weight: array<u32>;
@group(0) @binding(4) var<storage, read> scales: array<u32>;

const NF4_LEVELS = array<f32, 16>(
    -1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0.0,
    0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0);

// The levels as a table in workgroup memory: indexing a function-local copy of the constant
// array with a runtime index spills it to memory per invocation on many drivers.
var<workgroup> nf4_table: array<f32, 16>;

// called by every invocation at the start of a matmul.wgsl kernel, before a barrier
fn setup_weights(t: u32) {
    if (t < 16u) {
        nf4_table[t] = NF4_LEVELS[t];
    }
}

fn absmax_of(block: u32) -> f32 {
    return unpack2x16float(scales[block >> 1u])[block & 1u];
}

fn weight_at(i: u32) -> f32 {
    let q = (weight[i >> 3u] >> (4u * (i & 7u))) & 15u;
    return nf4_table[q] * absmax_of(i >> 6u);
}

// weights 8j … 8j+7: one word, one block
fn weight8(j: u32) -> mat2x4<f32> {
    let word = weight[j];
    let lo = vec4<f32>(nf4_table[word & 15u], nf4_table[(word >> 4u) & 15u], nf4_table[(word >> 8u) & 15u],
                       nf4_table[(word >> 12u) & 15u]);
    let hi = vec4<f32>(nf4_table[(word >> 16u) & 15u], nf4_table[(word >> 20u) & 15u],
                       nf4_table[(word >> 24u) & 15u], nf4_table[word >> 28u]);
    return mat2x4<f32>(lo, hi) * absmax_of(j >> 3u);
}
