// out[row, m] = act(Σ_k x[row, k] · W[m, k]) (+ out[row, m] when accumulating).
// W is [M, K] row-major as in the checkpoints ([out, in]), x and out are rows of the
// activation buffer at element offsets. `matmul_tiled` is the matrix–matrix kernel for
// many rows: 16×16 threads, each computing TM × TN outputs (constants prepended by the host,
// so the bench can compare tile shapes); `matvec8` computes 4 outputs of one row per
// workgroup (decoding) reading 8 weights per load, `matvec` the same for K not a multiple of 8.

struct Params {
    rows: u32,
    m: u32,
    k: u32,
    x_off: u32,
    x_stride: u32,    // floats from one row of x to the next (k unless x is a slice)
    w_off: u32,
    out_off: u32,
    out_stride: u32,  // floats from one output row to the next (m unless W is a slice of rows)
    act: u32,         // 0 none, 1 tanh, 2 sigmoid, 3 squared relu, 4 silu
    accumulate: u32,  // 1: add to what is in out (the residual stream)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
// binding 2 (the weights), weight_at(i) and weight8(j) come from weights_<format>.wgsl
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

fn activate(v: f32) -> f32 {
    switch p.act {
        case 1u: { return tanh(v); }
        case 2u: { return 1.0 / (1.0 + exp(-v)); }
        case 3u: { let r = max(v, 0.0); return r * r; }
        case 4u: { return v / (1.0 + exp(-v)); }
        default: { return v; }
    }
}

fn store(row: u32, col: u32, acc: f32) {
    let o = p.out_off + row * p.out_stride + col;
    var v = activate(acc);
    if (p.accumulate == 1u) {
        v += dst[o];
    }
    dst[o] = v;
}

const TK: u32 = 16u;  // the K extent of a staged tile
var<workgroup> xs: array<array<f32, 16>, 16u * TM>;
// A weight row padded to 17: the products read column kk of 16 rows at once (lid.x), which
// at a stride of 16 words fell into two of the 32 banks (an 8-way conflict on an NVIDIA H200).
var<workgroup> ws: array<array<f32, 17>, 16u * TN>;

@compute @workgroup_size(16, 16)
fn matmul_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    // This thread's outputs: rows row0 + lid.y + 16i, columns col0 + lid.x + 16j.
    let row0 = wg.y * 16u * TM;
    let col0 = wg.x * 16u * TN;
    setup_weights(lid.y * 16u + lid.x);
    workgroupBarrier();
    var acc: array<array<f32, TN>, TM>;
    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        let k = k0 + lid.x;
        for (var i = 0u; i < TM; i++) {
            let r = row0 + lid.y + 16u * i;
            var v = 0.0;
            if (r < p.rows && k < p.k) {
                v = src[p.x_off + r * p.x_stride + k];
            }
            xs[lid.y + 16u * i][lid.x] = v;
        }
        if (p.k % 8u == 0u && p.w_off == 0u) {
            // 8 weights per load: thread t stages half t % 2 of the tile's row t / 2
            let t = lid.y * 16u + lid.x;
            for (var r = t / 2u; r < 16u * TN; r += 128u) {
                let m = col0 + r;
                let kh = k0 + 8u * (t % 2u);
                var w = mat2x4<f32>();
                if (m < p.m && kh < p.k) {
                    w = weight8((m * p.k + kh) / 8u);
                }
                for (var e = 0u; e < 4u; e++) {
                    ws[r][8u * (t % 2u) + e] = w[0][e];
                    ws[r][8u * (t % 2u) + 4u + e] = w[1][e];
                }
            }
        } else {
            for (var j = 0u; j < TN; j++) {
                let m = col0 + lid.y + 16u * j;
                var v = 0.0;
                if (m < p.m && k < p.k) {
                    v = weight_at(p.w_off + m * p.k + k);
                }
                ws[lid.y + 16u * j][lid.x] = v;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var b: array<f32, TN>;
            for (var j = 0u; j < TN; j++) {
                b[j] = ws[lid.x + 16u * j][kk];
            }
            for (var i = 0u; i < TM; i++) {
                let a = xs[lid.y + 16u * i][kk];
                for (var j = 0u; j < TN; j++) {
                    acc[i][j] = fma(a, b[j], acc[i][j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < TM; i++) {
        for (var j = 0u; j < TN; j++) {
            let r = row0 + lid.y + 16u * i;
            let c = col0 + lid.x + 16u * j;
            if (r < p.rows && c < p.m) {
                store(r, c, acc[i][j]);
            }
        }
    }
}

const THREADS: u32 = 64u;
var<workgroup> partial: array<vec4<f32>, 64>;

fn reduce_and_store(row: u32, m0: u32, lid: u32, acc: vec4<f32>) {
    reduce_and_store_if(row, m0, lid, acc, true);
}

// (every invocation calls this, `valid` or not: it has barriers)
fn reduce_and_store_if(row: u32, m0: u32, lid: u32, acc: vec4<f32>, valid: bool) {
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = THREADS / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    if (valid && lid < 4u && m0 + lid < p.m) {
        store(row, m0 + lid, partial[0][lid]);
    }
    workgroupBarrier();  // partial is reused by the next call
}

// The 8-weight groups of 4 rows of W from m0 at column group j (rows past the end repeat the
// last one and are not stored; K is a multiple of 8 and w_off 0), and their products with x.
fn weights4(m0: u32, j: u32) -> array<mat2x4<f32>, 4> {
    let k8 = p.k / 8u;
    return array<mat2x4<f32>, 4>(weight8(m0 * k8 + j), weight8(min(m0 + 1u, p.m - 1u) * k8 + j),
                                 weight8(min(m0 + 2u, p.m - 1u) * k8 + j), weight8(min(m0 + 3u, p.m - 1u) * k8 + j));
}

fn dot4(w: array<mat2x4<f32>, 4>, x: mat2x4<f32>) -> vec4<f32> {
    return vec4<f32>(dot(w[0][0], x[0]) + dot(w[0][1], x[1]), dot(w[1][0], x[0]) + dot(w[1][1], x[1]),
                     dot(w[2][0], x[0]) + dot(w[2][1], x[1]), dot(w[3][0], x[0]) + dot(w[3][1], x[1]));
}

// x[row, 8j … 8j+7]
fn x8_scalars(row: u32, j: u32) -> mat2x4<f32> {
    let k = p.x_off + row * p.x_stride + 8u * j;
    return mat2x4<f32>(vec4<f32>(src[k], src[k + 1u], src[k + 2u], src[k + 3u]),
                       vec4<f32>(src[k + 4u], src[k + 5u], src[k + 6u], src[k + 7u]));
}

// this thread's share of 4 outputs of one row: consecutive threads read consecutive groups
fn matvec8_sum(row: u32, m0: u32, lid: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var j = lid; j < p.k / 8u; j += THREADS) {
        acc += dot4(weights4(m0, j), x8_scalars(row, j));
    }
    return acc;
}

@compute @workgroup_size(64)
fn matvec8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    setup_weights(lid.x);
    workgroupBarrier();
    reduce_and_store(wg.y, wg.x * 4u, lid.x, matvec8_sum(wg.y, wg.x * 4u, lid.x));
}

// 4 outputs of each of up to ROWS rows per workgroup (a small batch): the weights are read
// once for all the rows, not once per row. K is a multiple of 8 and w_off 0.
@compute @workgroup_size(64)
fn matvec8_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    setup_weights(lid.x);
    workgroupBarrier();
    let m0 = wg.x * 4u;
    let row0 = wg.y * ROWS;
    var acc: array<vec4<f32>, ROWS>;
    for (var j = lid.x; j < p.k / 8u; j += THREADS) {
        let w = weights4(m0, j);
        for (var r = 0u; r < ROWS; r++) {
            if (row0 + r < p.rows) {
                acc[r] += dot4(w, x8_scalars(row0 + r, j));
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        reduce_and_store_if(row0 + r, m0, lid.x, acc[r], row0 + r < p.rows);
    }
}

@compute @workgroup_size(64)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    setup_weights(lid.x);
    workgroupBarrier();
    let row = wg.y;
    let m0 = wg.x * 4u;
    let m1 = min(m0 + 1u, p.m - 1u);
    let m2 = min(m0 + 2u, p.m - 1u);
    let m3 = min(m0 + 3u, p.m - 1u);
    var acc = vec4<f32>(0.0);
    for (var k = lid.x; k < p.k; k += THREADS) {
        let xv = src[p.x_off + row * p.x_stride + k];
        let w = vec4<f32>(
            weight_at(p.w_off + m0 * p.k + k), weight_at(p.w_off + m1 * p.k + k),
            weight_at(p.w_off + m2 * p.k + k), weight_at(p.w_off + m3 * p.k + k));
        acc += w * xv;
    }
    reduce_and_store(row, m0, lid.x, acc);
}
