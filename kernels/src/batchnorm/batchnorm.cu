// CUDA twins of kernels/src/batchnorm.rs as the plan runs them
// (runtime/src/exec.rs): channels last, x viewed as [rows, c].
//
// BatchNormTrain = towers_batch_norm_stats_f32 (one block per channel:
// mean, biased variance -> inv_std, then the unbiased variance the op
// outputs, var * rows / (rows - 1) when rows > 1) + towers_batch_norm_apply_f32.
// BatchNormInfer = towers_batch_norm_infer_f32 (also copies the moving
// statistics out as mean / var and writes inv_std = 1 / sqrt(var + eps)).
// BatchNormGrad = towers_batch_norm_grad_reduce_f32 (dbeta, dgamma per channel)
// + towers_batch_norm_grad_dx_f32.
//
// Per-channel sums: one block per channel (grid-stride over channels), thread
// t folds rows t, t+B, ... in order, then a fixed tree: deterministic, no
// atomics. blockDim a power of two <= 1024 (256 recommended).

extern "C" __global__ void towers_batch_norm_stats_f32(i64 rows, i64 c, float epsilon, const float* __restrict__ x,
                                                       float* __restrict__ mean, float* __restrict__ inv_std,
                                                       float* __restrict__ var) {
    __shared__ float sh[MAX_BLOCK];
    float inv_n = 1.0f / (float)(rows > 1 ? rows : 1);
    for (i64 j = blockIdx.x; j < c; j += gridDim.x) {
        float s = 0.0f;
        for (i64 r = threadIdx.x; r < rows; r += blockDim.x) {
            s += x[r * c + j];
        }
        float mu = block_sum(s, sh) * inv_n;
        float q = 0.0f;
        for (i64 r = threadIdx.x; r < rows; r += blockDim.x) {
            float d = x[r * c + j] - mu;
            q += d * d;
        }
        float v = block_sum(q, sh) * inv_n;
        if (threadIdx.x == 0) {
            mean[j] = mu;
            inv_std[j] = 1.0f / sqrtf(v + epsilon);
            var[j] = rows > 1 ? v * ((float)rows / (float)(rows - 1)) : v;
        }
    }
}

// y = (x - mean) * (gamma * inv_std) + beta, n = rows * c.
extern "C" __global__ void towers_batch_norm_apply_f32(i64 n, i64 c, const float* __restrict__ x,
                                                       const float* __restrict__ gamma, const float* __restrict__ beta,
                                                       const float* __restrict__ mean,
                                                       const float* __restrict__ inv_std, float* __restrict__ y) {
    GRID_STRIDE(i, n) {
        i64 j = i % c;
        y[i] = (x[i] - mean[j]) * (gamma[j] * inv_std[j]) + beta[j];
    }
}

// y = (x - mm) * (gamma / sqrt(mv + eps)) + beta; the first c threads also
// write mean = mm, var = mv, inv_std = 1 / sqrt(mv + eps).
extern "C" __global__ void towers_batch_norm_infer_f32(i64 n, i64 c, float epsilon, const float* __restrict__ x,
                                                       const float* __restrict__ gamma, const float* __restrict__ beta,
                                                       const float* __restrict__ moving_mean,
                                                       const float* __restrict__ moving_var, float* __restrict__ y,
                                                       float* __restrict__ mean, float* __restrict__ inv_std,
                                                       float* __restrict__ var) {
    GRID_STRIDE(i, n) {
        i64 j = i % c;
        float s = gamma[j] / sqrtf(moving_var[j] + epsilon);
        y[i] = (x[i] - moving_mean[j]) * s + beta[j];
    }
    GRID_STRIDE(j, c) {
        mean[j] = moving_mean[j];
        var[j] = moving_var[j];
        inv_std[j] = 1.0f / sqrtf(moving_var[j] + epsilon);
    }
}

// dbeta = sum(dy), dgamma = sum(dy * (x - mean) * inv_std) per channel.
extern "C" __global__ void towers_batch_norm_grad_reduce_f32(i64 rows, i64 c, const float* __restrict__ dy,
                                                             const float* __restrict__ x,
                                                             const float* __restrict__ mean,
                                                             const float* __restrict__ inv_std,
                                                             float* __restrict__ dgamma, float* __restrict__ dbeta) {
    __shared__ float sh[MAX_BLOCK];
    for (i64 j = blockIdx.x; j < c; j += gridDim.x) {
        float mu = mean[j], is = inv_std[j];
        float sb = 0.0f, sg = 0.0f;
        for (i64 r = threadIdx.x; r < rows; r += blockDim.x) {
            float g = dy[r * c + j];
            sb += g;
            sg += g * (x[r * c + j] - mu) * is;
        }
        sb = block_sum(sb, sh);
        sg = block_sum(sg, sh);
        if (threadIdx.x == 0) {
            dbeta[j] = sb;
            dgamma[j] = sg;
        }
    }
}

// dx = gamma * inv_std * (dy - dbeta / rows - xhat * dgamma / rows).
extern "C" __global__ void towers_batch_norm_grad_dx_f32(i64 n, i64 c, const float* __restrict__ dy,
                                                         const float* __restrict__ x, const float* __restrict__ gamma,
                                                         const float* __restrict__ mean,
                                                         const float* __restrict__ inv_std,
                                                         const float* __restrict__ dgamma,
                                                         const float* __restrict__ dbeta, float* __restrict__ dx) {
    i64 rows = n / (c > 0 ? c : 1);
    float inv_n = 1.0f / (float)(rows > 0 ? rows : 1);
    GRID_STRIDE(i, n) {
        i64 j = i % c;
        float xhat = (x[i] - mean[j]) * inv_std[j];
        dx[i] = gamma[j] * inv_std[j] * (dy[i] - dbeta[j] * inv_n - xhat * dgamma[j] * inv_n);
    }
}
