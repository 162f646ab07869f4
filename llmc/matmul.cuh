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
 *
 * Fused kernels (GPT2.kernels.fused, --fused-kernels 1), in cuBLASLt epilogues:
 *   matmul_forward_gelu:   pre = inp @ W^T + bias, out = gelu(pre) in one call
 *                          (GELU_AUX_BIAS: D = out, aux = pre, kept for the backward)
 *   matmul_backward_fused: with gelu_pre, dinp = (dout @ W) * gelu'(gelu_pre) (DGELU:
 *                          the gradient of the GELU's input, no separate pass); the bias
 *                          gradient by BGRADB on the weight-gradient matmul (the sum of
 *                          B = dout over k = BT), into an fp32 scratch, then added to the
 *                          grad view (an epilogue's output overwrites; the view accumulates).
 * The documented type rules decide the split: the aux matrix has D's type (floatX) and an
 * ld that is a multiple of 8, and a bias gradient has the output's (C's) type. So
 *   - GELU_AUX_BIAS / DGELU need OC % 8 == 0 (resp. C): other shapes run the separate
 *     kernels (matmul + gelu_forward / gelu_backward);
 *   - the bias gradient comes from the dW matmul (fp32 D: an fp32 bias gradient), never
 *     from DGELU_BGRAD, whose bias gradient would be floatX (bf16) in the BF16 build.
 * Where the heuristic has no algorithm for an epilogue (a GPU's cuBLASLt may lack one the
 * docs allow, e.g. for a bias or aux pointer it finds too little aligned) the plan remembers
 * it, says so once, and the separate kernels run: the plain matmul plus add_bias_kernel for
 * BIAS, gelu_forward / gelu_backward for GELU_AUX_BIAS / DGELU, bias_backward for BGRADB;
 * each of the backward's two is decided alone. The tests make the heuristic refuse on
 * purpose, so that both paths run and are checked.
 *
 * Plans (llmc/cuda_common.cuh MatmulPlan): one per distinct key (shape, transposes,
 * epilogue, types, beta == 0, the six alignments the heuristic was told, capped at
 * MATMUL_ALIGN_CAP), with its descriptor, layouts, preference and algorithm, made on first
 * use (the heuristic runs once per key) and freed by cuda_libs_free. Per call only the bias and aux pointers are
 * set on the plan's descriptor (cublasLtMatmul reads it when called).
 */
#ifndef LLMC_MATMUL_CUH
#define LLMC_MATMUL_CUH

#include "llmc/cuda_common.cuh"
#include "llmc/gelu.cuh"
#include "llmc/layernorm.cuh"  // colreduce_num_chunks

// The alignment the heuristic is told, in bytes: the pointer's, at most MATMUL_ALIGN_CAP.
// zero1/'s layouts give every parameter view at least 128 bytes (each parameter starts at a
// multiple of 64 elements), and a bf16 view may be 256-byte aligned in one layout and not in
// another (another --bucket-size, DP or padding).
// Told 256, a GPU's heuristic may pick another algorithm for that layout, with other bits;
// capped, every layout gives the same keys, so --dp-invariant's bits do not depend on it.
#define MATMUL_ALIGN_CAP 128
static inline int ptr_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    int align = MATMUL_ALIGN_CAP;
    while (align > 1 && (a % align) != 0) align >>= 1;
    return align;
}
// What the heuristic sees of a bias or aux pointer (it reads their alignment from the value,
// cublasLt.h): p itself, or p moved by the cap so that it is exactly MATMUL_ALIGN_CAP aligned.
// Never dereferenced; the call sets the real pointer, which is at least that aligned.
static inline const void* heuristic_view(const void* p) {
    return ((uintptr_t)p % (2 * MATMUL_ALIGN_CAP)) == 0 ? (const char*)p + MATMUL_ALIGN_CAP : p;
}

// What an epilogue adds to a matmul: the bias (read by BIAS*, written by BGRAD*) and the
// aux matrix (written by GELU_AUX*, read by DGELU*; m x n, ld m, D's type).
typedef struct {
    cublasLtEpilogue_t epilogue;
    const void* bias;
    cudaDataType_t bias_type;
    const void* aux;
} MatmulEpilogue;

static inline int epilogue_uses_bias(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_BGRADB;
}
static inline int epilogue_uses_aux(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}
// The documented rule for a GELU aux matrix: its ld (here the rows of D) a multiple of 8.
static inline int gelu_epilogue_allowed(int rows) { return rows % 8 == 0; }

static int matmul_keys_equal(const MatmulPlanKey* a, const MatmulPlanKey* b) { return memcmp(a, b, sizeof(*a)) == 0; }

// The plan for key, made (descriptors, one heuristic call) when it is new.
static MatmulPlan* matmul_plan_get(const MatmulPlanKey* key, const MatmulEpilogue* epi) {
    for (int i = 0; i < cuda_libs.num_plans; i++) {
        if (matmul_keys_equal(&cuda_libs.plans[i]->key, key)) return cuda_libs.plans[i];
    }
    if (cuda_libs.num_plans == cuda_libs.cap_plans) {
        int cap = cuda_libs.cap_plans ? 2 * cuda_libs.cap_plans : 32;
        MatmulPlan** grown = (MatmulPlan**)realloc(cuda_libs.plans, cap * sizeof(MatmulPlan*));
        if (!grown) fatal("out of host memory for %d cuBLASLt plans", cap);
        cuda_libs.plans = grown;
        cuda_libs.cap_plans = cap;
    }
    MatmulPlan* p = (MatmulPlan*)callocCheck(1, sizeof(MatmulPlan));
    p->key = *key;
    int m = key->m, n = key->n, k = key->k, ta = key->trans_a, tb = key->trans_b;
    cublasLtEpilogue_t e = (cublasLtEpilogue_t)key->epilogue;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)));
    if (epilogue_uses_bias(e)) {
        cudaDataType_t bias_type = (cudaDataType_t)key->bias_type;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof(bias_type)));
        // The heuristic reads the pointer's alignment (cublasLt.h, BIAS_POINTER): the capped one.
        const void* seen = heuristic_view(epi->bias);
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &seen, sizeof(seen)));
    }
    if (epilogue_uses_aux(e)) {
        int64_t aux_ld = m;
        cublasCheck(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        const void* seen = heuristic_view(epi->aux);
        cublasCheck(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &seen, sizeof(seen)));
    }
    cudaDataType_t d_type = (cudaDataType_t)key->d_type;
    cublasCheck(cublasLtMatrixLayoutCreate(&p->la, CUBLAS_FLOATX, ta ? k : m, ta ? m : k, ta ? k : m));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->lb, CUBLAS_FLOATX, tb ? n : k, tb ? k : n, tb ? n : k));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->ld, d_type, m, n, m));
    cublasCheck(cublasLtMatmulPreferenceCreate(&p->pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &cuda_libs.lt_workspace_size, sizeof(size_t)));
    // Views into the flat buffers need not be 256-byte aligned: tell the heuristic.
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        uint32_t al = (uint32_t)key->align[i];
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(p->pref, align_attr[i], &al, sizeof(al)));
    }
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    // No algorithm for a configuration comes back either as CUBLAS_STATUS_NOT_SUPPORTED or
    // as success with found == 0 (or a result whose state is not success).
    cuda_libs.heuristic_calls++;
    cublasStatus_t hst = cublasLtMatmulAlgoGetHeuristic(cuda_libs.cublaslt, p->desc, p->la, p->lb, p->ld, p->ld,
                                                        p->pref, 1, &heuristic, &found);
    if (hst != CUBLAS_STATUS_NOT_SUPPORTED) cublasCheck(hst);
    p->found = hst == CUBLAS_STATUS_SUCCESS && found > 0 && heuristic.state == CUBLAS_STATUS_SUCCESS;
    if (p->found) p->algo = heuristic.algo;
    cuda_libs.plans[cuda_libs.num_plans++] = p;
    return p;
}

// D (m,n) = alpha * op(A) op(B) + beta * C with an epilogue, column-major, C == D in memory.
// A is (k,m) if transA else (m,k); B is (n,k) if transB else (k,n) (stored shapes).
// Returns 0 without running when the epilogue is a fused one (fusable) and cuBLASLt has no
// algorithm for it: the caller runs separate kernels. Otherwise no algorithm is an error.
static int matmul_cublaslt_epilogue(void* d, cudaDataType_t d_type, const floatX* a, const floatX* b, int m, int n,
                                    int k, int transA, int transB, float beta, const MatmulEpilogue* epi, int fusable,
                                    cudaStream_t stream) {
    MatmulPlanKey key;
    memset(&key, 0, sizeof(key));  // no padding bytes of garbage: keys compare with memcmp
    key.m = m, key.n = n, key.k = k, key.trans_a = transA, key.trans_b = transB;
    key.epilogue = (int)epi->epilogue, key.d_type = (int)d_type, key.beta_zero = beta == 0.0f;
    key.bias_type = epilogue_uses_bias(epi->epilogue) ? (int)epi->bias_type : -1;
    key.align[0] = ptr_alignment(a), key.align[1] = ptr_alignment(b), key.align[2] = key.align[3] = ptr_alignment(d);
    key.align[4] = epilogue_uses_bias(epi->epilogue) ? ptr_alignment(epi->bias) : 0;
    key.align[5] = epilogue_uses_aux(epi->epilogue) ? ptr_alignment(epi->aux) : 0;
    MatmulPlan* p = matmul_plan_get(&key, epi);
    if (!p->found) {
        if (fusable) {
            if (!p->noted) {
                printf("note: cuBLASLt has no algorithm for epilogue %d at m=%d n=%d k=%d: separate kernels run\n",
                       key.epilogue, m, n, k);
                p->noted = 1;
            }
            return 0;
        }
        fatal("cuBLASLt has no algorithm for m=%d n=%d k=%d transA=%d transB=%d epilogue=%d out=%s", m, n, k, transA,
              transB, key.epilogue, d_type == CUDA_R_32F ? "fp32" : "bf16");
    }
    if (epilogue_uses_bias(epi->epilogue)) {
        cublasCheck(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi->bias, sizeof(epi->bias)));
    }
    if (epilogue_uses_aux(epi->epilogue)) {
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epi->aux,
                                                   sizeof(epi->aux)));
    }
    float alpha = 1.0f;
    cublasCheck(cublasLtMatmul(cuda_libs.cublaslt, p->desc, &alpha, a, p->la, b, p->lb, &beta, d, p->ld, d, p->ld,
                               &p->algo, cuda_libs.lt_workspace, cuda_libs.lt_workspace_size, stream));
    return 1;
}

// d (column-major m x n, floatX) += bias[row], rounded once more: the BIAS epilogue's work
// where cuBLASLt has no algorithm for it.
__global__ void add_bias_kernel(floatX* d, const floatX* bias, int m, size_t n_elements) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_elements) d[i] = from_float<floatX>(to_float(d[i]) + to_float(bias[i % (size_t)m]));
}

// The plain matmul, with the bias (floatX, may be NULL) as an epilogue, or added after it
// where cuBLASLt has no algorithm for the epilogue.
static void matmul_cublaslt(void* d, cudaDataType_t d_type, const floatX* a, const floatX* b, const floatX* bias,
                            int m, int n, int k, int transA, int transB, float beta, cudaStream_t stream) {
    MatmulEpilogue epi = {bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, CUBLAS_FLOATX, NULL};
    if (matmul_cublaslt_epilogue(d, d_type, a, b, m, n, k, transA, transB, beta, &epi, bias != NULL, stream)) return;
    if (d_type != CUBLAS_FLOATX || beta != 0.0f) fatal("matmul_cublaslt: a bias is added to a floatX output only");
    matmul_cublaslt(d, d_type, a, b, NULL, m, n, k, transA, transB, beta, stream);
    size_t n_elements = (size_t)m * n;
    add_bias_kernel<<<(unsigned)CEIL_DIV(n_elements, (size_t)256), 256, 0, stream>>>((floatX*)d, bias, m, n_elements);
    cudaCheckLaunch();
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

// dbias (OC, fp32 view) += column sums of dout (BT,OC), in two passes through scratch
// (colreduce_num_chunks(BT) * OC floats).
static void bias_backward(float* dbias, float* scratch, const floatX* dout, int BT, int OC, cudaStream_t stream) {
    int chunks = colreduce_num_chunks(BT);
    dim3 grid(CEIL_DIV(OC, 32), chunks), block(32, 8);
    bias_backward_partial_kernel<<<grid, block, 0, stream>>>(scratch, dout, BT, OC, CEIL_DIV(BT, chunks));
    cudaCheckLaunch();
    bias_backward_final_kernel<<<CEIL_DIV(OC, 256), 256, 0, stream>>>(dbias, scratch, chunks, OC);
    cudaCheckLaunch();
}

// dinp is overwritten; dweight and dbias (fp32 views, dbias may be NULL) accumulate.
// scratch: at least colreduce_num_chunks(BT) * OC floats (when dbias is given).
static void matmul_backward(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                            const floatX* inp, const floatX* weight, int BT, int C, int OC, cudaStream_t stream) {
    // dinp^T (C x BT) = W^T as stored (C x OC) @ dout^T (OC x BT)
    matmul_cublaslt(dinp, CUBLAS_FLOATX, weight, dout, NULL, C, BT, OC, 0, 0, 0.0f, stream);
    // dW^T (C x OC) += inp^T (C x BT) @ op_T(dout^T stored OC x BT)
    matmul_cublaslt(dweight, CUDA_R_32F, inp, dout, NULL, C, OC, BT, 0, 1, 1.0f, stream);
    if (dbias) bias_backward(dbias, scratch, dout, BT, OC, stream);
}

// ---- the fused kernels (header comment) ------------------------------------------------

// pre (BT,OC) = inp @ weight^T + bias (bias may be NULL), out = gelu(pre). One cuBLASLt call
// (GELU_AUX_BIAS) where the aux rule allows it, else matmul_forward and gelu_forward.
static void matmul_forward_gelu(floatX* out, floatX* pre, const floatX* inp, const floatX* weight, const floatX* bias,
                                int BT, int C, int OC, cudaStream_t stream) {
    if (gelu_epilogue_allowed(OC)) {
        MatmulEpilogue epi = {bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, bias, CUBLAS_FLOATX,
                              pre};
        if (matmul_cublaslt_epilogue(out, CUBLAS_FLOATX, weight, inp, OC, BT, C, 1, 0, 0.0f, &epi, 1, stream)) return;
    }
    matmul_forward(pre, inp, weight, bias, BT, C, OC, stream);
    gelu_forward(out, pre, (size_t)BT * OC, stream);
}

// As matmul_backward (same buffers, same contract), with the fused epilogues: gelu_pre
// (BT,C), when given, is the input of a GELU whose output was inp, and dinp becomes the
// gradient of that input, (dout @ W) * gelu'(gelu_pre). dbias (fp32 view, may be NULL)
// accumulates the column sums of dout through BGRADB; scratch: colreduce_num_chunks(BT) * OC
// floats, as for matmul_backward (the epilogue writes its first OC, the fallback all).
static void matmul_backward_fused(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                                  const floatX* inp, const floatX* weight, const floatX* gelu_pre, int BT, int C,
                                  int OC, cudaStream_t stream) {
    // dinp^T (C x BT) = W^T as stored (C x OC) @ dout^T (OC x BT), times gelu'(aux) per element
    MatmulEpilogue dgelu = {CUBLASLT_EPILOGUE_DGELU, NULL, CUBLAS_FLOATX, gelu_pre};
    int fused_dgelu = gelu_pre && gelu_epilogue_allowed(C) &&
                      matmul_cublaslt_epilogue(dinp, CUBLAS_FLOATX, weight, dout, C, BT, OC, 0, 0, 0.0f, &dgelu, 1,
                                               stream);
    if (!fused_dgelu) {
        matmul_cublaslt(dinp, CUBLAS_FLOATX, weight, dout, NULL, C, BT, OC, 0, 0, 0.0f, stream);
        if (gelu_pre) gelu_backward(dinp, gelu_pre, dinp, (size_t)BT * C, stream);
    }
    // dW^T (C x OC) += inp^T (C x BT) @ op_T(dout^T stored OC x BT); BGRADB: op(B) = dout
    // (BT x OC) summed over k = BT, one fp32 value per column of D, that is per output channel.
    MatmulEpilogue bgrad = {CUBLASLT_EPILOGUE_BGRADB, scratch, CUDA_R_32F, NULL};
    if (dbias && matmul_cublaslt_epilogue(dweight, CUDA_R_32F, inp, dout, C, OC, BT, 0, 1, 1.0f, &bgrad, 1, stream)) {
        bias_backward_final_kernel<<<CEIL_DIV(OC, 256), 256, 0, stream>>>(dbias, scratch, 1, OC);  // dbias += scratch
        cudaCheckLaunch();
        return;
    }
    matmul_cublaslt(dweight, CUDA_R_32F, inp, dout, NULL, C, OC, BT, 0, 1, 1.0f, stream);
    if (dbias) bias_backward(dbias, scratch, dout, BT, OC, stream);
}

#endif
