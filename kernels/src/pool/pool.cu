// CUDA twins of kernels/src/pool: max and average pooling (NHWC) and their
// gradients, with TF's SAME/VALID windows (the host computes out_h/out_w and
// the leading padding with `window::out_and_pad`, exactly as the CPU).
//
// Forward kernels: one thread per output element. Gradients gather: one
// thread per input element visits the windows that contain it in row-major
// (oy, ox) order, the order in which the CPU twin scatters, so each dx
// element is the same sum in the same order: results match bit for bit.
// No atomics.

struct PoolGeom {
    int n, h, w, c;
    int kh, kw, stride_h, stride_w;
    int out_h, out_w, pad_top, pad_left;
};

// Window [lo, hi) of output coordinate o along one axis, clipped to [0, in).
__device__ __forceinline__ void window(int o, int stride, int pad, int k, int in, int* lo, int* hi) {
    int start = o * stride - pad;
    int l = start > 0 ? start : 0;
    int e = start + k;
    int h = e < in ? e : in;
    *lo = l;
    *hi = h > l ? h : l;
}

// Range of output coordinates whose window contains input coordinate i.
__device__ __forceinline__ void covering(int i, int stride, int pad, int k, int out, int* lo, int* hi) {
    // o*stride - pad <= i  and  i < o*stride - pad + k
    int a = i + pad - k + 1; // o*stride >= a
    int l = a <= 0 ? 0 : (a + stride - 1) / stride;
    int h = (i + pad) / stride + 1; // o*stride <= i + pad
    *lo = l;
    *hi = h < out ? h : out;
}

// x: [n, h, w, c] -> y: [n, out_h, out_w, c]; padded cells are never candidates.
extern "C" __global__ void towers_max_pool_f32(PoolGeom g, const float* __restrict__ x, float* __restrict__ y) {
    i64 total = (i64)g.n * g.out_h * g.out_w * g.c;
    GRID_STRIDE(i, total) {
        int ch = (int)(i % g.c);
        i64 r = i / g.c;
        int ox = (int)(r % g.out_w);
        r /= g.out_w;
        int oy = (int)(r % g.out_h);
        int b = (int)(r / g.out_h);
        int ylo, yhi, xlo, xhi;
        window(oy, g.stride_h, g.pad_top, g.kh, g.h, &ylo, &yhi);
        window(ox, g.stride_w, g.pad_left, g.kw, g.w, &xlo, &xhi);
        float m = -__int_as_float(0x7f800000);
        for (int iy = ylo; iy < yhi; ++iy) {
            for (int ix = xlo; ix < xhi; ++ix) {
                float v = x[(((i64)b * g.h + iy) * g.w + ix) * g.c + ch];
                m = v > m ? v : m;
            }
        }
        y[i] = m;
    }
}

// Average over the non-padded cells of each window (TF's SAME avg_pool).
extern "C" __global__ void towers_avg_pool_f32(PoolGeom g, const float* __restrict__ x, float* __restrict__ y) {
    i64 total = (i64)g.n * g.out_h * g.out_w * g.c;
    GRID_STRIDE(i, total) {
        int ch = (int)(i % g.c);
        i64 r = i / g.c;
        int ox = (int)(r % g.out_w);
        r /= g.out_w;
        int oy = (int)(r % g.out_h);
        int b = (int)(r / g.out_h);
        int ylo, yhi, xlo, xhi;
        window(oy, g.stride_h, g.pad_top, g.kh, g.h, &ylo, &yhi);
        window(ox, g.stride_w, g.pad_left, g.kw, g.w, &xlo, &xhi);
        float s = 0.0f;
        for (int iy = ylo; iy < yhi; ++iy) {
            for (int ix = xlo; ix < xhi; ++ix) {
                s += x[(((i64)b * g.h + iy) * g.w + ix) * g.c + ch];
            }
        }
        int count = (yhi - ylo) * (xhi - xlo);
        float inv = 1.0f / (float)(count > 1 ? count : 1);
        y[i] = s * inv;
    }
}

// dx: each dy goes to the first input cell (row-major window order) equal to
// the window's forward output y (ties: first), as TF's CPU kernel.
extern "C" __global__ void towers_max_pool_grad_f32(PoolGeom g, const float* __restrict__ x, const float* __restrict__ y,
                                                    const float* __restrict__ dy, float* __restrict__ dx) {
    i64 total = (i64)g.n * g.h * g.w * g.c;
    GRID_STRIDE(i, total) {
        int ch = (int)(i % g.c);
        i64 r = i / g.c;
        int ix = (int)(r % g.w);
        r /= g.w;
        int iy = (int)(r % g.h);
        int b = (int)(r / g.h);
        float xv = x[i];
        int oylo, oyhi, oxlo, oxhi;
        covering(iy, g.stride_h, g.pad_top, g.kh, g.out_h, &oylo, &oyhi);
        covering(ix, g.stride_w, g.pad_left, g.kw, g.out_w, &oxlo, &oxhi);
        float acc = 0.0f;
        for (int oy = oylo; oy < oyhi; ++oy) {
            int ylo, yhi;
            window(oy, g.stride_h, g.pad_top, g.kh, g.h, &ylo, &yhi);
            for (int ox = oxlo; ox < oxhi; ++ox) {
                int xlo, xhi;
                window(ox, g.stride_w, g.pad_left, g.kw, g.w, &xlo, &xhi);
                i64 o = ((((i64)b * g.out_h + oy) * g.out_w + ox)) * g.c + ch;
                float ym = y[o];
                bool hit = xv == ym;
                // Routed here only if no earlier cell of the window matched.
                for (int wy = ylo; hit && wy <= iy; ++wy) {
                    int wxe = wy < iy ? xhi : ix;
                    for (int wx = xlo; wx < wxe; ++wx) {
                        if (x[(((i64)b * g.h + wy) * g.w + wx) * g.c + ch] == ym) {
                            hit = false;
                            break;
                        }
                    }
                }
                acc += hit ? dy[o] : 0.0f;
            }
        }
        dx[i] = acc;
    }
}

// dx: each dy spread evenly (dy / count) over its window's non-padded cells.
extern "C" __global__ void towers_avg_pool_grad_f32(PoolGeom g, const float* __restrict__ dy, float* __restrict__ dx) {
    i64 total = (i64)g.n * g.h * g.w * g.c;
    GRID_STRIDE(i, total) {
        int ch = (int)(i % g.c);
        i64 r = i / g.c;
        int ix = (int)(r % g.w);
        r /= g.w;
        int iy = (int)(r % g.h);
        int b = (int)(r / g.h);
        int oylo, oyhi, oxlo, oxhi;
        covering(iy, g.stride_h, g.pad_top, g.kh, g.out_h, &oylo, &oyhi);
        covering(ix, g.stride_w, g.pad_left, g.kw, g.out_w, &oxlo, &oxhi);
        float acc = 0.0f;
        for (int oy = oylo; oy < oyhi; ++oy) {
            int ylo, yhi;
            window(oy, g.stride_h, g.pad_top, g.kh, g.h, &ylo, &yhi);
            for (int ox = oxlo; ox < oxhi; ++ox) {
                int xlo, xhi;
                window(ox, g.stride_w, g.pad_left, g.kw, g.w, &xlo, &xhi);
                int count = (yhi - ylo) * (xhi - xlo);
                float inv = 1.0f / (float)(count > 1 ? count : 1);
                acc = __fadd_rn(acc, __fmul_rn(dy[((((i64)b * g.out_h + oy) * g.out_w + ox)) * g.c + ch], inv));
            }
        }
        dx[i] = acc;
    }
}
