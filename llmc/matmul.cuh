/*
 * Linear layers through cuBLASLt. Weights are (OC, C) row-major like PyTorch's
 * nn.Linear; activations (BT, C) row-major. cuBLASLt is column-major, so every call
 * below is written for the transposed (column-major) views of the same memory.
 *
 *   forward:  out (BT,OC) = inp (BT,C) @ W^T + bias     (bias fused as an epilogue)
 *   backward: dinp (BT,C) = dout (BT,OC) @ W            (overwrites the floatX scratch)
 *             dW (OC,C)  += dout^T @ inp                 fp32 grad view, beta = 1
 *             db (OC)    += column sums of dout          fp32 grad view
 * The weight gradient is the point of the fp32 grad buffer: A and B are floatX, C and D
 * fp32, compute fp32, beta = 1, so each micro-step adds straight into the grad-buffer
 * view the ZeRO-1 buckets own; no separate gradient tensor, no copy.
 * All compute is CUBLAS_COMPUTE_32F: no TF32 in the FP32 build.
 */
#ifndef LLMC_MATMUL_CUH
#define LLMC_MATMUL_CUH

#include "llmc/cuda_common.cuh"
#include "llmc/layernorm.cuh"  // colreduce_num_chunks

static inline int ptr_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    int align = 256;
    while (align > 1 && (a % align) != 0) align >>= 1;
    return align;
}

// D (m,n) = alpha * op(A) op(B) + beta * C, column-major, C == D in memory.
// A is (k,m) if transA else (m,k); B is (n,k) if transB else (k,n) (stored shapes).
static void matmul_cublaslt(void* d, cudaDataType_t d_type, const floatX* a, const floatX* b, const floatX* bias,
                            int m, int n, int k, int transA, int transB, float beta, cudaStream_t stream) {
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N, opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
    cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias) {
        cudaDataType_t bias_type = CUBLAS_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUBLAS_FLOATX, transA ? k : m, transA ? m : k, transA ? k : m));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUBLAS_FLOATX, transB ? n : k, transB ? k : n, transB ? n : k));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, d_type, m, n, m));

    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &cuda_libs.lt_workspace_size, sizeof(size_t)));
    // Views into the flat buffers need not be 256-byte aligned: tell the heuristic.
    uint32_t al_a = ptr_alignment(a), al_b = ptr_alignment(b), al_d = ptr_alignment(d);
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    // No algorithm for a configuration comes back either as CUBLAS_STATUS_NOT_SUPPORTED or
    // as success with found == 0 (or a result whose state is not success): all three get
    // the message that names the shape, instead of a bare status code.
    cublasStatus_t hst =
        cublasLtMatmulAlgoGetHeuristic(cuda_libs.cublaslt, desc, la, lb, ld, ld, pref, 1, &heuristic, &found);
    if (hst != CUBLAS_STATUS_NOT_SUPPORTED) cublasCheck(hst);
    if (hst == CUBLAS_STATUS_NOT_SUPPORTED || found == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS) {
        fatal("cuBLASLt has no algorithm for m=%d n=%d k=%d transA=%d transB=%d bias=%d out=%s", m, n, k, transA, transB,
              bias != NULL, d_type == CUDA_R_32F ? "fp32" : "bf16");
    }
    float alpha = 1.0f;
    cublasCheck(cublasLtMatmul(cuda_libs.cublaslt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heuristic.algo,
                               cuda_libs.lt_workspace, cuda_libs.lt_workspace_size, stream));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

// out (BT,OC) = inp (BT,C) @ weight(OC,C)^T + bias; bias may be NULL.
static void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int BT, int C,
                           int OC, cudaStream_t stream) {
    // column-major: out^T (OC x BT) = weight^T... = op_T(W stored C x OC) @ inp^T (C x BT)
    matmul_cublaslt(out, CUBLAS_FLOATX, weight, inp, bias, OC, BT, C, 1, 0, 0.0f, stream);
}

// Pass 1 of dbias: block (32 columns x 8 row lanes) sums one chunk of rows.
__global__ void bias_backward_partial_kernel(float* partial, const floatX* dout, int N, int OC, int rows_per_chunk) {
    __shared__ float s[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int chunk = blockIdx.y;
    int r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float acc = 0.0f;
    if (c < OC) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += to_float(dout[(size_t)r * OC + c]);
    }
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float sum = 0.0f;
        for (int y = 0; y < 8; y++) sum += s[y][threadIdx.x];
        partial[(size_t)chunk * OC + c] = sum;
    }
}

// Pass 2: chunks summed in order, added to the fp32 grad view.
__global__ void bias_backward_final_kernel(float* dbias, const float* partial, int num_chunks, int OC) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float sum = 0.0f;
    for (int k = 0; k < num_chunks; k++) sum += partial[(size_t)k * OC + c];
    dbias[c] += sum;
}

// dinp is overwritten; dweight and dbias (fp32 views, dbias may be NULL) accumulate.
// scratch: at least colreduce_num_chunks(BT) * OC floats (when dbias is given).
static void matmul_backward(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                            const floatX* inp, const floatX* weight, int BT, int C, int OC, cudaStream_t stream) {
    // dinp^T (C x BT) = W^T as stored (C x OC) @ dout^T (OC x BT)
    matmul_cublaslt(dinp, CUBLAS_FLOATX, weight, dout, NULL, C, BT, OC, 0, 0, 0.0f, stream);
    // dW^T (C x OC) += inp^T (C x BT) @ op_T(dout^T stored OC x BT)
    matmul_cublaslt(dweight, CUDA_R_32F, inp, dout, NULL, C, OC, BT, 0, 1, 1.0f, stream);
    if (dbias) {
        int chunks = colreduce_num_chunks(BT);
        dim3 grid(CEIL_DIV(OC, 32), chunks), block(32, 8);
        bias_backward_partial_kernel<<<grid, block, 0, stream>>>(scratch, dout, BT, OC, CEIL_DIV(BT, chunks));
        cudaCheckLaunch();
        bias_backward_final_kernel<<<CEIL_DIV(OC, 256), 256, 0, stream>>>(dbias, scratch, chunks, OC);
        cudaCheckLaunch();
    }
}

#endif
