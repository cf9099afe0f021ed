// The matrix–matrix kernel for a prefill (appended to matmul.wgsl, whose Params, x8_scalars and
// store it uses). A workgroup of 16 × WG_Y threads computes RT·WG_Y rows × 64 outputs; each
// thread RT (4 or 8) consecutive rows × 4 consecutive outputs, held in vec4 registers. Per BK
// steps along K, the block's x and W are staged in workgroup memory k-major, so 4 of a thread's
// rows (or its 4 outputs) at one k are one vec4 load: 2 loads feed 16 multiply-adds (3 feed 32
// with RT 8), where matmul_tiled needs 5 loads for 4, which held it near 1% of an NVIDIA
// H200's fp32 rate.
// K must be a multiple of 8 (weight8 reads 8 weights of one row) and w_off 0; BK (the steps
// of K staged at a time) a multiple of 8.

const BLOCK_ROWS: u32 = RT * WG_Y;
const QUADS: u32 = BLOCK_ROWS / 4u;  // x_block's vec4s per k
const THREADS_BLOCKED: u32 = 16u * WG_Y;
var<workgroup> x_block: array<vec4<f32>, BK * QUADS>;  // [k][row / 4]
var<workgroup> w_block: array<vec4<f32>, BK * 16u>;   // [k][output / 4]

// Stage 8 values at k = 8·chunk … of block lane `lane` (a row or an output): consecutive
// threads take consecutive lanes, so their writes fall in distinct banks.
fn stage_x(lane: u32, chunk: u32, v: mat2x4<f32>) {
    for (var e = 0u; e < 8u; e++) {
        x_block[(8u * chunk + e) * QUADS + lane / 4u][lane % 4u] = v[e / 4u][e % 4u];
    }
}

fn stage_w(lane: u32, chunk: u32, v: mat2x4<f32>) {
    for (var e = 0u; e < 8u; e++) {
        w_block[(8u * chunk + e) * 16u + lane / 4u][lane % 4u] = v[e / 4u][e % 4u];
    }
}

@compute @workgroup_size(16, WG_Y)
fn matmul_blocked(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = lid.y * 16u + lid.x;
    setup_weights(t);
    workgroupBarrier();
    let row0 = wg.y * BLOCK_ROWS;
    let col0 = wg.x * 64u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);  // rows 4 … 7 of the thread's, with RT 8
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var u = t; u < (BK / 8u) * BLOCK_ROWS; u += THREADS_BLOCKED) {
            let r = row0 + u % BLOCK_ROWS;
            let k = k0 + 8u * (u / BLOCK_ROWS);
            var v = mat2x4<f32>();
            if (r < p.rows && k < p.k) {
                v = x8_scalars(r, k / 8u);
            }
            stage_x(u % BLOCK_ROWS, u / BLOCK_ROWS, v);
        }
        for (var u = t; u < (BK / 8u) * 64u; u += THREADS_BLOCKED) {
            let m = col0 + u % 64u;
            let k = k0 + 8u * (u / 64u);
            var v = mat2x4<f32>();
            if (m < p.m && k < p.k) {
                v = weight8((m * p.k + k) / 8u);
            }
            stage_w(u % 64u, u / 64u, v);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let a = x_block[kk * QUADS + (RT / 4u) * lid.y];
            let b = w_block[kk * 16u + lid.x];
            acc0 = fma(vec4<f32>(a.x), b, acc0);
            acc1 = fma(vec4<f32>(a.y), b, acc1);
            acc2 = fma(vec4<f32>(a.z), b, acc2);
            acc3 = fma(vec4<f32>(a.w), b, acc3);
            if (RT == 8u) {
                let a2 = x_block[kk * QUADS + 2u * lid.y + 1u];
                acc4 = fma(vec4<f32>(a2.x), b, acc4);
                acc5 = fma(vec4<f32>(a2.y), b, acc5);
                acc6 = fma(vec4<f32>(a2.z), b, acc6);
                acc7 = fma(vec4<f32>(a2.w), b, acc7);
            }
        }
        workgroupBarrier();
    }
    store4(row0 + RT * lid.y, col0 + 4u * lid.x, mat4x4<f32>(acc0, acc1, acc2, acc3));
    if (RT == 8u) {
        store4(row0 + RT * lid.y + 4u, col0 + 4u * lid.x, mat4x4<f32>(acc4, acc5, acc6, acc7));
    }
}

// outputs c0 … c0+3 of rows r0 … r0+3 (those inside the matrix)
fn store4(r0: u32, c0: u32, acc: mat4x4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            if (r0 + i < p.rows && c0 + j < p.m) {
                store(r0 + i, c0 + j, acc[i][j]);
            }
        }
    }
}
