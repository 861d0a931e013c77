// CUDA twins of kernels/src/softmax: softmax family over the last axis,
// tensors viewed as [rows, c].
//
// Launch: one block per row (grid-stride over rows), blockDim a power of two
// <= 1024 (256 recommended). Row maxima and sums use a fixed shared-memory
// tree (thread t first folds elements t, t+B, t+2B, ... in order), so results
// are reproducible bit for bit run to run; they differ from the CPU's
// sequential sums by rounding only.
//
// Numerics as the CPU: shift by the row maximum (0 when it is not finite),
// log_softmax = (x - m) - log(sum(exp(x - m))).

// The row's shift: its maximum, or 0 when that is not finite.
__device__ float row_shift(const float* row, int c, float* sh) {
    float m = -__int_as_float(0x7f800000);
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        float v = row[j];
        m = v > m ? v : m;
    }
    m = block_max(m, sh);
    return isfinite(m) ? m : 0.0f;
}

// sum_j exp(row[j] - m)
__device__ float row_sum_exp(const float* row, int c, float m, float* sh) {
    float s = 0.0f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        s += expf(row[j] - m);
    }
    return block_sum(s, sh);
}

extern "C" __global__ void towers_softmax_f32(i64 rows, int c, const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float sh[MAX_BLOCK];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * c;
        float m = row_shift(xr, c, sh);
        float inv = 1.0f / row_sum_exp(xr, c, m, sh);
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            y[r * c + j] = expf(xr[j] - m) * inv;
        }
    }
}

extern "C" __global__ void towers_log_softmax_f32(i64 rows, int c, const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float sh[MAX_BLOCK];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * c;
        float m = row_shift(xr, c, sh);
        float lse = logf(row_sum_exp(xr, c, m, sh));
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            y[r * c + j] = (xr[j] - m) - lse;
        }
    }
}

// dx = y * (dy - sum(dy * y)) per row.
extern "C" __global__ void towers_softmax_grad_f32(i64 rows, int c, const float* __restrict__ dy,
                                                   const float* __restrict__ y, float* __restrict__ dx) {
    __shared__ float sh[MAX_BLOCK];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 base = r * c;
        float s = 0.0f;
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            s += dy[base + j] * y[base + j];
        }
        s = block_sum(s, sh);
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            dx[base + j] = y[base + j] * (dy[base + j] - s);
        }
    }
}

// dx = dy - exp(y) * sum(dy) per row (y = log_softmax).
extern "C" __global__ void towers_log_softmax_grad_f32(i64 rows, int c, const float* __restrict__ dy,
                                                       const float* __restrict__ y, float* __restrict__ dx) {
    __shared__ float sh[MAX_BLOCK];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 base = r * c;
        float s = 0.0f;
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            s += dy[base + j];
        }
        s = block_sum(s, sh);
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            dx[base + j] = dy[base + j] - expf(y[base + j]) * s;
        }
    }
}

// loss[r] = lse - (x[label] - m); backprop = softmax - onehot(label), times
// *scale when scale is not null (the fused kernel's scaled gradient, rounded
// as the separate Mul: scale * g). Labels are validated on the host before
// upload (the CPU twin's error); an out-of-range label here writes NaN to its
// row's loss and backprop.
extern "C" __global__ void towers_sparse_softmax_xent_f32(i64 rows, int c, const float* __restrict__ logits,
                                                          const int* __restrict__ labels, float* __restrict__ loss,
                                                          float* __restrict__ backprop,
                                                          const float* __restrict__ scale) {
    __shared__ float sh[MAX_BLOCK];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = logits + r * c;
        int k = labels[r];
        float m = row_shift(xr, c, sh);
        float lse = logf(row_sum_exp(xr, c, m, sh));
        bool bad = k < 0 || k >= c;
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float p = expf((xr[j] - m) - lse);
            float g = j == k ? p - 1.0f : p;
            backprop[r * c + j] = bad ? __int_as_float(0x7fc00000) : (scale ? __fmul_rn(*scale, g) : g);
        }
        if (threadIdx.x == 0) {
            loss[r] = bad ? __int_as_float(0x7fc00000) : lse - (xr[k] - m);
        }
    }
}

// loss[r] = -sum(labels * log_softmax); backprop = softmax - labels.
extern "C" __global__ void towers_softmax_xent_f32(i64 rows, int c, const float* __restrict__ logits,
                                                   const float* __restrict__ labels, float* __restrict__ loss,
                                                   float* __restrict__ backprop) {
    __shared__ float sh[MAX_BLOCK];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 base = r * c;
        const float* xr = logits + base;
        float m = row_shift(xr, c, sh);
        float lse = logf(row_sum_exp(xr, c, m, sh));
        float s = 0.0f;
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float logp = (xr[j] - m) - lse;
            s -= labels[base + j] * logp;
            backprop[base + j] = expf(logp) - labels[base + j];
        }
        s = block_sum(s, sh);
        if (threadIdx.x == 0) {
            loss[r] = s;
        }
    }
}
