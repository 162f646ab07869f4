/*
 * LayerNorm over the last dim C (eps 1e-5, biased variance, as PyTorch).
 * Forward: one warp per row; mean and rstd kept in fp32 for the backward; 128-bit packs
 * of the row where C and the pointers allow (llmc/cuda_common.cuh), element by element
 * otherwise; the pack width is a template argument, so a pack never goes to local memory.
 * Fused forward (--fused-kernels 1): residual = a + b (rounded to floatX, stored), then
 * the LayerNorm of that rounded residual, in one kernel: the same math and bits as
 * residual_forward followed by layernorm_forward, one pass over a and b fewer.
 * Backward: dinp is accumulated (+=) into the residual-stream gradient (one warp per row,
 * packs as in the forward); dweight and dbias are fp32 grad-buffer views, accumulated with
 * a deterministic two-pass column reduction (row chunks -> fp32 partials -> summed in chunk
 * order), no atomics.
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

// One row x (C floatX) by one warp: mean, rstd and the normalized output. The plain and
// the fused kernel both run this, so that they give the same bits. STEP = PACK_X: C a
// multiple of the pack and x, o, weight, bias 16-byte aligned; each lane then takes every
// 32nd pack, else (STEP 1) every 32nd element (the sums' orders differ between the two,
// within fp32 rounding).
template <int STEP>
__device__ __forceinline__ void layernorm_row_by(floatX* o, float* mean, float* rstd, const floatX* x,
                                                 const floatX* weight, const floatX* bias, int C, int lane) {
    float sum = 0.0f;
    for (int c = lane * STEP; c < C; c += WARP_SIZE * STEP) {
        Packed128<floatX> p = load_pack_or_one<STEP>(x, c);
#pragma unroll
        for (int k = 0; k < STEP; k++) sum += to_float(p.v[k]);
    }
    float m = warp_reduce_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * STEP; c < C; c += WARP_SIZE * STEP) {
        Packed128<floatX> p = load_pack_or_one<STEP>(x, c);
#pragma unroll
        for (int k = 0; k < STEP; k++) {
            float d = to_float(p.v[k]) - m;
            var += d * d;
        }
    }
    var = warp_reduce_sum(var) / C;
    float s = 1.0f / sqrtf(var + 1e-5f);
    for (int c = lane * STEP; c < C; c += WARP_SIZE * STEP) {
        Packed128<floatX> p = load_pack_or_one<STEP>(x, c), w = load_pack_or_one<STEP>(weight, c),
                          b = load_pack_or_one<STEP>(bias, c), y;
#pragma unroll
        for (int k = 0; k < STEP; k++) {
            y.v[k] = from_float<floatX>((to_float(p.v[k]) - m) * s * to_float(w.v[k]) + to_float(b.v[k]));
        }
        store_pack_or_one<STEP>(o, c, y);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
}
// vec: layernorm_vec's answer for the row's pointers.
__device__ __forceinline__ void layernorm_row(floatX* o, float* mean, float* rstd, const floatX* x,
                                              const floatX* weight, const floatX* bias, int C, int vec, int lane) {
    if (vec) layernorm_row_by<PACK_X>(o, mean, rstd, x, weight, bias, C, lane);
    else layernorm_row_by<1>(o, mean, rstd, x, weight, bias, C, lane);
}

// Whether a row kernel may take 128-bit packs of rows of C starting at these four pointers.
static inline int layernorm_vec(const void* p0, const void* p1, const void* p2, const void* p3, int C) {
    return C % PACK_X == 0 && aligned16(p0) && aligned16(p1) && aligned16(p2) && aligned16(p3);
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

// residual = a + b over one row by one warp, STEP as layernorm_row_by's.
template <int STEP>
__device__ __forceinline__ void residual_row_by(floatX* residual, const floatX* a, const floatX* b, int C, int lane) {
    for (int c = lane * STEP; c < C; c += WARP_SIZE * STEP) {
        Packed128<floatX> x = load_pack_or_one<STEP>(a, c), y = load_pack_or_one<STEP>(b, c), r;
#pragma unroll
        for (int k = 0; k < STEP; k++) r.v[k] = residual_add(x.v[k], y.v[k]);
        store_pack_or_one<STEP>(residual, c, r);
    }
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
    if (vec_add) residual_row_by<PACK_X>(residual + base, a + base, b + base, C, lane);
    else residual_row_by<1>(residual + base, a + base, b + base, C, lane);
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

// dinp += d(LN)/d(inp) . dout for one row by one warp, STEP as layernorm_row_by's.
template <int STEP>
__device__ __forceinline__ void layernorm_backward_row_by(floatX* dx, const floatX* dy, const floatX* x,
                                                          const floatX* weight, float m, float s, int C, int lane) {
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane * STEP; c < C; c += WARP_SIZE * STEP) {
        Packed128<floatX> xp = load_pack_or_one<STEP>(x, c), wp = load_pack_or_one<STEP>(weight, c),
                          gp = load_pack_or_one<STEP>(dy, c);
#pragma unroll
        for (int k = 0; k < STEP; k++) {
            float norm = (to_float(xp.v[k]) - m) * s;
            float dnorm = to_float(wp.v[k]) * to_float(gp.v[k]);
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
    }
    dnorm_mean = warp_reduce_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_reduce_sum(dnorm_norm_mean) / C;
    for (int c = lane * STEP; c < C; c += WARP_SIZE * STEP) {
        Packed128<floatX> xp = load_pack_or_one<STEP>(x, c), wp = load_pack_or_one<STEP>(weight, c),
                          gp = load_pack_or_one<STEP>(dy, c), dp = load_pack_or_one<STEP>(dx, c);
#pragma unroll
        for (int k = 0; k < STEP; k++) {
            float norm = (to_float(xp.v[k]) - m) * s;
            float dnorm = to_float(wp.v[k]) * to_float(gp.v[k]);
            float g = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            dp.v[k] = from_float<floatX>(to_float(dp.v[k]) + g);
        }
        store_pack_or_one<STEP>(dx, c, dp);
    }
}

// One warp per row; vec: C a multiple of the pack and dinp, dout, inp, weight 16-byte aligned.
__global__ void layernorm_backward_input_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                                const floatX* weight, const float* mean, const float* rstd, int N,
                                                int C, int vec) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    if (vec) layernorm_backward_row_by<PACK_X>(dinp + base, dout + base, inp + base, weight, mean[row], rstd[row], C, lane);
    else layernorm_backward_row_by<1>(dinp + base, dout + base, inp + base, weight, mean[row], rstd[row], C, lane);
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
        dinp, dout, inp, weight, mean, rstd, N, C, layernorm_vec(dinp, dout, inp, weight, C));
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
