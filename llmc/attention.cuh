/*
 * Causal multi-head self-attention, the straightforward (non-flash) way: permute
 * q, k, v to (B,NH,T,hs), two strided-batched cuBLAS gemms around a softmax kernel.
 *
 * qkv (B,T,3C) = [q | k | v] along the last dim, head h at channels h*hs..(h+1)*hs-1.
 *   preatt = q k^T        (fp32 scratch, B*NH*T*T)
 *   att    = softmax(preatt/sqrt(hs)) over t2 <= t, exactly 0 above the diagonal
 *            (floatX, kept per layer for the backward)
 *   out    = att v        -> unpermuted to (B,T,C)
 * This is `--attention naive`, the reference path; llmc/attention_flash.cuh (the default)
 * computes the same without the (B,NH,T,T) buffers. Performance limit: this materialises
 * T x T scores per head and computes the full square (the masked half is wasted work), so
 * at T=1024 it costs far more memory and traffic than the flash kernels.
 * Accuracy: the scores and their gradients are fp32 (gemm output type fp32), so only
 * att and dpreatt are rounded to floatX before the second gemms.
 */
#ifndef LLMC_ATTENTION_CUH
#define LLMC_ATTENTION_CUH

#include "llmc/cuda_common.cuh"

// Where element idx of a head-major (B,NH,T,hs) tensor sits in a token-major one whose rows
// (b,t) are row_stride apart: NH*hs for (B,T,C), 3*NH*hs for q's third of qkv (B,T,3C).
__device__ __forceinline__ size_t attention_token_major(size_t idx, int T, int NH, int hs, size_t row_stride) {
    int d = (int)(idx % hs);
    int t = (int)((idx / hs) % T);
    int h = (int)((idx / ((size_t)hs * T)) % NH);
    int b = (int)(idx / ((size_t)hs * T * NH));
    return ((size_t)b * T + t) * row_stride + (size_t)h * hs + d;
}

// This thread's element of a (B,NH,T,hs) tensor, one thread per element: false past the end.
__device__ __forceinline__ bool attention_head_element(size_t* idx, int B, int T, int NH, int hs) {
    *idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    return *idx < (size_t)B * NH * T * hs;
}

// (B,T,3,NH,hs) -> q,k,v each (B,NH,T,hs)
__global__ void attention_permute_kernel(floatX* q, floatX* k, floatX* v, const floatX* qkv, int B, int T, int NH,
                                         int hs) {
    size_t idx;
    if (!attention_head_element(&idx, B, T, NH, hs)) return;
    int C = NH * hs;
    size_t src = attention_token_major(idx, T, NH, hs, (size_t)3 * C);
    q[idx] = qkv[src];
    k[idx] = qkv[src + C];
    v[idx] = qkv[src + 2 * C];
}

// (B,NH,T,hs) -> (B,T,NH,hs) = (B,T,C)
__global__ void attention_unpermute_kernel(floatX* out, const floatX* inp, int B, int T, int NH, int hs) {
    size_t idx;
    if (!attention_head_element(&idx, B, T, NH, hs)) return;
    out[attention_token_major(idx, T, NH, hs, (size_t)NH * hs)] = inp[idx];
}

// (B,T,C) -> (B,NH,T,hs): the layout of dout that the backward gemms need.
__global__ void attention_permute_grad_kernel(floatX* out, const floatX* inp, int B, int T, int NH, int hs) {
    size_t idx;
    if (!attention_head_element(&idx, B, T, NH, hs)) return;
    out[idx] = inp[attention_token_major(idx, T, NH, hs, (size_t)NH * hs)];
}

// dq,dk,dv (B,NH,T,hs) -> dqkv (B,T,3C) (overwritten)
__global__ void attention_unpermute_qkv_kernel(floatX* dqkv, const floatX* dq, const floatX* dk, const floatX* dv,
                                               int B, int T, int NH, int hs) {
    size_t idx;
    if (!attention_head_element(&idx, B, T, NH, hs)) return;
    int C = NH * hs;
    size_t dst = attention_token_major(idx, T, NH, hs, (size_t)3 * C);
    dqkv[dst] = dq[idx];
    dqkv[dst + C] = dk[idx];
    dqkv[dst + 2 * C] = dv[idx];
}

// N (1 or 4) elements at p: 4 with one 128-bit (fp32) or 64-bit (bf16) access, p aligned.
template <int N, typename T>
__device__ __forceinline__ Packed4<T> load_n(const T* p) {
    Packed4<T> q;
    if (N == 4) q = *reinterpret_cast<const Packed4<T>*>(p);
    else q.v[0] = p[0];
    return q;
}
template <int N>
__device__ __forceinline__ void store_n(floatX* p, const Packed4<floatX>& q) {
    if (N == 4) *reinterpret_cast<Packed4<floatX>*>(p) = q;
    else p[0] = q.v[0];
}

// The softmax of one row by one warp, STEP elements per lane and step: 4 (T a multiple of
// 4, att and preatt 16-byte aligned: 128-bit fp32 loads, 64- or 128-bit floatX stores, a
// warp's lanes on consecutive bytes) or 1.
template <int STEP>
__device__ __forceinline__ void attention_softmax_row(floatX* y, const float* x, int t, int T, float scale, int lane) {
    float maxv = -INFINITY;
    for (int j = lane * STEP; j <= t; j += WARP_SIZE * STEP) {
        Packed4<float> v = load_n<STEP>(x + j);
#pragma unroll
        for (int k = 0; k < STEP; k++) {
            if (j + k <= t) maxv = fmaxf(maxv, v.v[k] * scale);
        }
    }
    maxv = warp_reduce_max(maxv);
    float sum = 0.0f;
    for (int j = lane * STEP; j <= t; j += WARP_SIZE * STEP) {
        Packed4<float> v = load_n<STEP>(x + j);
#pragma unroll
        for (int k = 0; k < STEP; k++) {
            if (j + k <= t) sum += expf(v.v[k] * scale - maxv);
        }
    }
    float inv = 1.0f / warp_reduce_sum(sum);
    for (int j = lane * STEP; j < T; j += WARP_SIZE * STEP) {
        Packed4<float> v = load_n<STEP>(x + j);
        Packed4<floatX> p;
#pragma unroll
        for (int k = 0; k < STEP; k++) p.v[k] = from_float<floatX>(j + k <= t ? expf(v.v[k] * scale - maxv) * inv : 0.0f);
        store_n<STEP>(y + j, p);
    }
}

// One warp per row (b,h,t): att[t2] = softmax(scale * preatt[0..t]), 0 for t2 > t; vec: as
// attention_softmax_row's STEP 4.
__global__ void attention_softmax_kernel(floatX* att, const float* preatt, int rows, int T, float scale, int vec) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    size_t at = (size_t)row * T;
    if (vec) attention_softmax_row<4>(att + at, preatt + at, row % T, T, scale, lane);
    else attention_softmax_row<1>(att + at, preatt + at, row % T, T, scale, lane);
}

// dpreatt[t2] = scale * att[t2] * (datt[t2] - sum_j att[j] datt[j]), 0 above the diagonal,
// for one row by one warp; STEP as attention_softmax_row's.
template <int STEP>
__device__ __forceinline__ void attention_softmax_backward_row(floatX* dx, const float* dy, const floatX* y, int t,
                                                               int T, float scale, int lane) {
    float dot = 0.0f;
    for (int j = lane * STEP; j <= t; j += WARP_SIZE * STEP) {
        Packed4<floatX> a = load_n<STEP>(y + j);
        Packed4<float> g = load_n<STEP>(dy + j);
#pragma unroll
        for (int k = 0; k < STEP; k++) {
            if (j + k <= t) dot += to_float(a.v[k]) * g.v[k];
        }
    }
    dot = warp_reduce_sum(dot);
    for (int j = lane * STEP; j < T; j += WARP_SIZE * STEP) {
        Packed4<floatX> a = load_n<STEP>(y + j), d;
        Packed4<float> g = load_n<STEP>(dy + j);
#pragma unroll
        for (int k = 0; k < STEP; k++) d.v[k] = from_float<floatX>(j + k <= t ? scale * to_float(a.v[k]) * (g.v[k] - dot) : 0.0f);
        store_n<STEP>(dx + j, d);
    }
}

// One warp per row; vec: T a multiple of 4, dpreatt, datt and att 16-byte aligned.
__global__ void attention_softmax_backward_kernel(floatX* dpreatt, const float* datt, const floatX* att, int rows,
                                                  int T, float scale, int vec) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    size_t at = (size_t)row * T;
    if (vec) attention_softmax_backward_row<4>(dpreatt + at, datt + at, att + at, row % T, T, scale, lane);
    else attention_softmax_backward_row<1>(dpreatt + at, datt + at, att + at, row % T, T, scale, lane);
}

// Strided-batched column-major gemm: C(m,n) = op(A) op(B), fp32 compute.
static void attention_gemm(cublasOperation_t opA, cublasOperation_t opB, int m, int n, int k, const floatX* A, int lda,
                           long long strideA, const floatX* Bm, int ldb, long long strideB, void* Cm,
                           cudaDataType_t c_type, int ldc, long long strideC, int batch, cudaStream_t stream) {
    float alpha = 1.0f, beta = 0.0f;
    cublasCheck(cublasSetStream(cuda_libs.cublas, stream));
    cublasCheck(cublasGemmStridedBatchedEx(cuda_libs.cublas, opA, opB, m, n, k, &alpha, A, CUBLAS_FLOATX, lda, strideA,
                                           Bm, CUBLAS_FLOATX, ldb, strideB, &beta, Cm, c_type, ldc, strideC, batch,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Scratch the caller provides (sizes in elements, N = B*NH*T*T, BTC = B*T*C):
//   qkvr (3*BTC floatX), vaccum (BTC floatX), preatt (N float).
static void attention_forward(floatX* out, floatX* qkvr, floatX* vaccum, float* preatt, floatX* att, const floatX* qkv,
                              int B, int T, int C, int NH, cudaStream_t stream) {
    int hs = C / NH;
    size_t btc = (size_t)B * T * C;
    floatX *q = qkvr, *k = qkvr + btc, *v = qkvr + 2 * btc;
    attention_permute_kernel<<<(unsigned)CEIL_DIV(btc, 256), 256, 0, stream>>>(q, k, v, qkv, B, T, NH, hs);
    cudaCheckLaunch();
    // preatt^T (T2 x T1, column-major) = op_T(k stored hs x T) @ q (hs x T)
    attention_gemm(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, k, hs, (long long)T * hs, q, hs, (long long)T * hs, preatt,
                   CUDA_R_32F, T, (long long)T * T, B * NH, stream);
    int rows = B * NH * T;
    float scale = 1.0f / sqrtf((float)hs);
    int vec = T % 4 == 0 && aligned16(att) && aligned16(preatt);
    attention_softmax_kernel<<<CEIL_DIV(rows, 8), 256, 0, stream>>>(att, preatt, rows, T, scale, vec);
    cudaCheckLaunch();
    // out^T (hs x T1) = v (hs x T2) @ att^T (T2 x T1)
    attention_gemm(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, v, hs, (long long)T * hs, att, T, (long long)T * T, vaccum,
                   CUBLAS_FLOATX, hs, (long long)T * hs, B * NH, stream);
    attention_unpermute_kernel<<<(unsigned)CEIL_DIV(btc, 256), 256, 0, stream>>>(out, vaccum, B, T, NH, hs);
    cudaCheckLaunch();
}

// dqkv (B,T,3C) is overwritten. Scratch: qkvr, dqkvr (3*BTC floatX each), dout_perm
// (BTC floatX), datt (N float), dpreatt (N floatX).
static void attention_backward(floatX* dqkv, floatX* qkvr, floatX* dqkvr, floatX* dout_perm, float* datt,
                               floatX* dpreatt, const floatX* dout, const floatX* qkv, const floatX* att, int B, int T,
                               int C, int NH, cudaStream_t stream) {
    int hs = C / NH;
    size_t btc = (size_t)B * T * C;
    long long sq = (long long)T * hs, sa = (long long)T * T;
    int batch = B * NH;
    floatX *q = qkvr, *k = qkvr + btc, *v = qkvr + 2 * btc;
    floatX *dq = dqkvr, *dk = dqkvr + btc, *dv = dqkvr + 2 * btc;
    // q, k, v are recomputed from the stored qkv instead of being kept per layer.
    attention_permute_kernel<<<(unsigned)CEIL_DIV(btc, 256), 256, 0, stream>>>(q, k, v, qkv, B, T, NH, hs);
    cudaCheckLaunch();
    attention_permute_grad_kernel<<<(unsigned)CEIL_DIV(btc, 256), 256, 0, stream>>>(dout_perm, dout, B, T, NH, hs);
    cudaCheckLaunch();
    // datt[t1,t2] = dout[t1] . v[t2]  (same shape of product as preatt)
    attention_gemm(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, v, hs, sq, dout_perm, hs, sq, datt, CUDA_R_32F, T, sa, batch,
                   stream);
    // dv[t2] = sum_t1 att[t1,t2] dout[t1]:  dv^T (hs x T2) = dout^T (hs x T1) @ op_T(att^T stored T2 x T1)
    attention_gemm(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, dout_perm, hs, sq, att, T, sa, dv, CUBLAS_FLOATX, hs, sq, batch,
                   stream);
    int rows = B * NH * T;
    float scale = 1.0f / sqrtf((float)hs);
    int vec = T % 4 == 0 && aligned16(dpreatt) && aligned16(datt) && aligned16(att);
    attention_softmax_backward_kernel<<<CEIL_DIV(rows, 8), 256, 0, stream>>>(dpreatt, datt, att, rows, T, scale, vec);
    cudaCheckLaunch();
    // dq[t1] = sum_t2 dpre[t1,t2] k[t2]:  dq^T (hs x T1) = k^T (hs x T2) @ dpre^T (T2 x T1)
    attention_gemm(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, k, hs, sq, dpreatt, T, sa, dq, CUBLAS_FLOATX, hs, sq, batch,
                   stream);
    // dk[t2] = sum_t1 dpre[t1,t2] q[t1]:  dk^T (hs x T2) = q^T (hs x T1) @ op_T(dpre^T stored T2 x T1)
    attention_gemm(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, q, hs, sq, dpreatt, T, sa, dk, CUBLAS_FLOATX, hs, sq, batch,
                   stream);
    attention_unpermute_qkv_kernel<<<(unsigned)CEIL_DIV(btc, 256), 256, 0, stream>>>(dqkv, dq, dk, dv, B, T, NH, hs);
    cudaCheckLaunch();
}

#endif
