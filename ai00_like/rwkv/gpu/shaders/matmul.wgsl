// out[row, m] = act(Σ_k x[row, k] · W[m, k]) (+ out[row, m] when accumulating).
// W is [M, K] row-major as in the checkpoints ([out, in]), x and out are rows of the
// activation buffer at element offsets. `matmul_tiled` is the 16×16-tile matrix–matrix
// kernel for many rows; `matvec` computes 4 outputs of one row per workgroup (decoding).

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
// binding 2 (the weights) and weight_at(i) come from weights_f32.wgsl or weights_f16.wgsl
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

const TILE: u32 = 16u;
var<workgroup> xs: array<array<f32, 16>, 16>;
var<workgroup> ws: array<array<f32, 16>, 16>;

@compute @workgroup_size(16, 16)
fn matmul_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.y * TILE + lid.y;   // the output row this thread computes
    let col = wg.x * TILE + lid.x;   // and its column
    let w_row = wg.x * TILE + lid.y; // the weight row this thread stages
    var acc = 0.0;
    for (var k0 = 0u; k0 < p.k; k0 += TILE) {
        let k = k0 + lid.x;
        var xv = 0.0;
        if (row < p.rows && k < p.k) {
            xv = src[p.x_off + row * p.x_stride + k];
        }
        var wv = 0.0;
        if (w_row < p.m && k < p.k) {
            wv = weight_at(p.w_off + w_row * p.k + k);
        }
        xs[lid.y][lid.x] = xv;
        ws[lid.y][lid.x] = wv;
        workgroupBarrier();
        for (var i = 0u; i < TILE; i++) {
            acc += xs[lid.y][i] * ws[lid.x][i];
        }
        workgroupBarrier();
    }
    if (row < p.rows && col < p.m) {
        store(row, col, acc);
    }
}

const THREADS: u32 = 64u;
var<workgroup> partial: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.y;
    let m0 = wg.x * 4u;
    // rows past the end repeat the last one and are not stored
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
    partial[lid.x] = acc;
    workgroupBarrier();
    for (var s = THREADS / 2u; s > 0u; s >>= 1u) {
        if (lid.x < s) {
            partial[lid.x] += partial[lid.x + s];
        }
        workgroupBarrier();
    }
    if (lid.x < 4u && m0 + lid.x < p.m) {
        store(row, m0 + lid.x, partial[0][lid.x]);
    }
}
