// CUDA twins of kernels/src/elementwise (binary with broadcasting,
// broadcast_to, bias_add, unary and the activation gradients).
//
// Conventions shared by every towers .cu file:
// - entry points are `extern "C" __global__ void towers_<kernel>_<dtype>`;
// - shapes, strides and scalars are arguments: one module serves every shape;
// - 1-D grid-stride loops: any grid works, `grid = min(ceil(n / block), 65535)`;
// - no includes: only what NVRTC provides without a CUDA toolkit.
//
// Broadcasting: shapes are right-aligned and padded to rank 4 by the host;
// `Dims4` holds the output dims, and the operands' *broadcast strides*
// (0 along an axis of size 1, as `shape::bstrides` on the CPU).

struct Dims4 {
    i64 d[4];
};

// Offset of flat output index `i` (dims `od`) in an operand with broadcast strides `s`.
__device__ __forceinline__ i64 bcast_offset(i64 i, const Dims4& od, const Dims4& s) {
    i64 off = 0;
#pragma unroll
    for (int k = 3; k >= 0; --k) {
        i64 c = i % od.d[k];
        i /= od.d[k];
        off += c * s.d[k];
    }
    return off;
}

// out[i] = a[bcast(i)] op b[bcast(i)], i < n = numel(od); `binary_op` (one case per BinaryOp::code()) is in the prelude.
extern "C" __global__ void towers_binary_f32(int op, i64 n, const float* __restrict__ a, const float* __restrict__ b,
                                             float* __restrict__ out, Dims4 od, Dims4 sa, Dims4 sb) {
    GRID_STRIDE(i, n) { out[i] = binary_op(op, a[bcast_offset(i, od, sa)], b[bcast_offset(i, od, sb)]); }
}

// out[i] = x[bcast(i)], i < n = numel(od).
extern "C" __global__ void towers_broadcast_to_f32(i64 n, const float* __restrict__ x, float* __restrict__ out, Dims4 od,
                                                   Dims4 sx) {
    GRID_STRIDE(i, n) { out[i] = x[bcast_offset(i, od, sx)]; }
}

// y = x + bias over the last axis: x, y: [n / c, c], bias: [c].
extern "C" __global__ void towers_bias_add_f32(i64 n, i64 c, const float* __restrict__ x, const float* __restrict__ bias,
                                               float* __restrict__ y) {
    GRID_STRIDE(i, n) { y[i] = x[i] + bias[i % c]; }
}

// `unary_op` (one activation on one value) is in the prelude.

// The epilogue of a fused GEMM or convolution (gemm_bias_act,
// conv2d_bias_act): y = act(y + bias) in place, the sum rounded first as the
// CPU twin; op < 0: the sum alone.
extern "C" __global__ void towers_bias_act_in_place_f32(int op, i64 n, i64 c, const float* __restrict__ bias, float* y) {
    GRID_STRIDE(i, n) {
        float v = __fadd_rn(y[i], bias[i % c]);
        y[i] = op < 0 ? v : unary_op(op, v);
    }
}
extern "C" __global__ void towers_unary_f32(int op, i64 n, const float* __restrict__ x, float* __restrict__ y) {
    GRID_STRIDE(i, n) { y[i] = unary_op(op, x[i]); }
}

// y = act(x + bias): a bias add and the activation after it in one launch
// (lowering fuses the pair); the sum is rounded to f32 first, as the CPU twin.
extern "C" __global__ void towers_bias_add_act_f32(int op, i64 n, i64 c, const float* __restrict__ x,
                                                   const float* __restrict__ bias, float* __restrict__ y) {
    GRID_STRIDE(i, n) { y[i] = unary_op(op, __fadd_rn(x[i], bias[i % c])); }
}

// The gradient from dy and the forward output y: `unary_grad_op` in the
// prelude (shared with the fused ReLU-and-bias gradient of the reduce family).
// dx may be dy (lowering's in-place activation gradient): each element is
// read, then written, by one thread, so neither pointer is __restrict__.
extern "C" __global__ void towers_unary_grad_f32(int op, i64 n, const float* dy, const float* __restrict__ y,
                                                 float* dx) {
    GRID_STRIDE(i, n) { dx[i] = unary_grad_op(op, dy[i], y[i]); }
}
