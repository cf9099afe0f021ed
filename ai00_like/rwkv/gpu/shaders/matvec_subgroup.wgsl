// The matrix–vector kernels where the adapter has the "subgroup" feature, appended to
// matmul.wgsl. Each subgroup computes whole outputs on its own — 8 rows of W at a time (4
// for a batch), its lanes striding over K (consecutive lanes read consecutive 16-byte groups
// of each row), one subgroupAdd per output vector — so there is no workgroup-memory
// reduction and no barrier after the start. A workgroup covers GROUP_ROWS outputs (a
// constant from the host: 8 or 4 per subgroup of the adapter's usual width, so every
// subgroup has rows; any width gives the right result). Software drivers run a workgroup's
// subgroups one after another and pay dearly for every barrier (lavapipe: matvec8's
// 7-barrier tree ran at a third of this kernel's speed). x is read as vec4 when the host's
// constant X4 is 1 (x_off and x_stride multiples of 4).
@group(0) @binding(5) var<storage, read_write> src4: array<vec4<f32>>;  // the buffer of src, as vec4

// x[row, 8j … 8j+7]
fn x8(row: u32, j: u32) -> mat2x4<f32> {
    if (X4 == 1u) {
        let k = (p.x_off + row * p.x_stride) / 4u + 2u * j;
        return mat2x4<f32>(src4[k], src4[k + 1u]);
    }
    return x8_scalars(row, j);
}

// the first of this subgroup's first `count` outputs, and the step to its next ones
fn subgroup_rows(wg: u32, lid: u32, width: u32, count: u32) -> vec2<u32> {
    return vec2<u32>(wg * GROUP_ROWS + count * (lid / width), count * max(1u, THREADS / width));
}

// 8 outputs at a time per subgroup: x is read once for 8 rows of W
@compute @workgroup_size(64)
fn matvec8_subgroup(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                    @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) width: u32) {
    setup_weights(lid.x);
    workgroupBarrier();
    let rows = subgroup_rows(wg.x, lid.x, width, 8u);
    for (var m0 = rows.x; m0 < min(wg.x * GROUP_ROWS + GROUP_ROWS, p.m); m0 += rows.y) {
        var acc = mat2x4<f32>();
        for (var j = lane; j < p.k / 8u; j += width) {
            let x = x8(wg.y, j);
            acc[0] += dot4(weights4(m0, j), x);
            acc[1] += dot4(weights4(min(m0 + 4u, p.m - 1u), j), x);
        }
        let sum = mat2x4<f32>(subgroupAdd(acc[0]), subgroupAdd(acc[1]));
        if (lane < 8u && m0 + lane < p.m) {
            store(wg.y, m0 + lane, sum[lane / 4u][lane % 4u]);
        }
    }
}

// matvec8_rows the same way: each subgroup 4 rows of W for up to ROWS rows of x (a small
// batch), the weights read once for all of them, one subgroupAdd per row of x.
@compute @workgroup_size(64)
fn matvec8_rows_subgroup(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                         @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) width: u32) {
    setup_weights(lid.x);
    workgroupBarrier();
    let row0 = wg.y * ROWS;
    let rows = subgroup_rows(wg.x, lid.x, width, 4u);
    for (var m0 = rows.x; m0 < min(wg.x * GROUP_ROWS + GROUP_ROWS, p.m); m0 += rows.y) {
        var acc: array<vec4<f32>, ROWS>;
        for (var j = lane; j < p.k / 8u; j += width) {
            let w = weights4(m0, j);
            for (var r = 0u; r < ROWS; r++) {
                if (row0 + r < p.rows) {
                    acc[r] += dot4(w, x8(row0 + r, j));
                }
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            let sum = subgroupAdd(acc[r]);
            if (row0 + r < p.rows && lane < 4u && m0 + lane < p.m) {
                store(row0 + r, m0 + lane, sum[lane]);
            }
        }
    }
}
