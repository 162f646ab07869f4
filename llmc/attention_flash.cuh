/*
 * Causal multi-head self-attention without (B,NH,T,T) buffers: tiled kernels with an online
 * softmax (the FlashAttention-2 scheme), reading q, k, v straight from qkv (B,T,3C) and
 * writing out (B,T,C) and dqkv (B,T,3C); llmc/attention.cuh is the naive reference.
 *
 *   forward   per (b, h, query tile of BR rows), key tiles of BC from 0 to the diagonal
 *             (tiles above it are skipped): S = scale q k^T (masked: key > query is -inf),
 *             m' = max(m, rowmax S), P = exp(S - m') rounded to floatX, l = l e^(m-m') +
 *             rowsum P, O = O e^(m-m') + P v; at the end out = O / l and
 *             lse = m + log l (fp32, (B,NH,T) per layer, kept for the backward).
 *   backward  D = rowsum(dout * out) (fp32, (B,NH,T)); P = exp(scale q k^T - lse)
 *             recomputed, dP = dout v^T, dS = P (dP - D) rounded to floatX;
 *             dv = P^T dout, dk = scale dS^T q (one kernel per key tile, looping over
 *             the query tiles from the diagonal on), dq = scale dS k (one kernel per query
 *             tile, looping over the key tiles up to the diagonal). Every output element
 *             is written by one thread of one block, its sums in a fixed order: no
 *             atomics, the same bits on every run.
 *   Costs: forward 2 products per tile pair (FLOPs 4 B NH T^2 hs / 2 with the skipped
 *   half), backward 5 plus the recomputed S and dP of the dq kernel (7 in all). Memory:
 *   the lse (L,B,NH,T) fp32 and a (B,NH,T) fp32 D; no scores, probabilities or permuted
 *   copies.
 *
 * Math in the two builds, sharing the tiles and the code around the products:
 *   BF16: the products run on tensor cores through WMMA (m16n16k16, bf16 operands, fp32
 *         accumulators; dev/cuda_cpu/include/mma.h on the CPU layer). The fragments'
 *         element mapping is unspecified, so S goes to shared memory for the per-row
 *         work, and each P v tile goes through shared memory into the rescaled O, which
 *         each lane keeps in registers for one row (lane >> 1) and 8 of every 16 columns.
 *   FP32: the same products as scalar fp32 loops (no TF32), each of the warp's 16 x 16
 *         outputs summed in k order by one lane: the tight oracle build.
 * Precision: all sums fp32. Rounded to floatX: P before P v and dS before dS^T q, dS k
 * (as the naive path rounds att and dpreatt), the outputs. l sums the rounded P, so the
 * weights applied to v sum to 1 to fp32 accuracy.
 *
 * Limits: head size hs = C / NH a multiple of 16 up to 128 (flash_attention_check tells
 * the user to pass --attention naive otherwise); any T >= 1 (partial tiles are zero-
 * filled and masked). Shared memory: static, under the 48 KiB a kernel may declare
 * (largest at hs 128: forward 46 KiB, backward 46.3 KiB in BF16, 38.1 KiB in FP32), so
 * no cudaFuncSetAttribute is needed on any GPU; the tiles (BF16: BR 64 x BC 32 forward,
 * 32 x 32 backward, 4 warps; FP32: 32 x 16 and 16 x 16, 2 warps) are sized to fit it.
 */
#ifndef LLMC_ATTENTION_FLASH_CUH
#define LLMC_ATTENTION_FLASH_CUH

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "llmc/cuda_common.cuh"
#if FLOATX_IS_BF16
#include <mma.h>
#endif

#define FLASH_HS_MAX 128
#if FLOATX_IS_BF16
#define FLASH_WARPS 4
#define FLASH_KEY_TILE 32  // forward BC
#define FLASH_BWD_TILE 32  // backward query and key tiles
#else
#define FLASH_WARPS 2
#define FLASH_KEY_TILE 16
#define FLASH_BWD_TILE 16
#endif
#define FLASH_THREADS (FLASH_WARPS * WARP_SIZE)
#define FLASH_QUERY_TILE (16 * FLASH_WARPS)  // forward BR: 16 rows per warp
#define FLASH_LD_MAX (FLASH_HS_MAX + 8)      // row stride of q/k/v tiles: hs + 8 (16 bytes more)
// Output tiles of 16 x 16 each warp keeps in the backward (keys or queries x hs).
#define FLASH_BWD_ACC ((FLASH_BWD_TILE / 16) * (FLASH_HS_MAX / 16) / FLASH_WARPS)

// ---- one warp's 16 x 16 fp32 product tile ----------------------------------------------------
// acc += op(A) op(B) with A 16 x k and B k x 16 in shared memory (k a multiple of 16):
// A_T: A is stored transposed (element (r, kk) at A[kk * lda + r]), else at A[r * lda + kk];
// B_T: element (kk, c) at B[c * ldb + kk], else at B[kk * ldb + c]. Pointers 32-byte
// aligned, leading dimensions multiples of 16 bytes (WMMA's rules; kept in both builds).
#if FLOATX_IS_BF16
struct FlashAcc {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f;
};
__device__ __forceinline__ void flash_acc_zero(FlashAcc& a) { nvcuda::wmma::fill_fragment(a.f, 0.0f); }
__device__ __forceinline__ void flash_acc_scale(FlashAcc& a, float s) {
    for (int i = 0; i < a.f.num_elements; i++) a.f.x[i] *= s;
}
template <bool A_T, bool B_T>
__device__ __forceinline__ void flash_mma(FlashAcc& acc, const floatX* A, int lda, const floatX* Bm, int ldb, int k) {
    using namespace nvcuda;
    typedef typename std::conditional<A_T, wmma::col_major, wmma::row_major>::type LA;
    typedef typename std::conditional<B_T, wmma::col_major, wmma::row_major>::type LB;
    for (int kk = 0; kk < k; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, floatX, LA> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, LB> b;
        wmma::load_matrix_sync(a, A_T ? A + (size_t)kk * lda : A + kk, lda);
        wmma::load_matrix_sync(b, B_T ? Bm + kk : Bm + (size_t)kk * ldb, ldb);
        wmma::mma_sync(acc.f, a, b, acc.f);
    }
}
// Row-major 16 x 16 fp32 at dst (leading dimension ld); the warp's lanes must __syncwarp()
// before reading it.
__device__ __forceinline__ void flash_acc_store(float* dst, int ld, const FlashAcc& a) {
    nvcuda::wmma::store_matrix_sync(dst, a.f, ld, nvcuda::wmma::mem_row_major);
}
#else
// Lane l holds row l >> 1, columns (l & 1) * 8 + e, e = 0..7.
struct FlashAcc {
    float x[8];
};
__device__ __forceinline__ void flash_acc_zero(FlashAcc& a) {
    for (int e = 0; e < 8; e++) a.x[e] = 0.0f;
}
__device__ __forceinline__ void flash_acc_scale(FlashAcc& a, float s) {
    for (int e = 0; e < 8; e++) a.x[e] *= s;
}
template <bool A_T, bool B_T>
__device__ __forceinline__ void flash_mma(FlashAcc& acc, const floatX* A, int lda, const floatX* Bm, int ldb, int k) {
    int lane = threadIdx.x % WARP_SIZE, r = lane >> 1, c0 = (lane & 1) * 8;
    for (int e = 0; e < 8; e++) {
        int c = c0 + e;
        float s = acc.x[e];
        for (int kk = 0; kk < k; kk++) {
            float a = A_T ? A[(size_t)kk * lda + r] : A[(size_t)r * lda + kk];
            float b = B_T ? Bm[(size_t)c * ldb + kk] : Bm[(size_t)kk * ldb + c];
            s += a * b;
        }
        acc.x[e] = s;
    }
}
__device__ __forceinline__ void flash_acc_store(float* dst, int ld, const FlashAcc& a) {
    int lane = threadIdx.x % WARP_SIZE, r = lane >> 1, c0 = (lane & 1) * 8;
    for (int e = 0; e < 8; e++) dst[r * ld + c0 + e] = a.x[e];
}
#endif

// ---- tiles in shared memory ----------------------------------------------------------------------
// 16 bytes (8 bf16 / 4 floats); through memcpy on the CPU layer (g++ would otherwise see a
// floatX array accessed as uint4, which C++'s aliasing rules do not allow).
__device__ __forceinline__ void flash_copy16(void* dst, const void* src) {
#ifdef __CUDA_CPU__
    memcpy(dst, src, 16);
#else
    *(uint4*)dst = *(const uint4*)src;
#endif
}

// Rows t0..t0+R-1 (batch b) of a (B,T,row_stride) tensor, columns col0..col0+hs-1, into
// dst (R x ld), rows at or past T zero: q, k, v of head h are columns h hs, C + h hs and
// 2C + h hs of qkv (row_stride 3C), dout's columns h hs (row_stride C). All threads of the
// block take part.
__device__ __forceinline__ void flash_load_rows(floatX* dst, int ld, const floatX* src, int row_stride, int col0,
                                                int b, int t0, int R, int T, int hs) {
    const int V = 16 / (int)sizeof(floatX), per_row = hs / V;
    for (int i = threadIdx.x; i < R * per_row; i += blockDim.x) {
        int r = i / per_row, c = (i % per_row) * V, t = t0 + r;
        floatX* d = dst + (size_t)r * ld + c;
        if (t < T) flash_copy16(d, src + ((size_t)b * T + t) * row_stride + col0 + c);
        else memset(d, 0, 16);
    }
}

// Stores this warp's 16 x 16 tile acc (times scale) as floatX rows t0.. (< T), columns
// col0..col0+15 of part `part` of the (B,T,3C) tensor dqkv, through stage (16 x 16 fp32).
__device__ __forceinline__ void flash_store_tile(floatX* dqkv, float* stage, const FlashAcc& acc, int b, int t0,
                                                 int T, int C, int part, int col) {
    int lane = threadIdx.x % WARP_SIZE, r = lane >> 1, c0 = (lane & 1) * 8;
    flash_acc_store(stage, 16, acc);
    __syncwarp();
    if (t0 + r < T) {
        floatX* d = dqkv + ((size_t)b * T + t0 + r) * 3 * C + (size_t)part * C + col + c0;
        for (int e = 0; e < 8; e++) d[e] = from_float<floatX>(stage[r * 16 + c0 + e]);
    }
    __syncwarp();  // stage is reused by the next tile
}

// ---- forward --------------------------------------------------------------------------------------
__global__ void __launch_bounds__(FLASH_THREADS)
    flash_attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, int T, int NH, int hs, float scale) {
    const int BR = FLASH_QUERY_TILE, BC = FLASH_KEY_TILE, C = NH * hs, ld = hs + 8;
    __shared__ __align__(32) floatX q_s[FLASH_QUERY_TILE * FLASH_LD_MAX];
    __shared__ __align__(32) floatX k_s[FLASH_KEY_TILE * FLASH_LD_MAX];
    __shared__ __align__(32) floatX v_s[FLASH_KEY_TILE * FLASH_LD_MAX];
    __shared__ __align__(32) float s_s[FLASH_QUERY_TILE * FLASH_KEY_TILE];
    __shared__ __align__(32) floatX p_s[FLASH_QUERY_TILE * FLASH_KEY_TILE];
    const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    const int h = blockIdx.y, b = blockIdx.z, q0 = qt * BR;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = 16 * warp + (lane >> 1), half = lane & 1, tq = q0 + row;  // this lane's row
    const int chunks = hs / 16;
    float* s_warp = s_s + 16 * warp * BC;  // the warp's rows of S, then its P v stage
    flash_load_rows(q_s, ld, qkv, 3 * C, h * hs, b, q0, BR, T, hs);

    float m = -INFINITY, l = 0.0f, o[FLASH_HS_MAX / 2];
#pragma unroll
    for (int i = 0; i < FLASH_HS_MAX / 2; i++) o[i] = 0.0f;
    const int last_tile = min(T - 1, q0 + BR - 1) / BC;
    for (int kt = 0; kt <= last_tile; kt++) {
        const int k0 = kt * BC;
        __syncthreads();  // the previous tile's k_s / v_s are no longer read
        flash_load_rows(k_s, ld, qkv, 3 * C, C + h * hs, b, k0, BC, T, hs);
        flash_load_rows(v_s, ld, qkv, 3 * C, 2 * C + h * hs, b, k0, BC, T, hs);
        __syncthreads();
        for (int j = 0; j < BC / 16; j++) {
            FlashAcc acc;
            flash_acc_zero(acc);
            flash_mma<false, true>(acc, q_s + 16 * warp * ld, ld, k_s + 16 * j * ld, ld, hs);
            flash_acc_store(s_warp + 16 * j, BC, acc);
        }
        __syncwarp();
        // Online softmax of this lane's half of its row.
        float* srow = s_s + row * BC;
        float mx = -INFINITY;
        for (int c = half * (BC / 2); c < (half + 1) * (BC / 2); c++) {
            int tk = k0 + c;
            float x = tk <= tq && tk < T ? srow[c] * scale : -INFINITY;
            srow[c] = x;
            mx = fmaxf(mx, x);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        // Key 0 is in tile 0 and never masked, so m_new is finite from the first tile on.
        float m_new = fmaxf(m, mx), alpha = expf(m - m_new), sum = 0.0f;
        for (int c = half * (BC / 2); c < (half + 1) * (BC / 2); c++) {
            floatX p = from_float<floatX>(expf(srow[c] - m_new));
            p_s[row * BC + c] = p;
            sum += to_float(p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        __syncwarp();
        // O = O alpha + P v, 16 columns at a time through the warp's stage.
#pragma unroll
        for (int n = 0; n < FLASH_HS_MAX / 16; n++) {
            if (n >= chunks) break;
            FlashAcc acc;
            flash_acc_zero(acc);
            flash_mma<false, false>(acc, p_s + 16 * warp * BC, BC, v_s + 16 * n, ld, BC);
            flash_acc_store(s_warp, 16, acc);
            __syncwarp();
#pragma unroll
            for (int e = 0; e < 8; e++) o[n * 8 + e] = o[n * 8 + e] * alpha + s_warp[(lane >> 1) * 16 + half * 8 + e];
            __syncwarp();
        }
    }
    if (tq < T) {
        float inv = 1.0f / l;
        floatX* dst = out + ((size_t)b * T + tq) * C + (size_t)h * hs + half * 8;
#pragma unroll
        for (int n = 0; n < FLASH_HS_MAX / 16; n++) {
            if (n >= chunks) break;
#pragma unroll
            for (int e = 0; e < 8; e++) dst[n * 16 + e] = from_float<floatX>(o[n * 8 + e] * inv);
        }
        if (half == 0) lse[((size_t)b * NH + h) * T + tq] = m + logf(l);
    }
}

// ---- backward ------------------------------------------------------------------------------------
// D[b,h,t] = sum_d dout[b,t,h,d] out[b,t,h,d], one warp per (b, t, h).
__global__ void flash_attention_rowdot_kernel(float* D, const floatX* out, const floatX* dout, int B, int T, int NH,
                                              int hs) {
    int idx = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (idx >= B * T * NH) return;
    int h = idx % NH, t = (idx / NH) % T, b = idx / (NH * T);
    size_t at = ((size_t)b * T + t) * NH * hs + (size_t)h * hs;
    float s = 0.0f;
    for (int d = lane; d < hs; d += WARP_SIZE) s += to_float(dout[at + d]) * to_float(out[at + d]);
    s = warp_reduce_sum(s);
    if (lane == 0) D[((size_t)b * NH + h) * T + t] = s;
}

// The shared part of both backward kernels: for query rows q0.. and key rows k0.. (tiles
// of BT, already in shared memory), S = q k^T and dP = dout v^T into s_s and dp_s, then
// P = exp(scale S - lse) (0 where masked or past T) and dS = P (dP - D) as floatX.
__device__ __forceinline__ void flash_backward_scores(floatX* p_s, floatX* ds_s, float* s_s, float* dp_s,
                                                      const floatX* q_s, const floatX* do_s, const floatX* k_s,
                                                      const floatX* v_s, const float* lse_s, const float* d_s, int ld,
                                                      int q0, int k0, int T, int hs, float scale) {
    const int BT = FLASH_BWD_TILE, tiles = (BT / 16) * (BT / 16), warp = threadIdx.x / WARP_SIZE;
    for (int t = warp; t < tiles; t += FLASH_WARPS) {
        int i = t / (BT / 16), j = t % (BT / 16);
        FlashAcc acc;
        flash_acc_zero(acc);
        flash_mma<false, true>(acc, q_s + 16 * i * ld, ld, k_s + 16 * j * ld, ld, hs);
        flash_acc_store(s_s + 16 * i * BT + 16 * j, BT, acc);
        flash_acc_zero(acc);
        flash_mma<false, true>(acc, do_s + 16 * i * ld, ld, v_s + 16 * j * ld, ld, hs);
        flash_acc_store(dp_s + 16 * i * BT + 16 * j, BT, acc);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < BT * BT; idx += blockDim.x) {
        int r = idx / BT, c = idx % BT, tq = q0 + r, tk = k0 + c;
        float p = tq < T && tk <= tq ? expf(s_s[idx] * scale - lse_s[r]) : 0.0f;
        p_s[idx] = from_float<floatX>(p);
        ds_s[idx] = from_float<floatX>(p * (dp_s[idx] - d_s[r]));
    }
    __syncthreads();
}

// lse and D of rows q0..q0+BT-1 into shared memory (0 past T).
__device__ __forceinline__ void flash_load_row_stats(float* lse_s, float* d_s, const float* lse, const float* D,
                                                     size_t bh, int q0, int T) {
    for (int r = threadIdx.x; r < FLASH_BWD_TILE; r += blockDim.x) {
        int t = q0 + r;
        lse_s[r] = t < T ? lse[bh * T + t] : 0.0f;
        d_s[r] = t < T ? D[bh * T + t] : 0.0f;
    }
}

// Writes this warp's output tiles acc[a] (tile warp + a WARPS of the (rows x hs) block at
// rows row0.., 16 x 16 each, `chunks` = hs / 16 per row of tiles), times scale, to part
// `part` of dqkv at columns col0.., through the warp's 16 x 16 stage.
__device__ __forceinline__ void flash_store_accs(floatX* dqkv, float* stage, FlashAcc* acc, float scale, int b,
                                                 int row0, int T, int C, int part, int col0, int out_tiles,
                                                 int chunks) {
    int warp = threadIdx.x / WARP_SIZE;
#pragma unroll
    for (int a = 0; a < FLASH_BWD_ACC; a++) {
        int t = warp + a * FLASH_WARPS;
        if (t >= out_tiles) break;
        int i = t / chunks, j = t % chunks;
        if (scale != 1.0f) flash_acc_scale(acc[a], scale);
        flash_store_tile(dqkv, stage, acc[a], b, row0 + 16 * i, T, C, part, col0 + 16 * j);
    }
}

// The shared memory of both backward kernels.
#define FLASH_BACKWARD_SHARED                                                  \
    __shared__ __align__(32) floatX q_s[FLASH_BWD_TILE * FLASH_LD_MAX];       \
    __shared__ __align__(32) floatX do_s[FLASH_BWD_TILE * FLASH_LD_MAX];      \
    __shared__ __align__(32) floatX k_s[FLASH_BWD_TILE * FLASH_LD_MAX];       \
    __shared__ __align__(32) floatX v_s[FLASH_BWD_TILE * FLASH_LD_MAX];       \
    __shared__ __align__(32) float s_s[2 * FLASH_BWD_TILE * FLASH_BWD_TILE];  \
    __shared__ __align__(32) floatX p_s[FLASH_BWD_TILE * FLASH_BWD_TILE];     \
    __shared__ __align__(32) floatX ds_s[FLASH_BWD_TILE * FLASH_BWD_TILE];    \
    __shared__ float lse_s[FLASH_BWD_TILE];                                    \
    __shared__ float d_s[FLASH_BWD_TILE];                                      \
    float* dp_s = s_s + FLASH_BWD_TILE * FLASH_BWD_TILE;

// dk and dv of one key tile (blockIdx.x), over the query tiles from the diagonal on.
__global__ void __launch_bounds__(FLASH_THREADS)
    flash_attention_backward_kv_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                       const float* D, int T, int NH, int hs, float scale) {
    const int BT = FLASH_BWD_TILE, C = NH * hs, ld = hs + 8, chunks = hs / 16;
    FLASH_BACKWARD_SHARED
    const int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, k0 = kt * BT, warp = threadIdx.x / WARP_SIZE;
    const size_t bh = (size_t)b * NH + h;
    const int out_tiles = (BT / 16) * chunks;  // 16 x 16 tiles of (keys x hs), warp w has w, w + WARPS, ...
    flash_load_rows(k_s, ld, qkv, 3 * C, C + h * hs, b, k0, BT, T, hs);
    flash_load_rows(v_s, ld, qkv, 3 * C, 2 * C + h * hs, b, k0, BT, T, hs);
    FlashAcc dk[FLASH_BWD_ACC], dv[FLASH_BWD_ACC];
#pragma unroll
    for (int a = 0; a < FLASH_BWD_ACC; a++) {
        flash_acc_zero(dk[a]);
        flash_acc_zero(dv[a]);
    }
    for (int qt = kt; qt * BT < T; qt++) {
        const int q0 = qt * BT;
        __syncthreads();  // the previous query tile is no longer read
        flash_load_rows(q_s, ld, qkv, 3 * C, h * hs, b, q0, BT, T, hs);
        flash_load_rows(do_s, ld, dout, C, h * hs, b, q0, BT, T, hs);
        flash_load_row_stats(lse_s, d_s, lse, D, bh, q0, T);
        __syncthreads();
        flash_backward_scores(p_s, ds_s, s_s, dp_s, q_s, do_s, k_s, v_s, lse_s, d_s, ld, q0, k0, T, hs, scale);
#pragma unroll
        for (int a = 0; a < FLASH_BWD_ACC; a++) {
            int t = warp + a * FLASH_WARPS;
            if (t >= out_tiles) break;
            int i = t / chunks, j = t % chunks;
            flash_mma<true, false>(dv[a], p_s + 16 * i, BT, do_s + 16 * j, ld, BT);   // P^T dout
            flash_mma<true, false>(dk[a], ds_s + 16 * i, BT, q_s + 16 * j, ld, BT);   // dS^T q
        }
    }
    __syncthreads();  // s_s becomes the warps' stages
    flash_store_accs(dqkv, s_s + warp * 256, dk, scale, b, k0, T, C, 1, h * hs, out_tiles, chunks);
    flash_store_accs(dqkv, s_s + warp * 256, dv, 1.0f, b, k0, T, C, 2, h * hs, out_tiles, chunks);
}

// dq of one query tile, over the key tiles up to the diagonal.
__global__ void __launch_bounds__(FLASH_THREADS)
    flash_attention_backward_q_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                      const float* D, int T, int NH, int hs, float scale) {
    const int BT = FLASH_BWD_TILE, C = NH * hs, ld = hs + 8, chunks = hs / 16;
    FLASH_BACKWARD_SHARED
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, q0 = qt * BT;
    const int warp = threadIdx.x / WARP_SIZE;
    const size_t bh = (size_t)b * NH + h;
    const int out_tiles = (BT / 16) * chunks;
    flash_load_rows(q_s, ld, qkv, 3 * C, h * hs, b, q0, BT, T, hs);
    flash_load_rows(do_s, ld, dout, C, h * hs, b, q0, BT, T, hs);
    flash_load_row_stats(lse_s, d_s, lse, D, bh, q0, T);
    FlashAcc dq[FLASH_BWD_ACC];
#pragma unroll
    for (int a = 0; a < FLASH_BWD_ACC; a++) flash_acc_zero(dq[a]);
    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * BT;
        __syncthreads();
        flash_load_rows(k_s, ld, qkv, 3 * C, C + h * hs, b, k0, BT, T, hs);
        flash_load_rows(v_s, ld, qkv, 3 * C, 2 * C + h * hs, b, k0, BT, T, hs);
        __syncthreads();
        flash_backward_scores(p_s, ds_s, s_s, dp_s, q_s, do_s, k_s, v_s, lse_s, d_s, ld, q0, k0, T, hs, scale);
#pragma unroll
        for (int a = 0; a < FLASH_BWD_ACC; a++) {
            int t = warp + a * FLASH_WARPS;
            if (t >= out_tiles) break;
            int i = t / chunks, j = t % chunks;
            flash_mma<false, false>(dq[a], ds_s + 16 * i * BT, BT, k_s + 16 * j, ld, BT);  // dS k
        }
    }
    __syncthreads();  // s_s becomes the warps' stages
    flash_store_accs(dqkv, s_s + warp * 256, dq, scale, b, q0, T, C, 0, h * hs, out_tiles, chunks);
}

// ---- host side -----------------------------------------------------------------------------------
static inline bool flash_attention_supported(int C, int NH) {
    int hs = NH > 0 ? C / NH : 0;
    return NH > 0 && C % NH == 0 && hs % 16 == 0 && hs >= 16 && hs <= FLASH_HS_MAX;
}
// Ends with one message where the model's head size is not one the kernels handle.
static inline void flash_attention_check(int C, int NH) {
    if (!flash_attention_supported(C, NH)) {
        fatal("--attention flash: head size %d (channels %d / heads %d) must be a multiple of 16 up to %d; "
              "pass --attention naive", NH > 0 ? C / NH : 0, C, NH, FLASH_HS_MAX);
    }
}
static inline void flash_check_aligned(const void* p, const char* what) {
    if ((uintptr_t)p % 16 != 0) fatal("flash attention: %s (%p) is not 16-byte aligned", what, p);
}

// out (B,T,C) and lse (B,NH,T) from qkv (B,T,3C).
static void attention_flash_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                    cudaStream_t stream) {
    flash_attention_check(C, NH);
    flash_check_aligned(out, "out");
    flash_check_aligned(qkv, "qkv");
    int hs = C / NH;
    dim3 grid(CEIL_DIV(T, FLASH_QUERY_TILE), NH, B);
    flash_attention_forward_kernel<<<grid, FLASH_THREADS, 0, stream>>>(out, lse, qkv, T, NH, hs,
                                                                        1.0f / sqrtf((float)hs));
    cudaCheckLaunch();
}

// dqkv (B,T,3C) overwritten from dout (B,T,C), the forward's out, qkv and lse; D is (B,NH,T)
// fp32 scratch.
static void attention_flash_backward(floatX* dqkv, float* D, const floatX* dout, const floatX* out, const floatX* qkv,
                                     const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    flash_attention_check(C, NH);
    flash_check_aligned(dqkv, "dqkv");
    flash_check_aligned(dout, "dout");
    flash_check_aligned(qkv, "qkv");
    int hs = C / NH, rows = B * T * NH;
    float scale = 1.0f / sqrtf((float)hs);
    flash_attention_rowdot_kernel<<<CEIL_DIV(rows, 8), 256, 0, stream>>>(D, out, dout, B, T, NH, hs);
    cudaCheckLaunch();
    dim3 grid(CEIL_DIV(T, FLASH_BWD_TILE), NH, B);
    flash_attention_backward_kv_kernel<<<grid, FLASH_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, D, T, NH, hs, scale);
    cudaCheckLaunch();
    flash_attention_backward_q_kernel<<<grid, FLASH_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, D, T, NH, hs, scale);
    cudaCheckLaunch();
}

#endif
