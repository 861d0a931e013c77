// CUDA twins of kernels/src/topk (top_k, in_top_k, top_k_grad) on
// [rows, cols] row-major, rows independent.
//
// top_k's order is total (larger first, NaN above every number, ties and
// NaNs by lower column), the CPU's `rank_order`, so both pick the same
// elements in the same order. One block per row: pass j finds the best
// element ranking after pass j-1's pick, each thread over its strided
// columns, then a fixed shared-memory tree; O(k * cols / blockDim) a row,
// no atomics, no workspace. blockDim a power of two <= MAX_BLOCK.

// Whether (va, column a) ranks before (vb, column b).
__device__ __forceinline__ bool topk_before(float va, int a, float vb, int b) {
    bool na = isnan(va), nb = isnan(vb);
    if (na != nb) {
        return na;
    }
    if (!na && va != vb) {
        return va > vb;
    }
    return a < b;
}

extern "C" __global__ void towers_top_k_f32(i64 rows, i64 cols, i64 k, const float* __restrict__ x,
                                            float* __restrict__ values, int* __restrict__ indices) {
    __shared__ float shv[MAX_BLOCK];
    __shared__ int shi[MAX_BLOCK];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = x + r * cols;
        // The previous pick; column -1: none yet.
        float pv = 0.0f;
        int pi = -1;
        for (i64 j = 0; j < k; ++j) {
            float bv = 0.0f;
            int bi = -1;
            for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
                float v = row[c];
                if (pi >= 0 && !topk_before(pv, pi, v, (int)c)) {
                    continue;
                }
                if (bi < 0 || topk_before(v, (int)c, bv, bi)) {
                    bv = v;
                    bi = (int)c;
                }
            }
            shv[threadIdx.x] = bv;
            shi[threadIdx.x] = bi;
            __syncthreads();
            for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
                if (threadIdx.x < s) {
                    float ov = shv[threadIdx.x + s];
                    int oi = shi[threadIdx.x + s];
                    if (oi >= 0 && (shi[threadIdx.x] < 0 || topk_before(ov, oi, shv[threadIdx.x], shi[threadIdx.x]))) {
                        shv[threadIdx.x] = ov;
                        shi[threadIdx.x] = oi;
                    }
                }
                __syncthreads();
            }
            pv = shv[0];
            pi = shi[0];
            if (threadIdx.x == 0) {
                values[r * k + j] = pv;
                indices[r * k + j] = pi;
            }
            __syncthreads();
        }
    }
}

// TF's InTopK (in_topk_op.h): false for a target outside [0, cols) or any
// non-finite prediction in the row; else fewer than k strictly larger.
// One thread per row.
extern "C" __global__ void towers_in_top_k_f32(i64 rows, i64 cols, i64 k, const float* __restrict__ predictions,
                                               const int* __restrict__ targets, int* __restrict__ out) {
    GRID_STRIDE(r, rows) {
        const float* row = predictions + r * cols;
        const int t = targets[r];
        bool ok = t >= 0 && (i64)t < cols && isfinite(row[t]);
        i64 larger = 0;
        if (ok) {
            const float p = row[t];
            for (i64 c = 0; c < cols; ++c) {
                const float v = row[c];
                if (!isfinite(v)) {
                    ok = false;
                    break;
                }
                larger += v > p ? 1 : 0;
            }
        }
        out[r] = (ok && larger < k) ? 1 : 0;
    }
}

// dx[r, c] = sum over j (in order, from 0) of dvalues[r, j] where
// indices[r, j] == c: the CPU's scatter-add, bit for bit, without atomics.
// An index outside [0, cols) matches no column (dropped; the CPU fails).
extern "C" __global__ void towers_top_k_grad_f32(i64 rows, i64 cols, i64 k, const float* __restrict__ dvalues,
                                                 const int* __restrict__ indices, float* __restrict__ dx) {
    GRID_STRIDE(e, rows * cols) {
        const i64 r = e / cols, c = e % cols;
        float s = 0.0f;
        for (i64 j = 0; j < k; ++j) {
            if ((i64)indices[r * k + j] == c) {
                s += dvalues[r * k + j];
            }
        }
        dx[e] = s;
    }
}
