// CUDA twins of kernels/src/reduce (reduce_sum, reduce_mean, reduce_max/min, argmax, equal,
// casts), of sum_to_shape (elementwise/broadcast.rs), bias_add_grad
// (elementwise/bias.rs) and l2_loss (misc.rs): every sum over axes is one
// kernel, `towers_reduce_f32`.
//
// Determinism: no atomics. A reduction runs one block per output element
// (grid-stride over outputs); thread t folds reduced elements t, t+B, ... in
// order, then a fixed shared-memory tree combines the block. Same inputs,
// same launch geometry: same bits, run after run. blockDim must be a power of
// two <= 1024 (256 recommended).

struct Dims4 {
    i64 d[4];
};

// The strides of `xd` into `xs`; returns how many elements the axes marked
// in `reduced` hold (the count one output folds).
__device__ __forceinline__ i64 reduce_strides(Dims4 xd, int reduced, i64 xs[4]) {
    i64 acc = 1;
    i64 count = 1;
    for (int k = 3; k >= 0; --k) {
        xs[k] = acc;
        acc *= xd.d[k];
        if (reduced & (1 << k)) {
            count *= xd.d[k];
        }
    }
    return count;
}

// The offset in x of index `i` counted over the axes marked in `axes` only
// (last axis fastest): an output's base over the kept axes, or a reduced
// element's offset from that base.
__device__ __forceinline__ i64 axes_offset(i64 i, Dims4 xd, int axes, const i64 xs[4]) {
    i64 off = 0;
    for (int k = 3; k >= 0; --k) {
        if (axes & (1 << k)) {
            off += (i % xd.d[k]) * xs[k];
            i /= xd.d[k];
        }
    }
    return off;
}

// x has dims `xd` (rank 4, right-aligned); bit k of `reduced` marks axis k as
// summed. out holds the kept axes in order (n_out = their product), each
// output multiplied by `scale` (1 for a sum, 1/count for a mean).
// Serves ReduceSum, ReduceMean, SumTo (reduced = axes where the target is 1
// and x is not) and BiasAddGrad (xd = [1, 1, rows, c], reduced = 0b0100).
extern "C" __global__ void towers_reduce_f32(i64 n_out, const float* __restrict__ x, float* __restrict__ out, Dims4 xd,
                                             int reduced, float scale) {
    __shared__ float sh[MAX_BLOCK];
    i64 xs[4];
    const i64 count = reduce_strides(xd, reduced, xs);
    for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        // Base offset of this output: its kept coordinates.
        const i64 base = axes_offset(o, xd, ~reduced, xs);
        float s = 0.0f;
        for (i64 r = threadIdx.x; r < count; r += blockDim.x) {
            const i64 off = base + axes_offset(r, xd, reduced, xs);
            s += x[off];
        }
        s = block_sum(s, sh);
        if (threadIdx.x == 0) {
            out[o] = scale == 1.0f ? s : s * scale;
        }
    }
}

// The maximum of a and b (the minimum when is_min), as the CPU twin's
// `extreme` (reduce/mod.rs): NaN wins, and -0 < +0, so the fold is
// commutative and associative bit for bit and any tree gives the CPU's bits.
__device__ __forceinline__ float extreme(float a, float b, int is_min) {
    if (isnan(a)) {
        return a;
    }
    if (isnan(b)) {
        return b;
    }
    bool b_wins = a == b ? ((signbit(a) != 0) != (is_min != 0) && (signbit(b) != 0) == (is_min != 0))
                         : ((b > a) != (is_min != 0));
    return b_wins ? b : a;
}

// ReduceMax / ReduceMin: as towers_reduce_f32 (one block per output, the
// same addressing), folding with `extreme` from -inf (+inf for the minimum).
extern "C" __global__ void towers_reduce_extreme_f32(i64 n_out, const float* __restrict__ x, float* __restrict__ out,
                                                     Dims4 xd, int reduced, int is_min) {
    __shared__ float sh[MAX_BLOCK];
    i64 xs[4];
    const i64 count = reduce_strides(xd, reduced, xs);
    const float init = is_min ? __int_as_float(0x7f800000) : -__int_as_float(0x7f800000);
    for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        const i64 base = axes_offset(o, xd, ~reduced, xs);
        float m = init;
        for (i64 r = threadIdx.x; r < count; r += blockDim.x) {
            const i64 off = base + axes_offset(r, xd, reduced, xs);
            m = extreme(m, x[off], is_min);
        }
        sh[threadIdx.x] = m;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                sh[threadIdx.x] = extreme(sh[threadIdx.x], sh[threadIdx.x + s], is_min);
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            out[o] = sh[0];
        }
        __syncthreads();
    }
}

// out[0] = sum(x^2) / 2, accumulated in double as the CPU twin.
// Launch: grid = 1, blockDim a power of two <= 1024.
extern "C" __global__ void towers_l2_loss_f32(i64 n, const float* __restrict__ x, float* __restrict__ out) {
    __shared__ double sh[MAX_BLOCK];
    double s = 0.0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        s += (double)(v * v);
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) {
            sh[threadIdx.x] += sh[threadIdx.x + k];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] = (float)(sh[0] * 0.5);
    }
}

// x viewed as [outer, len, inner]; out[o * inner + i] = first index of the
// maximum along the middle axis (NaN never wins; all -inf/NaN gives 0).
extern "C" __global__ void towers_argmax_f32(i64 outer, i64 len, i64 inner, const float* __restrict__ x,
                                             int* __restrict__ out) {
    GRID_STRIDE(t, outer * inner) {
        i64 o = t / inner, i = t % inner;
        i64 base = o * len * inner + i;
        float best = -__int_as_float(0x7f800000);
        int at = 0;
        for (i64 j = 0; j < len; ++j) {
            float v = x[base + j * inner];
            if (v > best) {
                best = v;
                at = (int)j;
            }
        }
        out[t] = at;
    }
}

// out = (a == b) as i32 0/1 (the plan's Equal writes a bool buffer).
extern "C" __global__ void towers_equal_f32(i64 n, const float* __restrict__ a, const float* __restrict__ b,
                                            int* __restrict__ out) {
    GRID_STRIDE(i, n) { out[i] = a[i] == b[i] ? 1 : 0; }
}

extern "C" __global__ void towers_equal_i32(i64 n, const int* __restrict__ a, const int* __restrict__ b,
                                            int* __restrict__ out) {
    GRID_STRIDE(i, n) { out[i] = a[i] == b[i] ? 1 : 0; }
}

// out = a cmp b as i32 0/1, cmp a Comparison::code() (the generated
// compare_op of the prelude; an unknown code writes -1).
extern "C" __global__ void towers_compare_f32(int op, i64 n, const float* __restrict__ a, const float* __restrict__ b,
                                              int* __restrict__ out) {
    GRID_STRIDE(i, n) { out[i] = compare_op<float>(op, a[i], b[i]); }
}

extern "C" __global__ void towers_compare_i32(int op, i64 n, const int* __restrict__ a, const int* __restrict__ b,
                                              int* __restrict__ out) {
    GRID_STRIDE(i, n) { out[i] = compare_op<int>(op, a[i], b[i]); }
}

// Select (TF1's tf.where): out = cond[i / inner] ? x : y. Only the selected
// value is read into out, so a NaN in the other operand never leaks.
extern "C" __global__ void towers_select_f32(i64 n, i64 inner, const int* __restrict__ cond,
                                             const float* __restrict__ x, const float* __restrict__ y,
                                             float* __restrict__ out) {
    GRID_STRIDE(i, n) { out[i] = cond[i / inner] ? x[i] : y[i]; }
}

// Casts. f32 -> i32 truncates toward zero and saturates, NaN -> 0 (Rust `as`).
extern "C" __global__ void towers_cast_f32_i32(i64 n, const float* __restrict__ x, int* __restrict__ y) {
    GRID_STRIDE(i, n) { y[i] = __float2int_rz(x[i]); }
}

extern "C" __global__ void towers_cast_i32_f32(i64 n, const int* __restrict__ x, float* __restrict__ y) {
    GRID_STRIDE(i, n) { y[i] = __int2float_rn(x[i]); }
}

extern "C" __global__ void towers_cast_f32_bool(i64 n, const float* __restrict__ x, int* __restrict__ y) {
    GRID_STRIDE(i, n) { y[i] = x[i] != 0.0f ? 1 : 0; }
}

extern "C" __global__ void towers_cast_i32_bool(i64 n, const int* __restrict__ x, int* __restrict__ y) {
    GRID_STRIDE(i, n) { y[i] = x[i] != 0 ? 1 : 0; }
}

// Same-width casts (f32 -> f32, i32/bool -> i32): a 32-bit copy.
extern "C" __global__ void towers_copy_u32(i64 n, const u32* __restrict__ x, u32* __restrict__ y) {
    GRID_STRIDE(i, n) { y[i] = x[i]; }
}

// The fused gradient of an activation and the bias add before it:
// dx = grad(dy, y) (as towers_unary_grad_f32) and db[c] = the sum of dx over
// the rows of channel c, one block per channel (a strided column, like
// bias_add_grad through towers_reduce_f32), each thread summing its rows in
// order and the block's partial sums folded by block_sum's fixed tree:
// deterministic.
// dx may be dy (lowering's in-place activation gradient): each element is
// read, then written, by one thread, so neither pointer is __restrict__.
extern "C" __global__ void towers_unary_grad_bias_grad_f32(int op, i64 rows, i64 c, const float* dy,
                                                           const float* __restrict__ y, float* dx,
                                                           float* __restrict__ db) {
    __shared__ float sh[1024];
    for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {
        float acc = 0.0f;
        for (i64 r = threadIdx.x; r < rows; r += blockDim.x) {
            i64 i = r * c + ch;
            float g = unary_grad_op(op, dy[i], y[i]);
            dx[i] = g;
            acc = __fadd_rn(acc, g);
        }
        float s = block_sum(acc, sh);
        if (threadIdx.x == 0) {
            db[ch] = s;
        }
        __syncthreads();
    }
}

// The same in two stages, for tall [rows, c] tensors (a convolution's
// 200K rows of 12 channels): one block per channel leaves most of a GPU idle
// and reads with a stride of c.
// Stage 1: block b takes rows [b*rpb, min(rows, (b+1)*rpb)) as flat,
// coalesced elements. blockDim is a multiple of c (at most 1024), so thread
// t always meets channel t % c and sums its elements in row order; the
// threads of one channel are then folded in thread order into
// partial[b*c + ch]. Stage 2 sums the blocks' partials of each channel in
// block order. Both orders are fixed by (rows, c, rpb, blockDim), which
// lowering derives from the shapes alone: deterministic.
extern "C" __global__ void towers_unary_grad_bias_partial_f32(int op, i64 rows, i64 c, i64 rpb, const float* dy,
                                                              const float* __restrict__ y, float* dx,
                                                              float* __restrict__ partial) {
    __shared__ float sh[1024];
    i64 r0 = (i64)blockIdx.x * rpb;
    i64 r1 = r0 + rpb < rows ? r0 + rpb : rows;
    float acc = 0.0f;
    for (i64 i = r0 * c + threadIdx.x; i < r1 * c; i += blockDim.x) {
        float g = unary_grad_op(op, dy[i], y[i]);
        dx[i] = g;
        acc = __fadd_rn(acc, g);
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < c) {
        float s = 0.0f;
        for (unsigned t = threadIdx.x; t < blockDim.x; t += (unsigned)c) {
            s = __fadd_rn(s, sh[t]);
        }
        partial[(i64)blockIdx.x * c + threadIdx.x] = s;
    }
}

// Stage 2: db[ch] = the sum of partial[b*c + ch] over the parts, in order.
extern "C" __global__ void towers_sum_partials_f32(i64 parts, i64 c, const float* __restrict__ partial,
                                                   float* __restrict__ db) {
    GRID_STRIDE(ch, c) {
        float s = 0.0f;
        for (i64 b = 0; b < parts; b++) {
            s = __fadd_rn(s, partial[b * c + ch]);
        }
        db[ch] = s;
    }
}
