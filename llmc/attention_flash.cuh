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
 *         accumulators). The fragments'
 *         element mapping is unspecified, so S goes to shared memory for the per-row
 *         work, and each P v tile goes through shared memory into the rescaled O, which
 *         each lane keeps in registers for one row (lane >> 1) and 8 of every 16 columns.
 *   FP32: the same products as scalar fp32 loops (no TF32), each of the warp's 16 x 16
 *         outputs summed in k order by one lane: the tight oracle build.
 * Precision: all sums fp32. Rounded to floatX: P before P v and dS before dS^T q, dS k
 * (as the naive path rounds att and dpreatt), the outputs. l sums the rounded P, so the
 * weights applied to v sum to 1 to fp32 accuracy.
 *
 * Limits: head size hs = C / NH a multiple of 16 up to 128 (flash_attention_supported; the
 * trainer refuses another before it builds the model); any T >= 1 (partial tiles are zero-
 * filled and masked). Shared memory: static, under the 48 KiB (49,152 B) a kernel may
 * declare (FlashForwardSmem, FlashBackwardSmem; largest at hs 128: forward 35,328 B in BF16
 * and 40,960 B in FP32, backward 45,312 B and 38,016 B), so no cudaFuncSetAttribute is
 * needed on any GPU; the tiles (BF16: BR 64 x BC 32 forward, BC 16 above hs 64, 32 x 32
 * backward, 4 warps; FP32: 32 x 16 and 16 x 16, 2 warps) are sized to fit it.
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
#define FLASH_HS_SMALL 64  // head sizes up to this run the kernels' smaller instance (every GPT-2: 64)
#if FLOATX_IS_BF16
#define FLASH_WARPS 4
#define FLASH_KEY_TILE 32  // forward BC
#define FLASH_BWD_TILE 32  // backward query and key tiles
#else
#define FLASH_WARPS 2
#define FLASH_KEY_TILE 16
#define FLASH_BWD_TILE 16
#endif
// The block of every flash kernel: their __launch_bounds__ and their launches both use it.
#define FLASH_THREADS (FLASH_WARPS * WARP_SIZE)
#define FLASH_QUERY_TILE (16 * FLASH_WARPS)  // forward BR: 16 rows per warp
// Row stride (elements) of the fp32 scores, the stages and the floatX P and dS (header comment).
#define FLASH_SCORE_LD (FLASH_KEY_TILE + 8)
static_assert(FLASH_KEY_TILE == FLASH_BWD_TILE, "one score stride serves the forward and the backward");
// Output tiles of 16 x 16 each warp keeps in the backward (keys or queries x HS).
#define FLASH_BWD_ACC(HS) ((FLASH_BWD_TILE / 16) * ((HS) / 16) / FLASH_WARPS)

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
template <bool B_T>
__device__ __forceinline__ void flash_mma_b(FlashAcc& acc,
                                            const nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, floatX,
                                                                         nvcuda::wmma::row_major>& a,
                                            const floatX* Bm, int ldb) {
    using namespace nvcuda;
    typedef typename std::conditional<B_T, wmma::col_major, wmma::row_major>::type LB;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, LB> b;
    wmma::load_matrix_sync(b, Bm, ldb);
    wmma::mma_sync(acc.f, a, b, acc.f);
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
// A warp's 16 rows of a left operand (16 x k, k <= KMAX), loaded into registers once and
// multiplied by several B tiles: the forward's P (q is read from shared memory per tile).
template <int KMAX>
struct FlashRows {
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, floatX, nvcuda::wmma::row_major> f[KMAX / 16];
    __device__ __forceinline__ void load(const floatX* A, int lda, int k) {
#pragma unroll
        for (int i = 0; i < KMAX / 16; i++) {
            if (16 * i >= k) break;
            nvcuda::wmma::load_matrix_sync(f[i], A + 16 * i, lda);
        }
    }
    template <bool B_T>
    __device__ __forceinline__ void mma(FlashAcc& acc, const floatX* Bm, int ldb, int k) const {
#pragma unroll
        for (int i = 0; i < KMAX / 16; i++) {
            if (16 * i >= k) break;
            flash_mma_b<B_T>(acc, f[i], B_T ? Bm + 16 * i : Bm + (size_t)16 * i * ldb, ldb);
        }
    }
};
// The 16 x 16 fp32 tile at dst (leading dimension ld); the warp's lanes must __syncwarp()
// before reading it.
__device__ __forceinline__ void flash_acc_store(float* dst, int ld, const FlashAcc& a) {
    nvcuda::wmma::store_matrix_sync(dst, a.f, ld, nvcuda::wmma::mem_row_major);
}
// This lane's 8 values of the tile: row lane >> 1, columns 8 (lane & 1) + e. The fragment's
// mapping is unspecified, so through the warp's stage (16 x 16 fp32, ld FLASH_SCORE_LD).
__device__ __forceinline__ void flash_acc_rows(float y[8], const FlashAcc& acc, float* stage, int ld) {
    const int lane = threadIdx.x % WARP_SIZE, half = lane & 1;
    flash_acc_store(stage, ld, acc);
    __syncwarp();
    const float* src = stage + (lane >> 1) * ld + 8 * half;
    // The two halves take their quads in opposite orders: no bank twice (header comment).
    Packed128<float> first = load128(src + 4 * half), second = load128(src + 4 * (1 - half));
#pragma unroll
    for (int e = 0; e < 4; e++) {
        y[e] = half ? second.v[e] : first.v[e];
        y[4 + e] = half ? first.v[e] : second.v[e];
    }
    __syncwarp();  // the stage is reused by the next tile
}
#else
// Lane l holds row l >> 1, columns (l & 1) * 8 + e, e = 0..7; each sum in k order.
struct FlashAcc {
    float x[8];
};
__device__ __forceinline__ void flash_acc_zero(FlashAcc& a) {
#pragma unroll
    for (int e = 0; e < 8; e++) a.x[e] = 0.0f;
}
// 16 bytes at a time: A rows (not transposed) and B_T's rows as 4 k, B rows (not B_T) as 4
// columns; a quarter-warp (one phase of a 16-byte access) never meets a bank twice: A's 4
// rows, and B_T's rows which the two halves of the warp take 9 (then 7) apart (header
// comment). Each sum in k order.
template <bool A_T, bool B_T>
__device__ __forceinline__ void flash_mma(FlashAcc& acc, const floatX* A, int lda, const floatX* Bm, int ldb, int k) {
    const int lane = threadIdx.x % WARP_SIZE, r = lane >> 1, half = lane & 1;
    for (int kk = 0; kk < k; kk += 4) {
        float a[4];
        if (A_T) {
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = A[(size_t)(kk + i) * lda + r];
        } else {
            Packed128<float> p = load128(A + (size_t)r * lda + kk);
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = p.v[i];
        }
        if (B_T) {
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                Packed128<float> first = load128(Bm + (size_t)(8 * half + e + half) * ldb + kk);
                Packed128<float> second = load128(Bm + (size_t)(8 * half + e + 1 - half) * ldb + kk);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    acc.x[e] += a[i] * (half ? second.v[i] : first.v[i]);
                    acc.x[e + 1] += a[i] * (half ? first.v[i] : second.v[i]);
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const floatX* brow = Bm + (size_t)(kk + i) * ldb + 8 * half;
                Packed128<float> b0 = load128(brow), b1 = load128(brow + 4);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    acc.x[e] += a[i] * b0.v[e];
                    acc.x[4 + e] += a[i] * b1.v[e];
                }
            }
        }
    }
}
// The left operand stays in shared memory (the scalar products read it there).
template <int KMAX>
struct FlashRows {
    const floatX* a;
    int lda;
    __device__ __forceinline__ void load(const floatX* A, int ld, int k) {
        a = A;
        lda = ld;
    }
    template <bool B_T>
    __device__ __forceinline__ void mma(FlashAcc& acc, const floatX* Bm, int ldb, int k) const {
        flash_mma<false, B_T>(acc, a, lda, Bm, ldb, k);
    }
};
// Quads in the order (q ^ half), as flash_acc_rows reads them.
__device__ __forceinline__ void flash_acc_store(float* dst, int ld, const FlashAcc& a) {
    const int lane = threadIdx.x % WARP_SIZE, half = lane & 1;
    float* d = dst + (lane >> 1) * ld + 8 * half;
    Packed128<float> first, second;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        first.v[e] = half ? a.x[4 + e] : a.x[e];
        second.v[e] = half ? a.x[e] : a.x[4 + e];
    }
    store128(d + 4 * half, first);
    store128(d + 4 * (1 - half), second);
}
__device__ __forceinline__ void flash_acc_rows(float y[8], const FlashAcc& acc, float* stage, int ld) {
#pragma unroll
    for (int e = 0; e < 8; e++) y[e] = acc.x[e];
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

// y[0..8) times scale as 8 floatX at dst (16-byte aligned): one 128-bit store in bf16, two in fp32.
__device__ __forceinline__ void flash_store8(floatX* dst, const float* y, float scale) {
#pragma unroll
    for (int i = 0; i < 8; i += PACK_X) {
        Packed128<floatX> p;
#pragma unroll
        for (int k = 0; k < PACK_X; k++) p.v[k] = from_float<floatX>(y[i + k] * scale);
        store128(dst + i, p);
    }
}

// ---- forward --------------------------------------------------------------------------------------
// Shared memory of the forward, in bytes: k and v tiles (BC x (HS + 8)), the q tile
// (BR x (HS + 8), read by every key tile's S = q k^T) and each warp's S (16 x SLD fp32,
// later its P v stage) and P (16 x SLD floatX), each region its own.
template <int HS>
struct FlashForwardSmem {
    static constexpr int LD = HS + 8;
    static constexpr int BC = FLOATX_IS_BF16 && HS > 64 ? 16 : FLASH_KEY_TILE, SLD = BC + 8;
    static constexpr int KV = BC * LD * (int)sizeof(floatX);
    static constexpr int Q = FLASH_QUERY_TILE * LD * (int)sizeof(floatX);
    static constexpr int WARP_S = 16 * SLD * (int)sizeof(float);
    static constexpr int WARP = WARP_S + 16 * SLD * (int)sizeof(floatX);
    static constexpr int Q_AT = 2 * KV;
    static constexpr int WARPS_AT = Q_AT + Q;
    static constexpr int BYTES = WARPS_AT + FLASH_WARPS * WARP;
    // Blocks per SM that the registers (at most 65536 / (128 MIN_BLOCKS)) and these bytes allow
    // on sm_90 (docs/gpu.md, "How the trainer works"); the BF16 build promises them to the compiler.
    static constexpr int MIN_BLOCKS = FLOATX_IS_BF16 ? (HS > 64 ? 4 : 6) : 1;
};

// hs <= HS (HS: FLASH_HS_SMALL or FLASH_HS_MAX).
template <int HS>
__global__ void __launch_bounds__(FLASH_THREADS, FlashForwardSmem<HS>::MIN_BLOCKS)
    flash_attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, int T, int NH, int hs, float scale) {
    typedef FlashForwardSmem<HS> L;
    constexpr int BR = FLASH_QUERY_TILE, BC = L::BC, SLD = L::SLD;
    __shared__ __align__(32) unsigned char smem[L::BYTES];
    floatX* k_s = (floatX*)smem;
    floatX* v_s = (floatX*)(smem + L::KV);
    floatX* q_s = (floatX*)(smem + L::Q_AT);
    const int C = NH * hs, ld = hs + 8;
    const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    const int h = blockIdx.y, b = blockIdx.z, q0 = qt * BR;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = lane >> 1, half = lane & 1, tq = q0 + 16 * warp + row;  // this lane's row
    float* s_warp = (float*)(smem + L::WARPS_AT + warp * L::WARP);  // the warp's S, then its P v stage
    floatX* p_warp = (floatX*)(smem + L::WARPS_AT + warp * L::WARP + L::WARP_S);
    flash_load_rows(q_s, ld, qkv, 3 * C, h * hs, b, q0, BR, T, hs);
    __syncthreads();

    float m = -INFINITY, l = 0.0f, o[HS / 2];  // o: this lane's row, columns 16 n + 8 half + e
#pragma unroll
    for (int i = 0; i < HS / 2; i++) o[i] = 0.0f;
    const int last_tile = min(T - 1, q0 + BR - 1) / BC;
    for (int kt = 0; kt <= last_tile; kt++) {
        const int k0 = kt * BC;
        __syncthreads();  // the previous tile's k_s, v_s are no longer read
        flash_load_rows(k_s, ld, qkv, 3 * C, C + h * hs, b, k0, BC, T, hs);
        flash_load_rows(v_s, ld, qkv, 3 * C, 2 * C + h * hs, b, k0, BC, T, hs);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < BC / 16; j++) {
            FlashAcc acc;
            flash_acc_zero(acc);
            flash_mma<false, true>(acc, q_s + 16 * warp * ld, ld, k_s + 16 * j * ld, ld, hs);
            flash_acc_store(s_warp + 16 * j, SLD, acc);
        }
        __syncwarp();
        // Online softmax of this lane's half of its row: the quads 2 i + half.
        float x[BC / 2], mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < BC / 8; i++) {
            const int c = 4 * (2 * i + half);
            Packed128<float> s4 = load128(s_warp + row * SLD + c);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int tk = k0 + c + e;
                x[4 * i + e] = tk <= tq && tk < T ? s4.v[e] * scale : -INFINITY;
                mx = fmaxf(mx, x[4 * i + e]);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        // Key 0 is in tile 0 and never masked, so m_new is finite from the first tile on.
        float m_new = fmaxf(m, mx), alpha = expf(m - m_new), sum = 0.0f;
#pragma unroll
        for (int i = 0; i < BC / 8; i++) {
            Packed4<floatX> p;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p.v[e] = from_float<floatX>(expf(x[4 * i + e] - m_new));
                sum += to_float(p.v[e]);
            }
            *reinterpret_cast<Packed4<floatX>*>(p_warp + row * SLD + 4 * (2 * i + half)) = p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        __syncwarp();
        // O = O alpha + P v, 16 columns at a time.
        FlashRows<BC> p_rows;
        p_rows.load(p_warp, SLD, BC);
#pragma unroll
        for (int n = 0; n < HS / 16; n++) {
            if (16 * n >= hs) break;
            FlashAcc acc;
            flash_acc_zero(acc);
            p_rows.template mma<false>(acc, v_s + 16 * n, ld, BC);
            float y[8];
            flash_acc_rows(y, acc, s_warp, SLD);
#pragma unroll
            for (int e = 0; e < 8; e++) o[n * 8 + e] = o[n * 8 + e] * alpha + y[e];
        }
    }
    if (tq < T) {
        float inv = 1.0f / l;
        floatX* dst = out + ((size_t)b * T + tq) * C + (size_t)h * hs + 8 * half;
#pragma unroll
        for (int n = 0; n < HS / 16; n++) {
            if (16 * n >= hs) break;
            flash_store8(dst + 16 * n, o + 8 * n, inv);
        }
        if (half == 0) lse[((size_t)b * NH + h) * T + tq] = m + logf(l);
    }
}

// ---- backward ------------------------------------------------------------------------------------
// D[b,h,t] = sum_d dout[b,t,h,d] out[b,t,h,d]: `group` lanes per row (the power of two at or
// above hs / PACK_X), each taking 128-bit packs; the rows (b, t, h) are consecutive in memory.
__global__ void flash_attention_rowdot_kernel(float* D, const floatX* out, const floatX* dout, int B, int T, int NH,
                                              int hs, int group) {
    const int lane = threadIdx.x % WARP_SIZE, sub = lane % group;
    const int idx = (blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE) * (WARP_SIZE / group) + lane / group;
    const bool live = idx < B * T * NH;
    float s = 0.0f;
    if (live) {
        const size_t at = (size_t)idx * hs;
        for (int d = sub * PACK_X; d < hs; d += group * PACK_X) {
            Packed128<floatX> g = load128(dout + at + d), o = load128(out + at + d);
#pragma unroll
            for (int k = 0; k < PACK_X; k++) s += to_float(g.v[k]) * to_float(o.v[k]);
        }
    }
    for (int off = group / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (live && sub == 0) {
        int h = idx % NH, t = (idx / NH) % T, b = idx / (NH * T);
        D[((size_t)b * NH + h) * T + t] = s;
    }
}

// Shared memory of both backward kernels, in bytes: the q, dout, k and v tiles (BT x (HS + 8)
// each), S and dP (BT x FLASH_SCORE_LD fp32 each; P and dS, floatX, then overwrite them, and
// at the end they are the warps' stages), lse and D of the query tile.
template <int HS>
struct FlashBackwardSmem {
    static constexpr int LD = HS + 8;
    static constexpr int TILE = FLASH_BWD_TILE * LD * (int)sizeof(floatX);
    static constexpr int SCORES = FLASH_BWD_TILE * FLASH_SCORE_LD * (int)sizeof(float);
    static constexpr int STATS = 4 * TILE + 2 * SCORES;
    static constexpr int BYTES = STATS + 2 * FLASH_BWD_TILE * (int)sizeof(float);
    // As FlashForwardSmem's: the dk, dv kernel keeps twice the accumulators of the dq kernel.
    static constexpr int MIN_BLOCKS_KV = FLOATX_IS_BF16 ? (HS > 64 ? 4 : 6) : 1;
    static constexpr int MIN_BLOCKS_Q = FLOATX_IS_BF16 ? (HS > 64 ? 5 : 7) : 1;
};
struct FlashBackwardTiles {
    floatX *q, *dout, *k, *v, *p, *ds;
    float *s, *dp, *lse, *d;
};
template <int HS>
__device__ __forceinline__ FlashBackwardTiles flash_backward_tiles(unsigned char* smem) {
    typedef FlashBackwardSmem<HS> L;
    FlashBackwardTiles t;
    t.q = (floatX*)smem;
    t.dout = (floatX*)(smem + L::TILE);
    t.k = (floatX*)(smem + 2 * L::TILE);
    t.v = (floatX*)(smem + 3 * L::TILE);
    t.s = (float*)(smem + 4 * L::TILE);
    t.dp = t.s + FLASH_BWD_TILE * FLASH_SCORE_LD;
    t.p = (floatX*)t.s;
    t.ds = t.p + FLASH_BWD_TILE * FLASH_SCORE_LD;
    t.lse = (float*)(smem + L::STATS);
    t.d = t.lse + FLASH_BWD_TILE;
    return t;
}

// The shared part of both backward kernels: for query rows q0.. and key rows k0.. (tiles
// of BT that the block has just loaded into shared memory: it waits for them first),
// S = q k^T and dP = dout v^T, then P = exp(scale S - lse) (0 where masked or past T) and
// dS = P (dP - D) as floatX over them. Each thread takes the quads 2 c + half of its row
// lane >> 1 (the forward's pattern, header comment).
__device__ __forceinline__ void flash_backward_scores(const FlashBackwardTiles& t, int ld, int q0, int k0, int T,
                                                      int hs, float scale) {
    constexpr int BT = FLASH_BWD_TILE, SLD = FLASH_SCORE_LD, TILES = (BT / 16) * (BT / 16);
    constexpr int ROW_GROUPS = BT / 16, COL_STEP = FLASH_WARPS / ROW_GROUPS, PER_THREAD = BT / 8 / COL_STEP;
    static_assert(FLASH_WARPS % ROW_GROUPS == 0 && (BT / 8) % COL_STEP == 0, "the warps cover the score quads");
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    __syncthreads();
    for (int job = warp; job < 2 * TILES; job += FLASH_WARPS) {  // S tiles, then dP tiles
        int tile = job % TILES, i = tile / (BT / 16), j = tile % (BT / 16);
        bool dp = job >= TILES;
        FlashAcc acc;
        flash_acc_zero(acc);
        flash_mma<false, true>(acc, (dp ? t.dout : t.q) + 16 * i * ld, ld, (dp ? t.v : t.k) + 16 * j * ld, ld, hs);
        flash_acc_store((dp ? t.dp : t.s) + 16 * i * SLD + 16 * j, SLD, acc);
    }
    __syncthreads();
    const int r = 16 * (warp % ROW_GROUPS) + (lane >> 1), half = lane & 1, tq = q0 + r;
    float p[PER_THREAD][4], ds[PER_THREAD][4];
#pragma unroll
    for (int it = 0; it < PER_THREAD; it++) {
        const int c = 4 * (2 * (warp / ROW_GROUPS + it * COL_STEP) + half);
        Packed128<float> s4 = load128(t.s + r * SLD + c), dp4 = load128(t.dp + r * SLD + c);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int tk = k0 + c + e;
            p[it][e] = tq < T && tk <= tq ? expf(s4.v[e] * scale - t.lse[r]) : 0.0f;
            ds[it][e] = p[it][e] * (dp4.v[e] - t.d[r]);
        }
    }
    __syncthreads();  // P and dS overwrite the scores
#pragma unroll
    for (int it = 0; it < PER_THREAD; it++) {
        const int c = 4 * (2 * (warp / ROW_GROUPS + it * COL_STEP) + half);
        Packed4<floatX> p4, ds4;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            p4.v[e] = from_float<floatX>(p[it][e]);
            ds4.v[e] = from_float<floatX>(ds[it][e]);
        }
        *reinterpret_cast<Packed4<floatX>*>(t.p + r * SLD + c) = p4;
        *reinterpret_cast<Packed4<floatX>*>(t.ds + r * SLD + c) = ds4;
    }
    __syncthreads();
}

// lse and D of rows q0..q0+BT-1 into shared memory (0 past T).
__device__ __forceinline__ void flash_load_row_stats(const FlashBackwardTiles& s, const float* lse, const float* D,
                                                     size_t bh, int q0, int T) {
    for (int r = threadIdx.x; r < FLASH_BWD_TILE; r += blockDim.x) {
        int t = q0 + r;
        s.lse[r] = t < T ? lse[bh * T + t] : 0.0f;
        s.d[r] = t < T ? D[bh * T + t] : 0.0f;
    }
}

// Query rows q0..q0+BT-1 of head h of batch row b (bh = b * NH + h) into shared memory:
// q, dout, and the rows' lse and D.
__device__ __forceinline__ void flash_load_query_tile(const FlashBackwardTiles& s, int ld, const floatX* qkv,
                                                      const floatX* dout, const float* lse, const float* D, int b,
                                                      int h, size_t bh, int q0, int T, int C, int hs) {
    flash_load_rows(s.q, ld, qkv, 3 * C, h * hs, b, q0, FLASH_BWD_TILE, T, hs);
    flash_load_rows(s.dout, ld, dout, C, h * hs, b, q0, FLASH_BWD_TILE, T, hs);
    flash_load_row_stats(s, lse, D, bh, q0, T);
}
// Key rows k0..k0+BT-1 of head h of batch row b into shared memory: k and v.
__device__ __forceinline__ void flash_load_key_tile(const FlashBackwardTiles& s, int ld, const floatX* qkv, int b,
                                                    int h, int k0, int T, int C, int hs) {
    flash_load_rows(s.k, ld, qkv, 3 * C, C + h * hs, b, k0, FLASH_BWD_TILE, T, hs);
    flash_load_rows(s.v, ld, qkv, 3 * C, 2 * C + h * hs, b, k0, FLASH_BWD_TILE, T, hs);
}

// Warp `warp`'s a-th 16 x 16 output tile (tiles warp, warp + WARPS, ... of out_tiles, `chunks`
// to a row of tiles): its row i and column j, or false past the last tile.
__device__ __forceinline__ bool flash_warp_tile(int warp, int a, int out_tiles, int chunks, int* i, int* j) {
    int t = warp + a * FLASH_WARPS;
    if (t >= out_tiles) return false;
    *i = t / chunks;
    *j = t % chunks;
    return true;
}

// Writes this warp's output tiles acc[a] (tile warp + a WARPS of the (rows x hs) block at
// rows row0.., 16 x 16 each, `chunks` = hs / 16 per row of tiles), times scale, to part
// `part` of dqkv at columns col0.., through the warp's stage: 16 bytes per lane and row.
template <int ACC>
__device__ __forceinline__ void flash_store_accs(floatX* dqkv, float* stage, const FlashAcc* acc, float scale, int b,
                                                 int row0, int T, int C, int part, int col0, int out_tiles,
                                                 int chunks) {
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, r = lane >> 1, half = lane & 1;
#pragma unroll
    for (int a = 0; a < ACC; a++) {
        int i, j;
        if (!flash_warp_tile(warp, a, out_tiles, chunks, &i, &j)) break;
        int row = row0 + 16 * i + r;
        float y[8];
        flash_acc_rows(y, acc[a], stage, FLASH_SCORE_LD);
        if (row < T) flash_store8(dqkv + ((size_t)b * T + row) * 3 * C + (size_t)part * C + col0 + 16 * j + 8 * half, y, scale);
    }
}

// dk and dv of one key tile (blockIdx.x), over the query tiles from the diagonal on.
template <int HS>
__global__ void __launch_bounds__(FLASH_THREADS, FlashBackwardSmem<HS>::MIN_BLOCKS_KV)
    flash_attention_backward_kv_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                       const float* D, int T, int NH, int hs, float scale) {
    constexpr int BT = FLASH_BWD_TILE, SLD = FLASH_SCORE_LD, ACC = FLASH_BWD_ACC(HS);
    __shared__ __align__(32) unsigned char smem[FlashBackwardSmem<HS>::BYTES];
    const FlashBackwardTiles s = flash_backward_tiles<HS>(smem);
    const int C = NH * hs, ld = hs + 8, chunks = hs / 16;
    const int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, k0 = kt * BT, warp = threadIdx.x / WARP_SIZE;
    const size_t bh = (size_t)b * NH + h;
    const int out_tiles = (BT / 16) * chunks;  // 16 x 16 tiles of (keys x hs), warp w has w, w + WARPS, ...
    flash_load_key_tile(s, ld, qkv, b, h, k0, T, C, hs);
    FlashAcc dk[ACC], dv[ACC];
#pragma unroll
    for (int a = 0; a < ACC; a++) {
        flash_acc_zero(dk[a]);
        flash_acc_zero(dv[a]);
    }
    for (int qt = kt; qt * BT < T; qt++) {
        const int q0 = qt * BT;
        __syncthreads();  // the previous query tile is no longer read
        flash_load_query_tile(s, ld, qkv, dout, lse, D, b, h, bh, q0, T, C, hs);
        flash_backward_scores(s, ld, q0, k0, T, hs, scale);
#pragma unroll
        for (int a = 0; a < ACC; a++) {
            int i, j;
            if (!flash_warp_tile(warp, a, out_tiles, chunks, &i, &j)) break;
            flash_mma<true, false>(dv[a], s.p + 16 * i, SLD, s.dout + 16 * j, ld, BT);  // P^T dout
            flash_mma<true, false>(dk[a], s.ds + 16 * i, SLD, s.q + 16 * j, ld, BT);    // dS^T q
        }
    }
    __syncthreads();  // the scores become the warps' stages
    float* stage = s.s + warp * 16 * SLD;
    flash_store_accs<ACC>(dqkv, stage, dk, scale, b, k0, T, C, 1, h * hs, out_tiles, chunks);
    flash_store_accs<ACC>(dqkv, stage, dv, 1.0f, b, k0, T, C, 2, h * hs, out_tiles, chunks);
}

// dq of one query tile, over the key tiles up to the diagonal.
template <int HS>
__global__ void __launch_bounds__(FLASH_THREADS, FlashBackwardSmem<HS>::MIN_BLOCKS_Q)
    flash_attention_backward_q_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                      const float* D, int T, int NH, int hs, float scale) {
    constexpr int BT = FLASH_BWD_TILE, SLD = FLASH_SCORE_LD, ACC = FLASH_BWD_ACC(HS);
    __shared__ __align__(32) unsigned char smem[FlashBackwardSmem<HS>::BYTES];
    const FlashBackwardTiles s = flash_backward_tiles<HS>(smem);
    const int C = NH * hs, ld = hs + 8, chunks = hs / 16;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, q0 = qt * BT;
    const int warp = threadIdx.x / WARP_SIZE;
    const size_t bh = (size_t)b * NH + h;
    const int out_tiles = (BT / 16) * chunks;
    flash_load_query_tile(s, ld, qkv, dout, lse, D, b, h, bh, q0, T, C, hs);
    FlashAcc dq[ACC];
#pragma unroll
    for (int a = 0; a < ACC; a++) flash_acc_zero(dq[a]);
    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * BT;
        __syncthreads();
        flash_load_key_tile(s, ld, qkv, b, h, k0, T, C, hs);
        flash_backward_scores(s, ld, q0, k0, T, hs, scale);
#pragma unroll
        for (int a = 0; a < ACC; a++) {
            int i, j;
            if (!flash_warp_tile(warp, a, out_tiles, chunks, &i, &j)) break;
            flash_mma<false, false>(dq[a], s.ds + 16 * i * SLD, SLD, s.k + 16 * j, ld, BT);  // dS k
        }
    }
    __syncthreads();  // the scores become the warps' stages
    flash_store_accs<ACC>(dqkv, s.s + warp * 16 * SLD, dq, scale, b, q0, T, C, 0, h * hs, out_tiles, chunks);
}

// ---- host side -----------------------------------------------------------------------------------
static inline bool flash_attention_supported(int C, int NH) {
    int hs = NH > 0 ? C / NH : 0;
    return NH > 0 && C % NH == 0 && hs % 16 == 0 && hs >= 16 && hs <= FLASH_HS_MAX;
}
// Ends with one message where the model's head size is not one the kernels handle.
static inline void flash_attention_check(int C, int NH) {
    if (!flash_attention_supported(C, NH)) {
        fatal("flash attention: head size %d (channels %d / heads %d) must be a multiple of 16 up to %d (the naive "
              "attention takes any)", NH > 0 ? C / NH : 0, C, NH, FLASH_HS_MAX);
    }
}
// The forward's key tile (BC) at head size hs: the test bounds the rescalings by the tile count.
static inline int flash_forward_key_tile(int hs) {
    return hs <= FLASH_HS_SMALL ? FlashForwardSmem<FLASH_HS_SMALL>::BC : FlashForwardSmem<FLASH_HS_MAX>::BC;
}
static inline void flash_check_aligned(const void* p, const char* what) {
    if ((uintptr_t)p % 16 != 0) fatal("flash attention: %s (%p) is not 16-byte aligned", what, p);
}

static_assert(FLASH_HS_SMALL == 64 && FLASH_HS_MAX == 128, "the launches below name the two instances");

// out (B,T,C) and lse (B,NH,T) from qkv (B,T,3C).
static void attention_flash_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                    cudaStream_t stream) {
    flash_attention_check(C, NH);
    flash_check_aligned(out, "out");
    flash_check_aligned(qkv, "qkv");
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    dim3 grid(CEIL_DIV(T, FLASH_QUERY_TILE), NH, B);
    if (hs <= FLASH_HS_SMALL) {
        flash_attention_forward_kernel<64><<<grid, FLASH_THREADS, 0, stream>>>(out, lse, qkv, T, NH, hs, scale);
    } else {
        flash_attention_forward_kernel<128><<<grid, FLASH_THREADS, 0, stream>>>(out, lse, qkv, T, NH, hs, scale);
    }
    cudaCheckLaunch();
}

// dqkv (B,T,3C) overwritten from dout (B,T,C), the forward's out, qkv and lse; D is (B,NH,T)
// fp32 scratch.
static void attention_flash_backward(floatX* dqkv, float* D, const floatX* dout, const floatX* out, const floatX* qkv,
                                     const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    flash_attention_check(C, NH);
    flash_check_aligned(dqkv, "dqkv");
    flash_check_aligned(dout, "dout");
    flash_check_aligned(out, "out");
    flash_check_aligned(qkv, "qkv");
    int hs = C / NH, rows = B * T * NH, group = 1;
    while (group * PACK_X < hs) group *= 2;  // hs <= 128: at most 32 lanes
    float scale = 1.0f / sqrtf((float)hs);
    flash_attention_rowdot_kernel<<<CEIL_DIV(rows, 8 * (WARP_SIZE / group)), 256, 0, stream>>>(D, out, dout, B, T, NH,
                                                                                              hs, group);
    cudaCheckLaunch();
    dim3 grid(CEIL_DIV(T, FLASH_BWD_TILE), NH, B);
    if (hs <= FLASH_HS_SMALL) {
        flash_attention_backward_kv_kernel<64><<<grid, FLASH_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, D,
                                                                                             T, NH, hs, scale);
        cudaCheckLaunch();
        flash_attention_backward_q_kernel<64><<<grid, FLASH_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, D,
                                                                                            T, NH, hs, scale);
    } else {
        flash_attention_backward_kv_kernel<128><<<grid, FLASH_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, D, T,
                                                                                           NH, hs, scale);
        cudaCheckLaunch();
        flash_attention_backward_q_kernel<128><<<grid, FLASH_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, D, T,
                                                                                          NH, hs, scale);
    }
    cudaCheckLaunch();
}

#endif
