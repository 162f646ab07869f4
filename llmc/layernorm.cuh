/*
 * LayerNorm over the last dim C (eps 1e-5, biased variance, as PyTorch).
 * Forward: one warp per row; mean and rstd kept in fp32 for the backward; 128-bit packs
 * of the row where C and the pointers allow (llmc/cuda_common.cuh).
 * Fused forward (--fused-kernels 1): residual = a + b (rounded to floatX, stored), then
 * the LayerNorm of that rounded residual, in one kernel: the same math and bits as
 * residual_forward followed by layernorm_forward, one pass over a and b fewer.
 * Backward: dinp is accumulated (+=) into the residual-stream gradient; dweight and
 * dbias are fp32 grad-buffer views, accumulated with a deterministic two-pass column
 * reduction (row chunks -> fp32 partials -> summed in chunk order), no atomics.
 */
#ifndef LLMC_LAYERNORM_CUH
#define LLMC_LAYERNORM_CUH

#include "llmc/cuda_common.cuh"
#include "llmc/residual.cuh"

// Row chunks of the column reductions: enough blocks to fill the GPU; the count
// depends only on the shape, so the summation order is fixed.
#define COLREDUCE_MAX_CHUNKS 256
#define COLREDUCE_ROWS_PER_CHUNK 64
static inline int colreduce_num_chunks(int rows) {
    int n = CEIL_DIV(rows, COLREDUCE_ROWS_PER_CHUNK);
    return n < COLREDUCE_MAX_CHUNKS ? n : COLREDUCE_MAX_CHUNKS;
}

// A pack of x at c (vec: 128-bit, x + c 16-byte aligned) or, without vec, element c alone in v[0].
__device__ __forceinline__ Packed128<floatX> load_pack_or_one(const floatX* x, int c, int vec) {
    if (vec) return load128(x + c);
    Packed128<floatX> p;
    p.v[0] = x[c];
    return p;
}
__device__ __forceinline__ void store_pack_or_one(floatX* x, int c, const Packed128<floatX>& p, int vec) {
    if (vec) store128(x + c, p);
    else x[c] = p.v[0];
}

// One row x (C floatX) by one warp: mean, rstd and the normalized output. The plain and
// the fused kernel both run this, so that they give the same bits. vec: C a multiple of
// the pack and x, o, weight, bias 16-byte aligned; each lane then takes every 32nd pack,
// else every 32nd element (the sums' orders differ between the two, within fp32 rounding).
__device__ __forceinline__ void layernorm_row(floatX* o, float* mean, float* rstd, const floatX* x,
                                              const floatX* weight, const floatX* bias, int C, int vec, int lane) {
    const int step = vec ? PACK_X : 1;
    float sum = 0.0f;
    for (int c = lane * step; c < C; c += WARP_SIZE * step) {
        Packed128<floatX> p = load_pack_or_one(x, c, vec);
        for (int k = 0; k < step; k++) sum += to_float(p.v[k]);
    }
    float m = warp_reduce_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * step; c < C; c += WARP_SIZE * step) {
        Packed128<floatX> p = load_pack_or_one(x, c, vec);
        for (int k = 0; k < step; k++) {
            float d = to_float(p.v[k]) - m;
            var += d * d;
        }
    }
    var = warp_reduce_sum(var) / C;
    float s = 1.0f / sqrtf(var + 1e-5f);
    for (int c = lane * step; c < C; c += WARP_SIZE * step) {
        Packed128<floatX> p = load_pack_or_one(x, c, vec), w = load_pack_or_one(weight, c, vec),
                          b = load_pack_or_one(bias, c, vec), y;
        for (int k = 0; k < step; k++) {
            y.v[k] = from_float<floatX>((to_float(p.v[k]) - m) * s * to_float(w.v[k]) + to_float(b.v[k]));
        }
        store_pack_or_one(o, c, y, vec);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
}

// Whether layernorm_row may take 128-bit packs of rows of C starting at these pointers.
static inline int layernorm_vec(const void* x, const void* out, const void* weight, const void* bias, int C) {
    return C % PACK_X == 0 && aligned16(x) && aligned16(out) && aligned16(weight) && aligned16(bias);
}

__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                                         const floatX* bias, int N, int C, int vec) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    layernorm_row(out + (size_t)row * C, mean + row, rstd + row, inp + (size_t)row * C, weight, bias, C, vec,
                  threadIdx.x % WARP_SIZE);
}

static void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int B, int T, int C, cudaStream_t stream) {
    int N = B * T, warps_per_block = 8;
    layernorm_forward_kernel<<<CEIL_DIV(N, warps_per_block), warps_per_block * WARP_SIZE, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, N, C, layernorm_vec(inp, out, weight, bias, C));
    cudaCheckLaunch();
}

// The residual add fused into the LayerNorm that reads it: residual = a + b (rounded to
// floatX and stored: the backward reads it), then the LayerNorm of that stored row, the
// same code as layernorm_forward on it (so the same bits). One warp per row; the row is
// re-read from where this warp just wrote it (L1/L2), after __syncwarp orders the writes.
__global__ void layernorm_fused_residual_forward_kernel(floatX* residual, floatX* out, float* mean, float* rstd,
                                                        const floatX* a, const floatX* b, const floatX* weight,
                                                        const floatX* bias, int N, int C, int vec_add, int vec) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    const int step = vec_add ? PACK_X : 1;
    for (int c = lane * step; c < C; c += WARP_SIZE * step) {
        Packed128<floatX> x = load_pack_or_one(a + base, c, vec_add), y = load_pack_or_one(b + base, c, vec_add), r;
        for (int k = 0; k < step; k++) r.v[k] = residual_add(x.v[k], y.v[k]);
        store_pack_or_one(residual + base, c, r, vec_add);
    }
    __syncwarp();
    layernorm_row(out + base, mean + row, rstd + row, residual + base, weight, bias, C, vec, lane);
}

static void layernorm_fused_residual_forward(floatX* residual, floatX* out, float* mean, float* rstd, const floatX* a,
                                             const floatX* b, const floatX* weight, const floatX* bias, int B, int T,
                                             int C, cudaStream_t stream) {
    int N = B * T, warps_per_block = 8;
    int vec_add = C % PACK_X == 0 && aligned16(residual) && aligned16(a) && aligned16(b);
    layernorm_fused_residual_forward_kernel<<<CEIL_DIV(N, warps_per_block), warps_per_block * WARP_SIZE, 0, stream>>>(
        residual, out, mean, rstd, a, b, weight, bias, N, C, vec_add, layernorm_vec(residual, out, weight, bias, C));
    cudaCheckLaunch();
}

// dinp += d(LN)/d(inp) . dout, one warp per row.
__global__ void layernorm_backward_input_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                                const floatX* weight, const float* mean, const float* rstd, int N,
                                                int C) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    const floatX* dy = dout + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float norm = (to_float(x[c]) - m) * s;
        float dnorm = to_float(weight[c]) * to_float(dy[c]);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean = warp_reduce_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_reduce_sum(dnorm_norm_mean) / C;
    floatX* dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float norm = (to_float(x[c]) - m) * s;
        float dnorm = to_float(weight[c]) * to_float(dy[c]);
        float g = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        dx[c] = from_float<floatX>(to_float(dx[c]) + g);
    }
}

// Pass 1: block (x: 32 columns, y: 8 row lanes) sums its chunk's rows for 32 columns.
__global__ void layernorm_backward_params_partial_kernel(float* partial_w, float* partial_b, const floatX* dout,
                                                         const floatX* inp, const float* mean, const float* rstd,
                                                         int N, int C, int rows_per_chunk) {
    __shared__ float sw[8][33], sb[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int chunk = blockIdx.y;
    int r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float accw = 0.0f, accb = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float dy = to_float(dout[(size_t)r * C + c]);
            float norm = (to_float(inp[(size_t)r * C + c]) - mean[r]) * rstd[r];
            accw += dy * norm;
            accb += dy;
        }
    }
    sw[threadIdx.y][threadIdx.x] = accw;
    sb[threadIdx.y][threadIdx.x] = accb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float w = 0.0f, b = 0.0f;
        for (int y = 0; y < 8; y++) {
            w += sw[y][threadIdx.x];
            b += sb[y][threadIdx.x];
        }
        partial_w[(size_t)chunk * C + c] = w;
        partial_b[(size_t)chunk * C + c] = b;
    }
}

// Pass 2: sum the chunks in order and accumulate into the fp32 grad views.
__global__ void layernorm_backward_params_final_kernel(float* dweight, float* dbias, const float* partial_w,
                                                       const float* partial_b, int num_chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float w = 0.0f, b = 0.0f;
    for (int k = 0; k < num_chunks; k++) {
        w += partial_w[(size_t)k * C + c];
        b += partial_b[(size_t)k * C + c];
    }
    dweight[c] += w;
    dbias[c] += b;
}

// scratch: at least 2 * colreduce_num_chunks(B*T) * C floats.
static void layernorm_backward(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int B,
                               int T, int C, cudaStream_t stream) {
    int N = B * T, warps_per_block = 8;
    layernorm_backward_input_kernel<<<CEIL_DIV(N, warps_per_block), warps_per_block * WARP_SIZE, 0, stream>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    cudaCheckLaunch();
    int chunks = colreduce_num_chunks(N);
    int rows_per_chunk = CEIL_DIV(N, chunks);
    float* partial_w = scratch;
    float* partial_b = scratch + (size_t)chunks * C;
    dim3 grid(CEIL_DIV(C, 32), chunks), block(32, 8);
    layernorm_backward_params_partial_kernel<<<grid, block, 0, stream>>>(partial_w, partial_b, dout, inp, mean, rstd,
                                                                         N, C, rows_per_chunk);
    cudaCheckLaunch();
    layernorm_backward_params_final_kernel<<<CEIL_DIV(C, 256), 256, 0, stream>>>(dweight, dbias, partial_w, partial_b,
                                                                                 chunks, C);
    cudaCheckLaunch();
}

#endif
