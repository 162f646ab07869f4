/*
 * Muon on the GPU (the formulas: llmc/muon.h). A plan (MuonPlan) holds groups of same-shaped
 * matrices, each matrix found by its own offsets into the grads, the momentum and the fp32
 * weights (MuonMatrixAt): the replicated trainer's dense buffers (muon_gpt2_plan, grouped as
 * llmc/muon_gpt2.h says) and ZeRO-1's owned matrices (zero1/device_cuda_muon.cu) drive the same
 * kernels. A step, per group:
 *   1. the momentum kernel: M updated in place, its result U into dense scratch (grads unread after);
 *   2. the Frobenius norms (one block per matrix, a double sum in a fixed order), X loaded
 *      (transposed where rows > cols, normalised), ns_steps Newton-Schulz iterations as
 *      strided-batched cuBLASLt GEMMs over the group's matrices;
 *   3. the update kernel, X read back untransposed: decay, scales, step into the fp32 weights,
 *      and (replicated) the params written from them as AdamW writes them (llmc/adamw.cuh's
 *      store_rounded: nearest even or stochastic).
 * Newton-Schulz is plain fp32 (CUBLAS_COMPUTE_32F on fp32 operands, no TF32) in every build;
 * with bf16 (--muon-ns-bf16, Megatron's "medium") X is rounded to bf16 once after the
 * normalisation and each GEMM takes and writes bf16, accumulating in fp32.
 */
#ifndef LLMC_MUON_CUH
#define LLMC_MUON_CUH

#include "llmc/adamw.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/muon_gpt2.h"

// A matrix of a Muon step where the kernels find it (element offsets): its gradient, its
// momentum and its fp32 weights (the master, or the fp32 params that are the master). Apart
// because ZeRO-1 keeps them apart (grads in the buffer, momentum and master owned); the
// replicated trainer's dense buffers give all three one offset. scale: muon_scale_factor.
typedef struct {
    size_t grad, momentum, weight;
    float scale;
} MuonMatrixAt;

// Same-shaped matrices orthogonalized together: each rows x cols as stored, at[count] on the host.
typedef struct {
    int rows, cols, count;
    const MuonMatrixAt* at;
} MuonGroupSpec;

// The three GEMMs of a Newton-Schulz iteration, as column-major cuBLASLt sees row-major X (r x c):
// Xc = X^T is c x r. GRAM: A = Xc^T Xc; POLY: B = c*(A A) + b*A; STEP: Xc' = Xc Bc + a*Xc.
enum { MUON_GEMM_GRAM, MUON_GEMM_POLY, MUON_GEMM_STEP, MUON_GEMMS };

// The cuBLASLt a plan's GEMMs run on (a handle per translation unit: cuda_libs is static).
typedef struct {
    cublasLtHandle_t lt;
    void* workspace;
    size_t workspace_size;
} MuonBlas;

typedef struct {
    int rows, cols, count;
    int r, c;                         // X: the matrix, transposed when rows > cols (r <= c)
    MuonMatrixAt* d_at;               // count, on the device
    cublasLtMatrixLayout_t lx, la;    // Xc (c x r) and A/B (r x r), count of each, back to back
    cublasLtMatmulAlgo_t algo[MUON_GEMMS];
} MuonGroupPlan;

// A Muon step's plan over fixed groups of matrices: GEMM algorithms, device offsets, scratch.
typedef struct {
    MuonConfig cfg;
    int bf16;                         // --muon-ns-bf16
    MuonBlas blas;
    int num_groups;
    MuonGroupPlan* groups;
    cublasLtMatmulDesc_t gram_desc, plain_desc;  // transposes (T, N) and (N, N)
    cublasLtMatmulPreference_t pref;
    void *x, *next, *a, *b;           // scratch for the largest group, fp32 or bf16 elements;
                                      // next holds the fp32 momentum result before X is loaded
    float* denoms;                    // max(||X||_F, eps) of each matrix of a group
} MuonPlan;

#define MUON_THREADS 256
#define MUON_MAX_BLOCKS 256u  // per matrix: the kernels loop over the rest

// Step 2 of llmc/muon.h for each matrix b of a group (blockIdx.y): u_b, dense, gets what
// Newton-Schulz orthogonalizes (the grads stay as they are).
static __global__ void __launch_bounds__(MUON_THREADS)
    muon_momentum_kernel(float* u, const float* grads, float* m, const MuonMatrixAt* at, size_t n,
                         const float* grad_scale, float momentum, int nesterov) {
    const MuonMatrixAt t = at[blockIdx.y];
    const float scale = grad_scale[0];
    float* dst = u + blockIdx.y * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = muon_momentum_element(grads[t.grad + i] * scale, &m[t.momentum + i], momentum, nesterov);
    }
}

// max(||U_b||_F, eps) of each matrix b (blockIdx.x) of n elements, dense in u.
static __global__ void __launch_bounds__(MUON_THREADS) muon_norm_kernel(float* denoms, const float* u, size_t n) {
    const float* x = u + blockIdx.x * n;
    double sum = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) sum += (double)x[i] * x[i];
    sum = block_reduce_sum_double(sum);
    if (threadIdx.x == 0) {
        float norm = (float)sqrt(sum);
        denoms[blockIdx.x] = norm > MUON_NORM_EPS ? norm : MUON_NORM_EPS;
    }
}

// Where element e (row-major rows x cols) of a matrix lies in X, transposed when rows > cols.
__device__ __forceinline__ size_t muon_x_index(size_t e, int rows, int cols) {
    return rows > cols ? (e % cols) * rows + e / cols : e;
}

// X_b = U_b / denom_b, transposed when rows > cols (blockIdx.y: b).
template <typename T>
static __global__ void __launch_bounds__(MUON_THREADS)
    muon_load_kernel(T* x, const float* u, const float* denoms, int rows, int cols) {
    const size_t n = (size_t)rows * cols, b = blockIdx.y;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        x[b * n + muon_x_index(e, rows, cols)] = from_float<T>(u[b * n + e] / denoms[b]);
    }
}

// Steps 1, 5 and 6 of llmc/muon.h for each matrix b (blockIdx.y), the orthogonalized X_b read
// back untransposed. params (NULL: none) get the new weights as AdamW writes them.
template <typename T>
static __global__ void __launch_bounds__(MUON_THREADS)
    muon_update_kernel(floatX* params, float* weights, const T* x, const MuonMatrixAt* at, int rows, int cols,
                       float extra_scale, float decay_factor, float step_factor, AdamWStep s) {
    const MuonMatrixAt t = at[blockIdx.y];
    const size_t n = (size_t)rows * cols;
    const T* o = x + blockIdx.y * n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t to = t.weight + e;
        float p = muon_update_element(weights[to], to_float(o[muon_x_index(e, rows, cols)]), t.scale, extra_scale,
                                      decay_factor, step_factor);
        weights[to] = p;
        if (params) store_rounded(&params[to], p, s, to);  // dense canonical: the model-space index
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

static void muon_plan_group(MuonPlan* mu, MuonGroupPlan* g, const MuonGroupSpec* spec, cudaStream_t stream) {
    g->rows = spec->rows;
    g->cols = spec->cols;
    g->count = spec->count;
    g->r = spec->rows < spec->cols ? spec->rows : spec->cols;
    g->c = spec->rows < spec->cols ? spec->cols : spec->rows;
    g->d_at = (MuonMatrixAt*)cudaMallocCheck((size_t)g->count * sizeof(MuonMatrixAt));
    // Synchronized on a stream: a plain cudaMemcpy from pageable memory may return before the
    // device has the data, and non-blocking streams do not wait for it.
    cudaCheck(cudaMemcpyAsync(g->d_at, spec->at, (size_t)g->count * sizeof(MuonMatrixAt), cudaMemcpyHostToDevice,
                              stream));
    cudaCheck(cudaStreamSynchronize(stream));
    cudaDataType_t type = mu->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    g->lx = muon_layout(type, g->c, g->r, g->count);
    g->la = muon_layout(type, g->r, g->r, g->count);
    for (int k = 0; k < MUON_GEMMS; k++) {
        cublasLtMatrixLayout_t l[3];
        muon_gemm_layouts(g, k, l);
        cublasLtMatmulHeuristicResult_t h;
        int found = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(mu->blas.lt, k == MUON_GEMM_GRAM ? mu->gram_desc : mu->plain_desc,
                                                   l[0], l[1], l[2], l[2], mu->pref, 1, &h, &found));
        if (found == 0 || h.state != CUBLAS_STATUS_SUCCESS) {
            fatal("cuBLASLt has no algorithm for Newton-Schulz's batched %s GEMM %d on %d matrices of %d x %d",
                  mu->bf16 ? "bf16" : "fp32", k, g->count, g->r, g->c);
        }
        g->algo[k] = h.algo;
    }
}

// Plans a step of the groups' matrices (their offsets copied to the device through stream,
// which this waits for), as cfg and bf16 say, its GEMMs on blas; scratch for the largest group.
static void muon_plan_init(MuonPlan* mu, const MuonGroupSpec* groups, int num_groups, const MuonConfig* cfg, int bf16,
                           MuonBlas blas, cudaStream_t stream) {
    memset(mu, 0, sizeof(*mu));
    mu->cfg = *cfg;
    mu->bf16 = bf16;
    mu->blas = blas;
    mu->gram_desc = muon_desc(CUBLAS_OP_T);
    mu->plain_desc = muon_desc(CUBLAS_OP_N);
    cublasCheck(cublasLtMatmulPreferenceCreate(&mu->pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(mu->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &blas.workspace_size, sizeof(size_t)));
    mu->num_groups = num_groups;
    mu->groups = (MuonGroupPlan*)callocCheck((size_t)(num_groups > 0 ? num_groups : 1), sizeof(MuonGroupPlan));
    size_t x = 1, a = 1, count = 1, bytes = bf16 ? 2 : 4;
    for (int k = 0; k < num_groups; k++) {
        muon_plan_group(mu, &mu->groups[k], &groups[k], stream);
        const MuonGroupPlan* g = &mu->groups[k];
        size_t nx = (size_t)g->count * g->rows * g->cols, na = (size_t)g->count * g->r * g->r;
        x = nx > x ? nx : x;
        a = na > a ? na : a;
        count = (size_t)g->count > count ? (size_t)g->count : count;
    }
    mu->x = cudaMallocCheck(x * bytes);
    mu->next = cudaMallocCheck(x * sizeof(float));
    mu->a = cudaMallocCheck(a * bytes);
    mu->b = cudaMallocCheck(a * bytes);
    mu->denoms = (float*)cudaMallocCheck(count * sizeof(float));
}

// One GEMM of an iteration: D = alpha op(A) op(B) + beta C (C unread at beta 0).
static void muon_gemm(const MuonPlan* mu, const MuonGroupPlan* g, int gemm, const void* a, const void* b, const void* c,
                      void* d, float alpha, float beta, cudaStream_t stream) {
    cublasLtMatrixLayout_t l[3];
    muon_gemm_layouts(g, gemm, l);
    cublasCheck(cublasLtMatmul(mu->blas.lt, gemm == MUON_GEMM_GRAM ? mu->gram_desc : mu->plain_desc, &alpha, a, l[0],
                               b, l[1], &beta, c, l[2], d, l[2], &g->algo[gemm], mu->blas.workspace,
                               mu->blas.workspace_size, stream));
}

// The whole step of group g (see the top); params as in muon_update_kernel.
template <typename T>
static void muon_step_group(MuonPlan* mu, const MuonGroupPlan* g, floatX* params, float* weights, const float* grads,
                            float* momentum, const AdamWStep* s, const float* grad_scale, cudaStream_t stream) {
    size_t n = (size_t)g->rows * g->cols;
    dim3 grid(muon_blocks(n), (unsigned)g->count);
    float* u = (float*)mu->next;
    muon_momentum_kernel<<<grid, MUON_THREADS, 0, stream>>>(u, grads, momentum, g->d_at, n, grad_scale,
                                                            mu->cfg.momentum, mu->cfg.nesterov);
    cudaCheckLaunch();
    muon_norm_kernel<<<g->count, MUON_THREADS, 0, stream>>>(mu->denoms, u, n);
    cudaCheckLaunch();
    muon_load_kernel<T><<<grid, MUON_THREADS, 0, stream>>>((T*)mu->x, u, mu->denoms, g->rows, g->cols);
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
    float decay_factor = (float)(-(double)s->weight_decay * (double)s->lr), step_factor = -s->lr;
    muon_update_kernel<T><<<grid, MUON_THREADS, 0, stream>>>(params, weights, (const T*)x, g->d_at, g->rows, g->cols,
                                                             mu->cfg.extra_scale, decay_factor, step_factor, *s);
    cudaCheckLaunch();
}

// One Muon step of every planned matrix: s gives the lr and weight decay (and the write-back's
// rounding when params is not NULL); grad_scale on the device (global_norm's clip factor).
static void muon_plan_step(MuonPlan* mu, floatX* params, float* weights, const float* grads, float* momentum,
                           const AdamWStep* s, const float* grad_scale, cudaStream_t stream) {
    for (int k = 0; k < mu->num_groups; k++) {
        const MuonGroupPlan* g = &mu->groups[k];
        if (mu->bf16) muon_step_group<__nv_bfloat16>(mu, g, params, weights, grads, momentum, s, grad_scale, stream);
        else muon_step_group<float>(mu, g, params, weights, grads, momentum, s, grad_scale, stream);
    }
}

static void muon_plan_free(MuonPlan* mu) {
    for (int k = 0; k < mu->num_groups; k++) {
        cudaCheck(cudaFree(mu->groups[k].d_at));
        cublasCheck(cublasLtMatrixLayoutDestroy(mu->groups[k].lx));
        cublasCheck(cublasLtMatrixLayoutDestroy(mu->groups[k].la));
    }
    free(mu->groups);
    cublasCheck(cublasLtMatmulDescDestroy(mu->gram_desc));
    cublasCheck(cublasLtMatmulDescDestroy(mu->plain_desc));
    cublasCheck(cublasLtMatmulPreferenceDestroy(mu->pref));
    void* all[] = {mu->x, mu->next, mu->a, mu->b, mu->denoms};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) cudaCheck(cudaFree(all[i]));
}

// The replicated trainer's plan: mc's Muon matrices in dense buffers at offsets (per tensor),
// grouped as llmc/muon_gpt2.h groups them, on cuda_libs' cuBLASLt.
static void muon_gpt2_plan(MuonPlan* mu, const GPT2Config* mc, const size_t* offsets, const MuonConfig* cfg, int bf16,
                           cudaStream_t stream) {
    MuonShapeGroup shapes[MUON_GPT2_GROUPS];
    muon_gpt2_groups(mc, cfg->split_qkv, shapes);
    MuonGroupSpec specs[MUON_GPT2_GROUPS];
    for (int k = 0; k < MUON_GPT2_GROUPS; k++) {
        const MuonShapeGroup* s = &shapes[k];
        MuonMatrixAt* at = (MuonMatrixAt*)mallocCheck((size_t)s->count * sizeof(MuonMatrixAt));
        float scale = muon_scale_factor(cfg->scale, s->rows, s->cols);
        for (int l = 0; l < mc->num_layers; l++) {
            for (int p = 0; p < s->parts; p++) {
                size_t o = offsets[gpt2_idx_layer(l, s->kind)] + (size_t)p * s->rows * s->cols;
                MuonMatrixAt m = {o, o, o, scale};
                at[l * s->parts + p] = m;
            }
        }
        MuonGroupSpec spec = {s->rows, s->cols, s->count, at};
        specs[k] = spec;
    }
    MuonBlas blas = {cuda_libs.cublaslt, cuda_libs.lt_workspace, cuda_libs.lt_workspace_size};
    muon_plan_init(mu, specs, MUON_GPT2_GROUPS, cfg, bf16, blas, stream);
    for (int k = 0; k < MUON_GPT2_GROUPS; k++) free((void*)specs[k].at);
}

#endif
