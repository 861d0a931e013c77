// CUDA twins of kernels/src/misc.rs (add_n, weighted_sum: the tower
// reduction) and the plan's Fill. l2_loss lives in reduce/reduce.cu with the
// other reductions.
//
// Inputs come as a device array of `count` pointers written once at load.
// Each output element is summed in input order with every product and sum
// rounded on its own (no fused multiply-add), as the CPU: bit for bit equal.

// out = sum_k xs[k] (0 when count == 0).
extern "C" __global__ void towers_add_n_f32(i64 n, int count, const float* const* xs, float* __restrict__ out) {
    GRID_STRIDE(i, n) {
        float s = count > 0 ? xs[0][i] : 0.0f;
        for (int k = 1; k < count; ++k) {
            s = __fadd_rn(s, xs[k][i]);
        }
        out[i] = s;
    }
}

// out = sum_k weights[k] * xs[k] (0 when count == 0).
extern "C" __global__ void towers_weighted_sum_f32(i64 n, int count, const float* const* xs,
                                                   const float* __restrict__ weights, float* __restrict__ out) {
    GRID_STRIDE(i, n) {
        float s = count > 0 ? __fmul_rn(xs[0][i], weights[0]) : 0.0f;
        for (int k = 1; k < count; ++k) {
            s = __fadd_rn(s, __fmul_rn(xs[k][i], weights[k]));
        }
        out[i] = s;
    }
}

// out = value
extern "C" __global__ void towers_fill_f32(i64 n, float value, float* __restrict__ out) {
    GRID_STRIDE(i, n) { out[i] = value; }
}
