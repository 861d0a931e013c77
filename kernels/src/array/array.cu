// CUDA twins of kernels/src/array: one_hot, transpose, pad, gather,
// gather_grad, tile, tile_grad.
//
// Shapes are padded to rank 4 (leading 1s) and passed as Dims4 by value.
// Every kernel is a grid-stride loop over its output, one thread per output
// element, so no two threads write one element and nothing uses atomics.
// The copies match the CPU bit for bit; the gradients sum each element's
// contributions in the CPU's order (increasing position in dy) with
// __fadd_rn from 0, so they match bit for bit too.
//
// Out-of-range indices: the CPU fails with "indices[j] = k is not in
// [0, limit)"; here (no error channel from a kernel) gather writes 0 for
// such an index, as TF's GPU kernel does, and gather_grad drops its row.

struct Dims4 {
    i64 d[4];
};

// out[r, d] = d == idx[r] ? on : off for r < n / depth, d < depth.
extern "C" __global__ void towers_one_hot_f32(i64 n, i64 depth, float on, float off, const int* __restrict__ idx,
                                              float* __restrict__ out) {
    GRID_STRIDE(i, n) {
        i64 r = i / depth, d = i % depth;
        out[i] = (i64)idx[r] == d ? on : off;
    }
}

// y (dims od) = x read at sum_k c_k * src.d[k]: src holds, for each output
// axis k, the input stride of axis perm[k].
extern "C" __global__ void towers_transpose_f32(i64 n, const float* __restrict__ x, float* __restrict__ y, Dims4 od,
                                                Dims4 src) {
    GRID_STRIDE(i, n) {
        i64 rem = i, at = 0;
        for (int k = 3; k >= 0; --k) {
            at += (rem % od.d[k]) * src.d[k];
            rem /= od.d[k];
        }
        y[i] = x[at];
    }
}

// y (dims od) = x at (c - before) where that is inside `shape`, else value.
extern "C" __global__ void towers_pad_f32(i64 n, const float* __restrict__ x, float* __restrict__ y, Dims4 od,
                                          Dims4 before, Dims4 shape, float value) {
    GRID_STRIDE(i, n) {
        i64 rem = i, at = 0, stride = 1;
        bool inside = true;
        for (int k = 3; k >= 0; --k) {
            i64 c = rem % od.d[k] - before.d[k];
            rem /= od.d[k];
            inside = inside && c >= 0 && c < shape.d[k];
            at += c * stride;
            stride *= shape.d[k];
        }
        y[i] = inside ? x[at] : value;
    }
}

// out[o, j, e] = params[o, idx[j], e] (0 for an index outside [0, limit));
// n = outer * count * inner.
extern "C" __global__ void towers_gather_f32(i64 n, i64 limit, i64 inner, i64 count, const float* __restrict__ params,
                                             const int* __restrict__ idx, float* __restrict__ out) {
    GRID_STRIDE(i, n) {
        i64 e = i % inner, j = (i / inner) % count, o = i / (inner * count);
        i64 k = idx[j];
        out[i] = (k >= 0 && k < limit) ? params[(o * limit + k) * inner + e] : 0.0f;
    }
}

// dparams[o, r, e] = sum over j with idx[j] == r of dy[o, j, e], in
// increasing j; n = outer * limit * inner. Work count * n: one thread per
// output element reads every index (deterministic, no atomics).
extern "C" __global__ void towers_gather_grad_f32(i64 n, i64 limit, i64 inner, i64 count, const float* __restrict__ dy,
                                                  const int* __restrict__ idx, float* __restrict__ dparams) {
    GRID_STRIDE(i, n) {
        i64 e = i % inner, r = (i / inner) % limit, o = i / (inner * limit);
        float acc = 0.0f;
        for (i64 j = 0; j < count; ++j) {
            if ((i64)idx[j] == r) {
                acc = __fadd_rn(acc, dy[(o * count + j) * inner + e]);
            }
        }
        dparams[i] = acc;
    }
}

// y (dims od = shape * multiples) = x at c mod shape.
extern "C" __global__ void towers_tile_f32(i64 n, const float* __restrict__ x, float* __restrict__ y, Dims4 od,
                                           Dims4 shape) {
    GRID_STRIDE(i, n) {
        i64 rem = i, at = 0, stride = 1;
        for (int k = 3; k >= 0; --k) {
            at += ((rem % od.d[k]) % shape.d[k]) * stride;
            rem /= od.d[k];
            stride *= shape.d[k];
        }
        y[i] = x[at];
    }
}

// dx[c] (dims shape, n elements) = sum over the copies m (row-major over
// `multiples`) of dy[m * shape + c]: increasing position in dy, as the CPU.
extern "C" __global__ void towers_tile_grad_f32(i64 n, const float* __restrict__ dy, float* __restrict__ dx, Dims4 shape,
                                                Dims4 multiples) {
    GRID_STRIDE(i, n) {
        i64 c[4], rem = i;
        for (int k = 3; k >= 0; --k) {
            c[k] = rem % shape.d[k];
            rem /= shape.d[k];
        }
        i64 od[4];
        for (int k = 0; k < 4; ++k) {
            od[k] = shape.d[k] * multiples.d[k];
        }
        float acc = 0.0f;
        for (i64 m0 = 0; m0 < multiples.d[0]; ++m0) {
            for (i64 m1 = 0; m1 < multiples.d[1]; ++m1) {
                for (i64 m2 = 0; m2 < multiples.d[2]; ++m2) {
                    for (i64 m3 = 0; m3 < multiples.d[3]; ++m3) {
                        i64 at = (((m0 * shape.d[0] + c[0]) * od[1] + m1 * shape.d[1] + c[1]) * od[2] + m2 * shape.d[2] +
                                  c[2]) *
                                     od[3] +
                                 m3 * shape.d[3] + c[3];
                        acc = __fadd_rn(acc, dy[at]);
                    }
                }
            }
        }
        dx[i] = acc;
    }
}
