// Shared by every CUDA source of kernels/src: the registry (kernels/src/cuda.rs)
// puts this text, then the generated op switches, in front of each family's
// .cu, so one compiled module holds them all. NVRTC needs no headers: nothing here includes anything.
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

// Stable on both tails, as the CPU twin: exp of a non-positive argument only
// (UnaryOp::Sigmoid's CUDA form).
__device__ __forceinline__ float sigmoid(float v) {
    if (v >= 0.0f) {
        return 1.0f / (1.0f + expf(-v));
    }
    float e = expf(v);
    return e / (1.0f + e);
}

// After this text the registry (kernels/src/cuda.rs, cuda::prelude()) puts
// the op switches generated from the Rust tables: unary_op and unary_grad_op
// (UnaryOp::cuda_switches) and binary_op (BinaryOp::cuda_switch), each case
// numbered by the op's code() and any other code writing NaN.
