/*
 * Muon on the GPU (the formulas: llmc/muon.h; the shape groups: llmc/muon_gpt2.h). A step of
 * every Muon matrix of the model:
 *   1. one momentum kernel over all of them; its result, what Newton-Schulz orthogonalizes,
 *      overwrites the gradient (the step needs that no more, and no buffer of that size is added);
 *   2. per shape group: the Frobenius norms (one block per matrix, a double sum in a fixed order),
 *      X loaded (transposed where rows > cols, normalised), ns_steps Newton-Schulz iterations as
 *      strided-batched cuBLASLt GEMMs over the group's matrices, X stored back (transposed back);
 *   3. one update kernel: decay, scales, step into the fp32 master, and the params written from it
 *      as AdamW writes them (llmc/adamw.cuh's store_rounded: nearest even or stochastic).
 * Newton-Schulz is plain fp32 (CUBLAS_COMPUTE_32F on fp32 operands, no TF32) in every build;
 * with bf16 (--muon-ns-bf16, Megatron's "medium") X is rounded to bf16 once after the
 * normalisation and each GEMM takes and writes bf16, accumulating in fp32.
 */
#ifndef LLMC_MUON_CUH
#define LLMC_MUON_CUH

#include "llmc/adamw.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/muon_gpt2.h"

typedef struct {
    size_t offset, numel;  // a Muon tensor in the dense buffers
    float scale;           // muon_scale_factor of the matrices it is orthogonalized as
} MuonTensorRun;

// The three GEMMs of a Newton-Schulz iteration, as column-major cuBLASLt sees row-major X (r x c):
// Xc = X^T is c x r. GRAM: A = Xc^T Xc; POLY: B = c*(A A) + b*A; STEP: Xc' = Xc Bc + a*Xc.
enum { MUON_GEMM_GRAM, MUON_GEMM_POLY, MUON_GEMM_STEP, MUON_GEMMS };

typedef struct {
    MuonShapeGroup shape;
    int r, c;                         // X: the matrix, transposed when rows > cols (r <= c)
    size_t* d_offsets;                // count: each matrix's start in the dense buffers
    cublasLtMatrixLayout_t lx, la;    // Xc (c x r) and A/B (r x r), count of each, back to back
    cublasLtMatmulAlgo_t algo[MUON_GEMMS];
} MuonGroupPlan;

typedef struct {
    MuonConfig cfg;
    int bf16;                         // --muon-ns-bf16
    int num_tensors;
    size_t max_numel;
    MuonTensorRun* d_tensors;
    MuonGroupPlan groups[MUON_GPT2_GROUPS];
    cublasLtMatmulDesc_t gram_desc, plain_desc;  // transposes (T, N) and (N, N)
    cublasLtMatmulPreference_t pref;
    void *x, *next, *a, *b;           // scratch, fp32 or bf16 elements
    float* denoms;                    // max(||X||_F, eps) of each matrix of a group
} MuonGpu;

#define MUON_THREADS 256
#define MUON_MAX_BLOCKS 256u  // per matrix: the kernels loop over the rest

// Step 2 of llmc/muon.h over every Muon tensor (blockIdx.y one of them).
__global__ void __launch_bounds__(MUON_THREADS)
    muon_momentum_kernel(float* grads, float* m, const MuonTensorRun* tensors, const float* grad_scale,
                                     float momentum, int nesterov) {
    const MuonTensorRun t = tensors[blockIdx.y];
    const float scale = grad_scale[0];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < t.numel; i += (size_t)gridDim.x * blockDim.x) {
        size_t at = t.offset + i;
        grads[at] = muon_momentum_element(grads[at] * scale, &m[at], momentum, nesterov);
    }
}

// max(||U_b||_F, eps) of each matrix b of a group (blockIdx.x), n elements each.
__global__ void __launch_bounds__(MUON_THREADS)
    muon_norm_kernel(float* denoms, const float* u, const size_t* offsets, size_t n) {
    const float* x = u + offsets[blockIdx.x];
    double sum = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) sum += (double)x[i] * x[i];
    sum = block_reduce_sum_double(sum);
    if (threadIdx.x == 0) {
        float norm = (float)sqrt(sum);
        denoms[blockIdx.x] = norm > MUON_NORM_EPS ? norm : MUON_NORM_EPS;
    }
}

// X_b = U_b / denom_b, transposed when rows > cols (blockIdx.y: b).
template <typename T>
__global__ void __launch_bounds__(MUON_THREADS)
    muon_load_kernel(T* x, const float* u, const size_t* offsets, const float* denoms, int rows, int cols) {
    const size_t n = (size_t)rows * cols, b = blockIdx.y;
    const float* src = u + offsets[b];
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / cols, j = e % cols, to = rows > cols ? j * rows + i : e;
        x[b * n + to] = from_float<T>(src[e] / denoms[b]);
    }
}

// U_b = X_b, transposed back.
template <typename T>
__global__ void __launch_bounds__(MUON_THREADS)
    muon_store_kernel(float* u, const T* x, const size_t* offsets, int rows, int cols) {
    const size_t n = (size_t)rows * cols, b = blockIdx.y;
    float* dst = u + offsets[b];
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / cols, j = e % cols, from = rows > cols ? j * rows + i : e;
        dst[e] = to_float(x[b * n + from]);
    }
}

// Steps 1, 5 and 6 of llmc/muon.h over every Muon tensor: o is the orthogonalized momentum.
__global__ void __launch_bounds__(MUON_THREADS)
    muon_update_kernel(floatX* params, float* master, const float* o, const MuonTensorRun* tensors,
                                   float extra_scale, float decay_factor, float step_factor, AdamWStep s) {
    const MuonTensorRun t = tensors[blockIdx.y];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < t.numel; i += (size_t)gridDim.x * blockDim.x) {
        size_t at = t.offset + i;
        float p = muon_update_element(master[at], o[at], t.scale, extra_scale, decay_factor, step_factor);
        master[at] = p;
        store_rounded(&params[at], p, s, at);  // dense canonical: the model-space index
    }
}

static unsigned muon_blocks(size_t n) {
    size_t blocks = CEIL_DIV(n, (size_t)MUON_THREADS);
    return (unsigned)(blocks < MUON_MAX_BLOCKS ? blocks : MUON_MAX_BLOCKS);
}

static cublasLtMatrixLayout_t muon_layout(cudaDataType_t type, int rows, int cols, int count) {
    cublasLtMatrixLayout_t l;
    int64_t stride = (int64_t)rows * cols;
    cublasCheck(cublasLtMatrixLayoutCreate(&l, type, rows, cols, rows));
    cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    return l;
}

static cublasLtMatmulDesc_t muon_desc(cublasOperation_t trans_a) {
    cublasLtMatmulDesc_t d;
    cublasOperation_t n = CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
    return d;
}

// The operands' layouts of each GEMM (A, B, then C = D).
static void muon_gemm_layouts(const MuonGroupPlan* g, int gemm, cublasLtMatrixLayout_t l[3]) {
    l[0] = gemm == MUON_GEMM_POLY ? g->la : g->lx;
    l[1] = gemm == MUON_GEMM_GRAM ? g->lx : g->la;
    l[2] = gemm == MUON_GEMM_STEP ? g->lx : g->la;
}

static void muon_plan_group(MuonGpu* mu, MuonGroupPlan* g, const size_t* offsets, const GPT2Config* mc) {
    const MuonShapeGroup* s = &g->shape;
    g->r = s->rows < s->cols ? s->rows : s->cols;
    g->c = s->rows < s->cols ? s->cols : s->rows;
    size_t* host = (size_t*)mallocCheck((size_t)s->count * sizeof(size_t));
    for (int l = 0; l < mc->num_layers; l++) {
        for (int p = 0; p < s->parts; p++) {
            host[l * s->parts + p] = offsets[gpt2_idx_layer(l, s->kind)] + (size_t)p * s->rows * s->cols;
        }
    }
    g->d_offsets = (size_t*)cudaMallocCheck((size_t)s->count * sizeof(size_t));
    cudaCheck(cudaMemcpy(g->d_offsets, host, (size_t)s->count * sizeof(size_t), cudaMemcpyHostToDevice));
    free(host);
    cudaDataType_t type = mu->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    g->lx = muon_layout(type, g->c, g->r, s->count);
    g->la = muon_layout(type, g->r, g->r, s->count);
    for (int k = 0; k < MUON_GEMMS; k++) {
        cublasLtMatrixLayout_t l[3];
        muon_gemm_layouts(g, k, l);
        cublasLtMatmulHeuristicResult_t h;
        int found = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(cuda_libs.cublaslt, k == MUON_GEMM_GRAM ? mu->gram_desc : mu->plain_desc,
                                                   l[0], l[1], l[2], l[2], mu->pref, 1, &h, &found));
        if (found == 0 || h.state != CUBLAS_STATUS_SUCCESS) {
            fatal("cuBLASLt has no algorithm for Newton-Schulz's batched %s GEMM %d on %d matrices of %d x %d",
                  mu->bf16 ? "bf16" : "fp32", k, s->count, g->r, g->c);
        }
        g->algo[k] = h.algo;
    }
}

// mc's Muon matrices in dense buffers at offsets (per tensor), as cfg and bf16 say.
static void muon_gpu_init(MuonGpu* mu, const GPT2Config* mc, const size_t* offsets, const MuonConfig* cfg, int bf16) {
    memset(mu, 0, sizeof(*mu));
    mu->cfg = *cfg;
    mu->bf16 = bf16;
    MuonShapeGroup shapes[MUON_GPT2_GROUPS];
    muon_gpt2_groups(mc, cfg->split_qkv, shapes);
    mu->num_tensors = MUON_GPT2_GROUPS * mc->num_layers;
    MuonTensorRun* runs = (MuonTensorRun*)mallocCheck((size_t)mu->num_tensors * sizeof(MuonTensorRun));
    for (int l = 0; l < mc->num_layers; l++) {
        for (int k = 0; k < MUON_GPT2_GROUPS; k++) {
            int idx = gpt2_idx_layer(l, shapes[k].kind);
            MuonTensorRun t = {offsets[idx], gpt2_tensor_numel(mc, idx),
                               muon_scale_factor(cfg->scale, shapes[k].rows, shapes[k].cols)};
            runs[l * MUON_GPT2_GROUPS + k] = t;
            if (t.numel > mu->max_numel) mu->max_numel = t.numel;
        }
    }
    mu->d_tensors = (MuonTensorRun*)cudaMallocCheck((size_t)mu->num_tensors * sizeof(MuonTensorRun));
    cudaCheck(cudaMemcpy(mu->d_tensors, runs, (size_t)mu->num_tensors * sizeof(MuonTensorRun), cudaMemcpyHostToDevice));
    free(runs);
    mu->gram_desc = muon_desc(CUBLAS_OP_T);
    mu->plain_desc = muon_desc(CUBLAS_OP_N);
    cublasCheck(cublasLtMatmulPreferenceCreate(&mu->pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(mu->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &cuda_libs.lt_workspace_size, sizeof(size_t)));
    int max_count = 0;
    for (int k = 0; k < MUON_GPT2_GROUPS; k++) {
        mu->groups[k].shape = shapes[k];
        muon_plan_group(mu, &mu->groups[k], offsets, mc);
        if (shapes[k].count > max_count) max_count = shapes[k].count;
    }
    size_t x, a, bytes = bf16 ? 2 : 4;
    muon_gpt2_batched_work(mc, cfg->split_qkv, &x, &a);
    mu->x = cudaMallocCheck(x * bytes);
    mu->next = cudaMallocCheck(x * bytes);
    mu->a = cudaMallocCheck(a * bytes);
    mu->b = cudaMallocCheck(a * bytes);
    mu->denoms = (float*)cudaMallocCheck((size_t)max_count * sizeof(float));
}

// One GEMM of an iteration: D = alpha op(A) op(B) + beta C (C unread at beta 0).
static void muon_gemm(const MuonGpu* mu, const MuonGroupPlan* g, int gemm, const void* a, const void* b, const void* c,
                      void* d, float alpha, float beta, cudaStream_t stream) {
    cublasLtMatrixLayout_t l[3];
    muon_gemm_layouts(g, gemm, l);
    cublasCheck(cublasLtMatmul(cuda_libs.cublaslt, gemm == MUON_GEMM_GRAM ? mu->gram_desc : mu->plain_desc, &alpha, a,
                               l[0], b, l[1], &beta, c, l[2], d, l[2], &g->algo[gemm], cuda_libs.lt_workspace,
                               cuda_libs.lt_workspace_size, stream));
}

// Steps 3 and 4 of llmc/muon.h for every matrix of group g, in place in u (the momentum's result).
template <typename T>
static void muon_orthogonalize_group(MuonGpu* mu, const MuonGroupPlan* g, float* u, cudaStream_t stream) {
    const MuonShapeGroup* s = &g->shape;
    size_t n = (size_t)s->rows * s->cols;
    dim3 grid(muon_blocks(n), (unsigned)s->count);
    muon_norm_kernel<<<s->count, MUON_THREADS, 0, stream>>>(mu->denoms, u, g->d_offsets, n);
    cudaCheckLaunch();
    muon_load_kernel<T><<<grid, MUON_THREADS, 0, stream>>>((T*)mu->x, u, g->d_offsets, mu->denoms, s->rows, s->cols);
    cudaCheckLaunch();
    void *x = mu->x, *next = mu->next;
    for (int step = 0; step < mu->cfg.ns_steps; step++) {
        float abc[3];
        muon_ns_coefficients(mu->cfg.coefficients, step, abc);
        muon_gemm(mu, g, MUON_GEMM_GRAM, x, x, mu->a, mu->a, 1.0f, 0.0f, stream);          // A = X X^T
        muon_gemm(mu, g, MUON_GEMM_POLY, mu->a, mu->a, mu->a, mu->b, abc[2], abc[1], stream);  // B = bA + cAA
        muon_gemm(mu, g, MUON_GEMM_STEP, x, mu->b, x, next, 1.0f, abc[0], stream);          // X = aX + BX
        void* t = x;
        x = next;
        next = t;
    }
    muon_store_kernel<T><<<grid, MUON_THREADS, 0, stream>>>(u, (const T*)x, g->d_offsets, s->rows, s->cols);
    cudaCheckLaunch();
}

// One Muon step of every Muon matrix: grads (overwritten, see the top), momentum, master and
// params dense canonical; s: this step's lr, weight decay and write-back rounding; grad_scale
// on the device (global_norm's clip factor).
static void muon_gpu_step(MuonGpu* mu, floatX* params, float* master, float* grads, float* momentum, const AdamWStep* s,
                          const float* grad_scale, cudaStream_t stream) {
    dim3 all(muon_blocks(mu->max_numel), (unsigned)mu->num_tensors);
    muon_momentum_kernel<<<all, MUON_THREADS, 0, stream>>>(grads, momentum, mu->d_tensors, grad_scale,
                                                           mu->cfg.momentum, mu->cfg.nesterov);
    cudaCheckLaunch();
    for (int k = 0; k < MUON_GPT2_GROUPS; k++) {
        if (mu->bf16) muon_orthogonalize_group<__nv_bfloat16>(mu, &mu->groups[k], grads, stream);
        else muon_orthogonalize_group<float>(mu, &mu->groups[k], grads, stream);
    }
    float decay_factor = (float)(-(double)s->weight_decay * (double)s->lr), step_factor = -s->lr;
    muon_update_kernel<<<all, MUON_THREADS, 0, stream>>>(params, master, grads, mu->d_tensors, mu->cfg.extra_scale,
                                                         decay_factor, step_factor, *s);
    cudaCheckLaunch();
}

static void muon_gpu_free(MuonGpu* mu) {
    for (int k = 0; k < MUON_GPT2_GROUPS; k++) {
        cudaCheck(cudaFree(mu->groups[k].d_offsets));
        cublasCheck(cublasLtMatrixLayoutDestroy(mu->groups[k].lx));
        cublasCheck(cublasLtMatrixLayoutDestroy(mu->groups[k].la));
    }
    cublasCheck(cublasLtMatmulDescDestroy(mu->gram_desc));
    cublasCheck(cublasLtMatmulDescDestroy(mu->plain_desc));
    cublasCheck(cublasLtMatmulPreferenceDestroy(mu->pref));
    void* all[] = {mu->d_tensors, mu->x, mu->next, mu->a, mu->b, mu->denoms};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) cudaCheck(cudaFree(all[i]));
}

#endif
