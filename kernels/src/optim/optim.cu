// CUDA twins of kernels/src/optim.rs (in-place updates), the plan's
// AssignMovingAverage and IncrementStep, and MeanApply (runtime/src/exec.rs
// `mean_apply`: the towers' weighted gradient formed per element and applied
// at once, never stored).
//
// Every product and sum is rounded on its own (__fmul_rn, __fadd_rn: no
// fused multiply-add), in the CPU's order, and division and sqrtf are IEEE
// correctly rounded: variables updated here match the CPU twin bit for bit,
// so checkpoints agree across backends. Adam's bias correction
// lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t) is computed in double with
// compiler-rt's __powidf2 loop (Rust's powi) from the device's global_step,
// so a captured graph needs no host update per step.
//
// Pointer arrays (`grads`, of `count` tower gradients) and `weights` live in
// device memory, written once at load.

#define MUL __fmul_rn
#define ADD __fadd_rn
#define SUB __fsub_rn

// w -= lr * g
extern "C" __global__ void towers_apply_gradient_descent_f32(i64 n, const float* __restrict__ lr_p,
                                                             const float* __restrict__ g, float* __restrict__ w) {
    const float lr = *lr_p;
    GRID_STRIDE(i, n) { w[i] = SUB(w[i], MUL(lr, g[i])); }
}

__device__ __forceinline__ void momentum_step(float* w, float* a, float g, float lr, float momentum, int nesterov) {
    float acc = ADD(MUL(*a, momentum), g);
    *a = acc;
    *w = SUB(*w, nesterov ? MUL(lr, ADD(g, MUL(momentum, acc))) : MUL(lr, acc));
}

// accum = accum * momentum + g; w -= lr * (nesterov ? g + momentum * accum : accum)
extern "C" __global__ void towers_apply_momentum_f32(i64 n, const float* __restrict__ lr_p, float momentum,
                                                     int nesterov, const float* __restrict__ g, float* __restrict__ w,
                                                     float* __restrict__ accum) {
    const float lr = *lr_p;
    GRID_STRIDE(i, n) { momentum_step(&w[i], &accum[i], g[i], lr, momentum, nesterov); }
}

// compiler-rt __powidf2, which Rust's f64::powi lowers to.
__device__ double powi(double a, int b) {
    const bool recip = b < 0;
    double r = 1;
    while (1) {
        if (b & 1) {
            r *= a;
        }
        b /= 2;
        if (b == 0) {
            break;
        }
        a *= a;
    }
    return recip ? 1 / r : r;
}

// Adam's lr_t for step t = max(global_step, 0) + 1.
__device__ float adam_lr(float lr, float beta1, float beta2, const int* global_step) {
    int gs = global_step[0];
    int t = gs < 0 ? 1 : gs == 0x7fffffff ? gs : gs + 1; // Rust: step.min(i32::MAX)
    double b1t = powi((double)beta1, t);
    double b2t = powi((double)beta2, t);
    return (float)(__dmul_rn((double)lr, __dsqrt_rn(1.0 - b2t)) / (1.0 - b1t));
}

__device__ __forceinline__ void adam_step(float* w, float* m, float* v, float g, float lr_t, float beta1, float beta2,
                                          float epsilon) {
    float mm = ADD(*m, MUL(SUB(g, *m), SUB(1.0f, beta1)));
    float vv = ADD(*v, MUL(SUB(MUL(g, g), *v), SUB(1.0f, beta2)));
    *m = mm;
    *v = vv;
    *w = SUB(*w, MUL(lr_t, mm) / ADD(sqrtf(vv), epsilon));
}

// m += (g - m)(1 - beta1); v += (g^2 - v)(1 - beta2); w -= lr_t m / (sqrt(v) + eps)
extern "C" __global__ void towers_apply_adam_f32(i64 n, const float* __restrict__ lr_p, float beta1, float beta2,
                                                 float epsilon, const float* __restrict__ g,
                                                 const int* __restrict__ global_step, float* __restrict__ w,
                                                 float* __restrict__ m, float* __restrict__ v) {
    float lr_t = adam_lr(*lr_p, beta1, beta2, global_step);
    GRID_STRIDE(i, n) { adam_step(&w[i], &m[i], &v[i], g[i], lr_t, beta1, beta2, epsilon); }
}

// The tower reduction of element i: sum_k weights[k] * grads[k][i], in tower order.
__device__ __forceinline__ float tower_grad(const float* const* grads, const float* weights, int count, i64 i) {
    if (count == 0) {
        return 0.0f;
    }
    float s = MUL(grads[0][i], weights[0]);
    for (int k = 1; k < count; ++k) {
        s = ADD(s, MUL(grads[k][i], weights[k]));
    }
    return s;
}

extern "C" __global__ void towers_mean_apply_gradient_descent_f32(i64 n, int count, const float* const* grads,
                                                                  const float* __restrict__ weights,
                                                                  const float* __restrict__ lr_p,
                                                                  float* __restrict__ w) {
    const float lr = *lr_p;
    GRID_STRIDE(i, n) { w[i] = SUB(w[i], MUL(lr, tower_grad(grads, weights, count, i))); }
}

extern "C" __global__ void towers_mean_apply_momentum_f32(i64 n, int count, const float* const* grads,
                                                          const float* __restrict__ weights,
                                                          const float* __restrict__ lr_p, float momentum,
                                                          int nesterov, float* __restrict__ w,
                                                          float* __restrict__ accum) {
    const float lr = *lr_p;
    GRID_STRIDE(i, n) { momentum_step(&w[i], &accum[i], tower_grad(grads, weights, count, i), lr, momentum, nesterov); }
}

extern "C" __global__ void towers_mean_apply_adam_f32(i64 n, int count, const float* const* grads,
                                                      const float* __restrict__ weights,
                                                      const float* __restrict__ lr_p, float beta1,
                                                      float beta2, float epsilon, const int* __restrict__ global_step,
                                                      float* __restrict__ w, float* __restrict__ m,
                                                      float* __restrict__ v) {
    float lr_t = adam_lr(*lr_p, beta1, beta2, global_step);
    GRID_STRIDE(i, n) {
        adam_step(&w[i], &m[i], &v[i], tower_grad(grads, weights, count, i), lr_t, beta1, beta2, epsilon);
    }
}

// Multi-tensor updates (MultiApply): `count` variables of one optimizer in
// one launch over their concatenated elements. offsets[t] (count + 1 prefix
// sums of the lengths, in device memory) locates member t; the pointer
// arrays hold each member's gradient, variable and slots. Each element is
// updated by the same step function as the single-variable kernels.
__device__ __forceinline__ int member_of(const i64* offsets, int count, i64 i) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= i) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

extern "C" __global__ void towers_multi_apply_gradient_descent_f32(i64 total, int count, const i64* offsets,
                                                                   const float* const* grads, float* const* ws,
                                                                   const float* __restrict__ lr_p) {
    const float lr = *lr_p;
    GRID_STRIDE(i, total) {
        int t = member_of(offsets, count, i);
        i64 j = i - offsets[t];
        ws[t][j] = SUB(ws[t][j], MUL(lr, grads[t][j]));
    }
}

extern "C" __global__ void towers_multi_apply_momentum_f32(i64 total, int count, const i64* offsets,
                                                           const float* const* grads, float* const* ws,
                                                           float* const* accums, const float* __restrict__ lr_p,
                                                           float momentum, int nesterov) {
    const float lr = *lr_p;
    GRID_STRIDE(i, total) {
        int t = member_of(offsets, count, i);
        i64 j = i - offsets[t];
        momentum_step(&ws[t][j], &accums[t][j], grads[t][j], lr, momentum, nesterov);
    }
}

extern "C" __global__ void towers_multi_apply_adam_f32(i64 total, int count, const i64* offsets,
                                                       const float* const* grads, float* const* ws, float* const* ms,
                                                       float* const* vs, const float* __restrict__ lr_p, float beta1,
                                                       float beta2, float epsilon,
                                                       const int* __restrict__ global_step) {
    float lr_t = adam_lr(*lr_p, beta1, beta2, global_step);
    GRID_STRIDE(i, total) {
        int t = member_of(offsets, count, i);
        i64 j = i - offsets[t];
        adam_step(&ws[t][j], &ms[t][j], &vs[t][j], grads[t][j], lr_t, beta1, beta2, epsilon);
    }
}

// ---- optimizers of issue 22: RMSProp and Adagrad (TF1's ApplyRMSProp, ApplyAdagrad) ----

// ms += (g^2 - ms)(1 - decay); mom = mom * momentum + g * lr / sqrt(ms + eps); w -= mom
__device__ __forceinline__ void rmsprop_step(float* w, float* ms, float* mom, float g, float lr, float decay,
                                             float momentum, float epsilon) {
    float s = ADD(*ms, MUL(SUB(MUL(g, g), *ms), SUB(1.0f, decay)));
    float m = ADD(MUL(*mom, momentum), __fdiv_rn(MUL(g, lr), __fsqrt_rn(ADD(s, epsilon))));
    *ms = s;
    *mom = m;
    *w = SUB(*w, m);
}

// accum += g^2; w -= g * lr / sqrt(accum)
__device__ __forceinline__ void adagrad_step(float* w, float* accum, float g, float lr) {
    float a = ADD(*accum, MUL(g, g));
    *accum = a;
    *w = SUB(*w, __fdiv_rn(MUL(g, lr), __fsqrt_rn(a)));
}

extern "C" __global__ void towers_apply_rmsprop_f32(i64 n, const float* __restrict__ lr_p, float decay, float momentum,
                                                    float epsilon, const float* __restrict__ g, float* __restrict__ w,
                                                    float* __restrict__ ms, float* __restrict__ mom) {
    const float lr = *lr_p;
    GRID_STRIDE(i, n) { rmsprop_step(&w[i], &ms[i], &mom[i], g[i], lr, decay, momentum, epsilon); }
}

extern "C" __global__ void towers_apply_adagrad_f32(i64 n, const float* __restrict__ lr_p,
                                                    const float* __restrict__ g, float* __restrict__ w,
                                                    float* __restrict__ accum) {
    const float lr = *lr_p;
    GRID_STRIDE(i, n) { adagrad_step(&w[i], &accum[i], g[i], lr); }
}

extern "C" __global__ void towers_mean_apply_rmsprop_f32(i64 n, int count, const float* const* grads,
                                                         const float* __restrict__ weights,
                                                         const float* __restrict__ lr_p, float decay, float momentum,
                                                         float epsilon, float* __restrict__ w, float* __restrict__ ms,
                                                         float* __restrict__ mom) {
    const float lr = *lr_p;
    GRID_STRIDE(i, n) {
        rmsprop_step(&w[i], &ms[i], &mom[i], tower_grad(grads, weights, count, i), lr, decay, momentum, epsilon);
    }
}

extern "C" __global__ void towers_mean_apply_adagrad_f32(i64 n, int count, const float* const* grads,
                                                         const float* __restrict__ weights,
                                                         const float* __restrict__ lr_p, float* __restrict__ w,
                                                         float* __restrict__ accum) {
    const float lr = *lr_p;
    GRID_STRIDE(i, n) { adagrad_step(&w[i], &accum[i], tower_grad(grads, weights, count, i), lr); }
}

extern "C" __global__ void towers_multi_apply_rmsprop_f32(i64 total, int count, const i64* offsets,
                                                          const float* const* grads, float* const* ws,
                                                          float* const* mss, float* const* moms,
                                                          const float* __restrict__ lr_p, float decay, float momentum,
                                                          float epsilon) {
    const float lr = *lr_p;
    GRID_STRIDE(i, total) {
        int t = member_of(offsets, count, i);
        i64 j = i - offsets[t];
        rmsprop_step(&ws[t][j], &mss[t][j], &moms[t][j], grads[t][j], lr, decay, momentum, epsilon);
    }
}

extern "C" __global__ void towers_multi_apply_adagrad_f32(i64 total, int count, const i64* offsets,
                                                          const float* const* grads, float* const* ws,
                                                          float* const* accums, const float* __restrict__ lr_p) {
    const float lr = *lr_p;
    GRID_STRIDE(i, total) {
        int t = member_of(offsets, count, i);
        i64 j = i - offsets[t];
        adagrad_step(&ws[t][j], &accums[t][j], grads[t][j], lr);
    }
}

// v = v * decay + x * (1 - decay)
extern "C" __global__ void towers_assign_moving_average_f32(i64 n, float decay, const float* __restrict__ x,
                                                            float* __restrict__ v) {
    GRID_STRIDE(i, n) { v[i] = ADD(MUL(v[i], decay), MUL(x[i], SUB(1.0f, decay))); }
}

// step[0] += 1, wrapping. Launch: grid = 1, block = 1.
extern "C" __global__ void towers_increment_step_i32(int* step) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        step[0] = (int)((u32)step[0] + 1u);
    }
}
