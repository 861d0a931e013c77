// CUDA twin of kernels/src/dropout.rs with the runtime's element offset
// (runtime/src/exec.rs `dropout_at`): element i of this launch is global
// element g = offset + i and uses lane g % 4 of the Philox4x32-10 block
// g / 4 with counter (block lo, block hi, step lo, step hi) and key
// (seed lo, seed hi), as kernels/src/random.rs. Integer math only up to the
// final compare, so masks match the CPU bit for bit.
//
// mask = (keep >= 1 or unit(bits) < keep) ? scale : 0 with
// scale = keep > 0 ? 1 / min(keep, 1) : 0; y = x * mask.

__device__ __forceinline__ u32 philox_lane(u64 seed, u64 step, u64 block, int lane) {
    u32 c0 = (u32)block, c1 = (u32)(block >> 32), c2 = (u32)step, c3 = (u32)(step >> 32);
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        u32 n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        if (round < 9) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
    }
    return lane == 0 ? c0 : lane == 1 ? c1 : lane == 2 ? c2 : c3;
}

// Philox4x32-10 of (counter, key), all four words: for known-answer tests.
extern "C" __global__ void towers_philox4x32_10(const u32* __restrict__ counter, const u32* __restrict__ key,
                                                u32* __restrict__ out) {
    if (blockIdx.x == 0 && threadIdx.x < 4) {
        u64 block = (u64)counter[0] | ((u64)counter[1] << 32);
        u64 step = (u64)counter[2] | ((u64)counter[3] << 32);
        u64 seed = (u64)key[0] | ((u64)key[1] << 32);
        out[threadIdx.x] = philox_lane(seed, step, block, threadIdx.x);
    }
}

// `step_at` points at the step number in device memory (written by the host
// before each step), so a captured CUDA graph replays with the current step.
extern "C" __global__ void towers_dropout_f32(i64 n, float keep, u64 seed, const u64* __restrict__ step_at,
                                              u64 offset, const float* __restrict__ x, float* __restrict__ y,
                                              float* __restrict__ mask) {
    const u64 step = *step_at;
    float scale = keep > 0.0f ? 1.0f / fminf(keep, 1.0f) : 0.0f;
    GRID_STRIDE(i, n) {
        u64 g = offset + (u64)i;
        u32 bits = philox_lane(seed, step, g >> 2, (int)(g & 3));
        float unit = (float)(bits >> 8) * (1.0f / 16777216.0f);
        float m = (keep >= 1.0f || unit < keep) ? scale : 0.0f;
        mask[i] = m;
        y[i] = x[i] * m;
    }
}
