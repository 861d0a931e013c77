// Shared by every CUDA source of kernels/src: the registry (kernels/src/cuda.rs)
// puts this text in front of each family's .cu, so one compiled module holds
// both. NVRTC needs no headers: nothing here includes anything.
//
// Determinism of the block reductions: no atomics; a fixed shared-memory tree
// over a power-of-two blockDim (<= MAX_BLOCK), so the same inputs and launch
// geometry give the same bits, run after run.

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

#define MAX_BLOCK 1024
#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

// The sum of `v` over the block, in the fixed tree order; every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            sh[threadIdx.x] += sh[threadIdx.x + s];
        }
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

// The maximum of `v` over the block (a NaN-free tie keeps the left value).
__device__ __forceinline__ float block_max(float v, float* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float o = sh[threadIdx.x + s];
            sh[threadIdx.x] = o > sh[threadIdx.x] ? o : sh[threadIdx.x];
        }
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}


// op: the index in UnaryOp::ALL: 0 Neg, 1 Relu, 2 Sigmoid, 3 Tanh, 4 Exp, 5 Log,
// 6 Sqrt, 7 Rsqrt, 8 Reciprocal.
__device__ __forceinline__ float sigmoid(float v) {
    // Stable on both tails, as the CPU twin: exp of a non-positive argument only.
    if (v >= 0.0f) {
        return 1.0f / (1.0f + expf(-v));
    }
    float e = expf(v);
    return e / (1.0f + e);
}

// One op on one value (the forward twin of `UnaryOp::apply`).
__device__ __forceinline__ float unary_op(int op, float v) {
    float r;
    switch (op) {
    case 0: r = -v; break;
    case 1: r = v > 0.0f ? v : 0.0f; break;
    case 2: r = sigmoid(v); break;
    case 3: r = tanhf(v); break;
    case 4: r = expf(v); break;
    case 5: r = logf(v); break;
    case 6: r = __fsqrt_rn(v); break;
    case 7: r = __fdiv_rn(1.0f, __fsqrt_rn(v)); break;
    case 8: r = __fdiv_rn(1.0f, v); break;
    case 9: r = v > 0.0f ? v : expm1f(v); break;
    default: r = __int_as_float(0x7fc00000); break;  // an op this source lacks: NaN, never a wrong value
    }
    return r;
}

// dx from dy and the forward output y: Neg: -dy; Relu: dy where y > 0;
// Sigmoid: dy*y*(1-y); Tanh: dy*(1-y*y); Exp: dy*y; Log: dy*exp(-y);
// Sqrt: dy*0.5/y; Rsqrt: -0.5*dy*y*y*y; Reciprocal: -dy*y*y; Elu: dy where y > 0, else
// dy*(y+1). The case numbers are the indices of `UnaryOp::ALL` (a test checks
// that every op has its case). Products are rounded one by one
// (no fused multiply-add), as the CPU twin, so results match bit for bit.
__device__ __forceinline__ float unary_grad_op(int op, float g, float v) {
    float r;
    switch (op) {
    case 0: r = __fmul_rn(g, -1.0f); break;
    case 1: r = v > 0.0f ? g : 0.0f; break;
    case 2: r = __fmul_rn(__fmul_rn(g, v), __fsub_rn(1.0f, v)); break;
    case 3: r = __fmul_rn(g, __fsub_rn(1.0f, __fmul_rn(v, v))); break;
    case 4: r = __fmul_rn(g, v); break;
    case 5: r = __fmul_rn(g, expf(-v)); break;
    case 6: r = __fdiv_rn(__fmul_rn(g, 0.5f), v); break;
    case 7: r = __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(-0.5f, g), v), v), v); break;
    case 8: r = __fmul_rn(__fmul_rn(-g, v), v); break;
    case 9: r = v > 0.0f ? g : __fmul_rn(g, __fadd_rn(v, 1.0f)); break;
    default: r = __int_as_float(0x7fc00000); break;
    }
    return r;
}
