// CUDA twins of the data movement in kernels/src/conv/cpu.rs: im2col and
// col2im for the GEMM-based convolution (the GEMMs themselves go to cuBLAS).
// Layouts as the CPU: x [n, h, w, c_in] (NHWC), filter [kh, kw, c_in, c_out]
// read as [K, c_out] with K = kh * kw * c_in and column index
// (ky * kw + kx) * c_in + ci; the column matrix has one row per output pixel
// (b, oy, ox) in row-major order.
//
// Chunking as the CPU (the plan's workspace holds `chunk_rows` rows): a
// launch covers rows [r0, r0 + r). Per chunk:
// - Conv2D: im2col(r0, r) -> col; y[r0..r0+r] = col * W (GEMM);
// - Conv2DBackpropInput: dcol = dy[r0..r0+r] * W^T (GEMM); col2im(r0, r, dcol)
//   adds into dx (the first chunk with `accumulate` = 0 overwrites);
// - Conv2DBackpropFilter: im2col(r0, r) -> col; dW (+)= col^T * dy[r0..r0+r].
// A 1x1 stride-1 convolution is a plain GEMM (no workspace, no launch here).
//
// Conv2DBiasAct: the forward chunks, then one epilogue launch over the whole
// output, y = act(y + bias) in place (the elementwise family's
// towers_bias_act_in_place_f32).
//
// col2im gathers: one thread per dx element adds the column entries of the
// chunk's rows that read it, in row order (the CPU's scatter order), onto the
// previous value: equal to the CPU bit for bit given the same dcol.

struct ConvGeom {
    int n, h, w, c_in;
    int kh, kw, c_out, stride_h;
    int stride_w, out_h, out_w, pad_top;
    int pad_left;
};

// col[i, k] for i < r (pixel row r0 + i), k < K: the input under filter tap k, 0 in padding.
extern "C" __global__ void towers_im2col_f32(ConvGeom g, i64 r0, i64 r, const float* __restrict__ x,
                                             float* __restrict__ col) {
    i64 kk = (i64)g.kh * g.kw * g.c_in;
    GRID_STRIDE(t, r * kk) {
        i64 row = r0 + t / kk;
        int k = (int)(t % kk);
        int ci = k % g.c_in;
        int kx = (k / g.c_in) % g.kw;
        int ky = k / (g.c_in * g.kw);
        int ox = (int)(row % g.out_w);
        i64 q = row / g.out_w;
        int oy = (int)(q % g.out_h);
        i64 b = q / g.out_h;
        int iy = oy * g.stride_h - g.pad_top + ky;
        int ix = ox * g.stride_w - g.pad_left + kx;
        bool in = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
        col[t] = in ? x[((b * g.h + iy) * g.w + ix) * g.c_in + ci] : 0.0f;
    }
}

// dx[b, iy, ix, ci] = (accumulate ? dx : 0) + sum over rows in [r0, r0 + r)
// whose window covers (iy, ix), in row order, of dcol[row - r0, tap].
extern "C" __global__ void towers_col2im_f32(ConvGeom g, i64 r0, i64 r, int accumulate, const float* __restrict__ dcol,
                                             float* __restrict__ dx) {
    i64 kk = (i64)g.kh * g.kw * g.c_in;
    i64 total = (i64)g.n * g.h * g.w * g.c_in;
    i64 pix = (i64)g.out_h * g.out_w;
    GRID_STRIDE(i, total) {
        int ci = (int)(i % g.c_in);
        i64 q = i / g.c_in;
        int ix = (int)(q % g.w);
        q /= g.w;
        int iy = (int)(q % g.h);
        i64 b = q / g.h;
        // Output rows whose window holds iy: oy*sh - pt <= iy < oy*sh - pt + kh.
        int ay = iy + g.pad_top - g.kh + 1;
        int oylo = ay <= 0 ? 0 : (ay + g.stride_h - 1) / g.stride_h;
        int oyhi = (iy + g.pad_top) / g.stride_h + 1;
        oyhi = oyhi < g.out_h ? oyhi : g.out_h;
        int ax = ix + g.pad_left - g.kw + 1;
        int oxlo = ax <= 0 ? 0 : (ax + g.stride_w - 1) / g.stride_w;
        int oxhi = (ix + g.pad_left) / g.stride_w + 1;
        oxhi = oxhi < g.out_w ? oxhi : g.out_w;
        float acc = accumulate ? dx[i] : 0.0f;
        for (int oy = oylo; oy < oyhi; ++oy) {
            int ky = iy - (oy * g.stride_h - g.pad_top);
            for (int ox = oxlo; ox < oxhi; ++ox) {
                i64 row = b * pix + (i64)oy * g.out_w + ox;
                if (row < r0 || row >= r0 + r) {
                    continue;
                }
                int kx = ix - (ox * g.stride_w - g.pad_left);
                acc += dcol[(row - r0) * kk + ((i64)ky * g.kw + kx) * g.c_in + ci];
            }
        }
        dx[i] = acc;
    }
}
