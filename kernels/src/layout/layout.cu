// CUDA twins of kernels/src/layout: concat, split, slice, slice_grad.
//
// Along `axis` a shape is viewed as [outer, shape[axis], inner]. Concat and
// split run one launch per part (input of a concat, output of a split), each
// a strided copy of `outer` runs of `run = part[axis] * inner` elements at
// offset `off` (the parts before it) inside rows of `total = shape[axis] * inner`.
// Slices take the rank-4 padded shape, begin and size. Pure copies: results
// match the CPU bit for bit.

struct Dims4 {
    i64 d[4];
};

// out[o * total + off + j] = x[o * run + j] for o < outer, j < run.
extern "C" __global__ void towers_concat_part_f32(i64 outer, i64 run, i64 total, i64 off, const float* __restrict__ x,
                                                  float* __restrict__ out) {
    GRID_STRIDE(i, outer * run) {
        i64 o = i / run, j = i % run;
        out[o * total + off + j] = x[i];
    }
}

// y[o * run + j] = x[o * total + off + j] for o < outer, j < run.
extern "C" __global__ void towers_split_part_f32(i64 outer, i64 run, i64 total, i64 off, const float* __restrict__ x,
                                                 float* __restrict__ y) {
    GRID_STRIDE(i, outer * run) {
        i64 o = i / run, j = i % run;
        y[i] = x[o * total + off + j];
    }
}

// out (dims `size`) = the window of x (dims `shape`) starting at `begin`.
extern "C" __global__ void towers_slice_f32(i64 n, const float* __restrict__ x, float* __restrict__ out, Dims4 shape,
                                            Dims4 begin, Dims4 size) {
    GRID_STRIDE(i, n) {
        i64 rem = i, src = 0, stride = 1;
        for (int k = 3; k >= 0; --k) {
            i64 c = rem % size.d[k];
            rem /= size.d[k];
            src += (begin.d[k] + c) * stride;
            stride *= shape.d[k];
        }
        out[i] = x[src];
    }
}

// dx (dims `shape`, n elements) = dy inside the window, 0 outside.
extern "C" __global__ void towers_slice_grad_f32(i64 n, const float* __restrict__ dy, float* __restrict__ dx, Dims4 shape,
                                                 Dims4 begin, Dims4 size) {
    GRID_STRIDE(i, n) {
        i64 rem = i, src = 0, stride = 1;
        bool inside = true;
        for (int k = 3; k >= 0; --k) {
            i64 c = rem % shape.d[k] - begin.d[k];
            rem /= shape.d[k];
            inside = inside && c >= 0 && c < size.d[k];
            src += c * stride;
            stride *= size.d[k];
        }
        dx[i] = inside ? dy[src] : 0.0f;
    }
}
