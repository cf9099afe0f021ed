// matvec8 with a subgroup reduction, appended to matmul.wgsl when the adapter has the
// "subgroup" feature: one subgroupAdd, then the subgroups' sums through workgroup memory
// (assumes subgroups are consecutive invocation ids, as on every Vulkan/Metal/D3D12 driver).
var<workgroup> subgroup_sums: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn matvec8_subgroup(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                    @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) width: u32) {
    setup_weights(lid.x);
    workgroupBarrier();
    let sum = subgroupAdd(matvec8_sum(wg.y, wg.x * 4u, lid.x));
    if (lane == 0u) {
        subgroup_sums[lid.x / width] = sum;
    }
    workgroupBarrier();
    let m = wg.x * 4u + lid.x;
    if (lid.x < 4u && m < p.m) {
        var total = 0.0;
        for (var i = 0u; i < max(1u, THREADS / width); i++) {
            total += subgroup_sums[i][lid.x];
        }
        store(wg.y, m, total);
    }
}
