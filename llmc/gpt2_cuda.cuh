/*
 * GPT-2 on the GPU: floatX (bf16, or fp32 with PRECISION=FP32) activations, forward and
 * backward on one compute stream, with the layer kernels of llmc/*.cuh.
 *
 * As on the CPU (llmc/gpt2_cpu.h), the model does not own its parameters or gradients:
 * the trainer binds a floatX param buffer and an fp32 grad buffer with an offset per
 * canonical tensor, so an optimizer (zero1/ included) chooses the layout; the backward
 * kernels accumulate straight into the grad views. The model calls llmc/model_hooks.h's
 * hooks at the same points as the CPU model; they run when the kernels are queued, and the
 * model itself never waits for the device.
 */
#ifndef LLMC_GPT2_CUDA_CUH
#define LLMC_GPT2_CUDA_CUH

#include "llmc/gpt2_kernels.h"
#include "llmc/gpt2_spec.h"
#include "llmc/model_hooks.h"
#include "llmc/utils.h"

#include "llmc/cuda_common.cuh"
#include "llmc/attention.cuh"
#include "llmc/classifier.cuh"
#include "llmc/encoder.cuh"
#include "llmc/gelu.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/residual.cuh"
#ifdef USE_CUDNN
#include "llmc/cudnn_attention.h"
#endif

// Per-layer slices are indexed by layer first. floatX unless noted.
typedef struct {
    floatX* encoded;                    // (B,T,C)
    floatX* ln1;                        // (L,B,T,C)
    float *ln1_mean, *ln1_rstd;         // (L,B,T) fp32
    floatX* qkv;                        // (L,B,T,3C)
    floatX* atty;                       // (L,B,T,C)
    floatX* att;                        // (L,B,NH,T,T), when the attention materialises scores
    float* att_lse;                     // (L,B,NH,T) fp32 logsumexp per row, when it does not
    floatX* residual2;                  // (L,B,T,C)
    floatX* ln2;                        // (L,B,T,C)
    float *ln2_mean, *ln2_rstd;
    floatX *fch, *fch_gelu;             // (L,B,T,4C)
    floatX* residual3;                  // (L,B,T,C)
    floatX* lnf;                        // (B,T,C)
    float *lnf_mean, *lnf_rstd;
    floatX* logits;                     // (B,T,Vp); the backward turns it into dlogits
    float* losses;                      // (B,T) fp32
    float* lse;                         // (B,T) fp32 logsumexp per row
} GPUActivations;

// Scratch reused by every layer, forward and backward.
typedef struct {
    floatX* btc;             // (B,T,C): attproj / fcproj outputs, dinp of matmuls
    floatX* dresidual;       // (B,T,C)
    floatX* dqkv;            // (B,T,3C)
    floatX* dfch;            // (B,T,4C)
    // The naive attention's alone (llmc/gpt2_kernels.h: gpt2_attention_materialises_scores):
    floatX* qkvr;            // 3*(B,T,C) permuted q,k,v
    floatX* dqkvr;           // 3*(B,T,C)
    floatX* perm;            // (B,T,C) attention output / dout permuted
    float* scores;           // (B,NH,T,T) fp32: preatt in forward, datt in backward
    floatX* dpreatt;         // (B,NH,T,T)
    float* colreduce;        // fp32 partial sums of the bias / LayerNorm reductions
    double* norm_partial;    // GLOBAL_NORM_BLOCKS
} GPUScratch;

typedef struct {
    GPT2Config config;
    int num_tensors;
    floatX** param;          // device views into the bound param buffer, canonical order
    float** grad;            // device views into the bound fp32 grad buffer
    int max_B, max_T;
    GPUActivations acts;
    GPUScratch scratch;
    int B, T;                // shape of the last forward
    const int* inputs;       // host, of the last forward (borrowed)
    int has_targets;
    int *d_inputs, *d_targets;
    EncoderBackwardPlan enc_plan;
    float* d_loss;           // device scalar: the forward adds its mean loss here
    GPT2Kernels kernels;     // which kernels run (llmc/gpt2_kernels.h), fixed at gpt2_init
    ModelHooks hooks;        // llmc/model_hooks.h; all members may be NULL
    cudaStream_t stream;     // the one compute stream
} GPT2;

static floatX* alloc_x(size_t n) { return (floatX*)cudaMallocCheck(n * sizeof(floatX)); }
static float* alloc_f(size_t n) { return (float*)cudaMallocCheck(n * sizeof(float)); }

static void gpt2_init(GPT2* m, const GPT2Config* cfg, int B, int T, cudaStream_t stream, const GPT2Kernels* kernels) {
    memset(m, 0, sizeof(*m));
    m->config = *cfg;
    m->kernels = *kernels;
    m->num_tensors = gpt2_num_tensors(cfg);
    m->param = (floatX**)callocCheck(m->num_tensors, sizeof(floatX*));
    m->grad = (float**)callocCheck(m->num_tensors, sizeof(float*));
    m->max_B = B;
    m->max_T = T;
    m->stream = stream;
    size_t L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T, att = (size_t)B * NH * T * T, lse = (size_t)B * NH * T;
    int scores = gpt2_attention_materialises_scores(kernels);
    GPUActivations* a = &m->acts;
    a->encoded = alloc_x(BT * C);
    a->ln1 = alloc_x(L * BT * C);
    a->ln1_mean = alloc_f(L * BT);
    a->ln1_rstd = alloc_f(L * BT);
    a->qkv = alloc_x(L * BT * 3 * C);
    a->atty = alloc_x(L * BT * C);
    a->att = scores ? alloc_x(L * att) : NULL;
    a->att_lse = scores ? NULL : alloc_f(L * lse);
    a->residual2 = alloc_x(L * BT * C);
    a->ln2 = alloc_x(L * BT * C);
    a->ln2_mean = alloc_f(L * BT);
    a->ln2_rstd = alloc_f(L * BT);
    a->fch = alloc_x(L * BT * 4 * C);
    a->fch_gelu = alloc_x(L * BT * 4 * C);
    a->residual3 = alloc_x(L * BT * C);
    a->lnf = alloc_x(BT * C);
    a->lnf_mean = alloc_f(BT);
    a->lnf_rstd = alloc_f(BT);
    a->logits = alloc_x(BT * Vp);
    a->losses = alloc_f(BT);
    a->lse = alloc_f(BT);
    GPUScratch* s = &m->scratch;
    s->btc = alloc_x(BT * C);
    s->dresidual = alloc_x(BT * C);
    s->dqkv = alloc_x(BT * 3 * C);
    s->dfch = alloc_x(BT * 4 * C);
    s->qkvr = scores ? alloc_x(3 * BT * C) : NULL;
    s->dqkvr = scores ? alloc_x(3 * BT * C) : NULL;
    s->perm = scores ? alloc_x(BT * C) : NULL;
    s->scores = scores ? alloc_f(att) : NULL;
    s->dpreatt = scores ? alloc_x(att) : NULL;
    // bias reductions need chunks*OC (OC <= 4C), LayerNorm 2*chunks*C
    s->colreduce = alloc_f((size_t)colreduce_num_chunks((int)BT) * 4 * C);
    s->norm_partial = (double*)cudaMallocCheck(GLOBAL_NORM_BLOCKS * sizeof(double));
    m->d_inputs = (int*)cudaMallocCheck(BT * sizeof(int));
    m->d_targets = (int*)cudaMallocCheck(BT * sizeof(int));
    encoder_plan_init(&m->enc_plan, (int)BT);
    m->d_loss = alloc_f(1);
    cudaCheck(cudaMemsetAsync(m->d_loss, 0, sizeof(float), stream));
}

static void gpt2_bind_buffers(GPT2* m, floatX* params, float* grads, const size_t* offsets) {
    for (int i = 0; i < m->num_tensors; i++) {
        m->param[i] = params + offsets[i];
        m->grad[i] = grads ? grads + offsets[i] : NULL;
    }
}

static void gpt2_free(GPT2* m) {
    void* all[] = {m->acts.encoded, m->acts.ln1, m->acts.ln1_mean, m->acts.ln1_rstd, m->acts.qkv, m->acts.atty,
                   m->acts.att, m->acts.att_lse, m->acts.residual2, m->acts.ln2, m->acts.ln2_mean, m->acts.ln2_rstd,
                   m->acts.fch, m->acts.fch_gelu, m->acts.residual3, m->acts.lnf, m->acts.lnf_mean, m->acts.lnf_rstd,
                   m->acts.logits, m->acts.losses, m->acts.lse, m->scratch.btc, m->scratch.dresidual,
                   m->scratch.dqkv, m->scratch.dfch, m->scratch.qkvr, m->scratch.dqkvr, m->scratch.perm,
                   m->scratch.scores, m->scratch.dpreatt, m->scratch.colreduce, m->scratch.norm_partial,
                   m->d_inputs, m->d_targets, m->d_loss};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) cudaCheck(cudaFree(all[i]));
#ifdef USE_CUDNN
    if (m->kernels.attention == ATTENTION_CUDNN) cudnn_attention_free();
#endif
    encoder_plan_free(&m->enc_plan);
    free(m->param);
    free(m->grad);
}

// Layer l's slice of acts.att_lse (its per-layer stride is the allocated shape's).
static float* gpt2_att_lse(const GPT2* m, int l) {
    return m->acts.att_lse + (size_t)l * m->max_B * m->config.num_heads * m->max_T;
}

// Forward on host inputs (B,T); with targets, also adds the mean loss into m->d_loss
// (the caller zeroes it when a new sum starts). Nothing is read back.
static void gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config* c = &m->config;
    if (B > m->max_B || T > m->max_T || (size_t)B * T > (size_t)m->max_B * m->max_T) {
        fatal("forward with B=%d T=%d exceeds the allocated B=%d T=%d", B, T, m->max_B, m->max_T);
    }
    cudaStream_t st = m->stream;
    int L = c->num_layers, C = c->channels, NH = c->num_heads, V = c->vocab_size, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t att = (size_t)m->max_B * NH * m->max_T * m->max_T;  // per-layer stride of acts.att
    m->B = B;
    m->T = T;
    m->inputs = inputs;
    m->has_targets = targets != NULL;
    GPUActivations* a = &m->acts;
    GPUScratch* s = &m->scratch;
    // From pageable memory: returns once staged, so the loader may reuse its buffers.
    cudaCheck(cudaMemcpyAsync(m->d_inputs, inputs, BT * sizeof(int), cudaMemcpyHostToDevice, st));
    if (targets) cudaCheck(cudaMemcpyAsync(m->d_targets, targets, BT * sizeof(int), cudaMemcpyHostToDevice, st));

    HOOK(m, forward_block_begin, -1);
    encoder_forward(a->encoded, m->d_inputs, m->param[gpt2_idx_wte()], m->param[gpt2_idx_wpe()], B, T, C, st);
    HOOK(m, forward_block_end, -1);
    for (int l = 0; l < L; l++) {
        HOOK(m, forward_block_begin, l);
        floatX* const* p = &m->param[gpt2_idx_layer(l, 0)];
        const floatX* residual = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * BT * C;
        floatX* ln1 = a->ln1 + l * BT * C;
        floatX* qkv = a->qkv + l * BT * 3 * C;
        floatX* atty = a->atty + l * BT * C;
        floatX* residual2 = a->residual2 + l * BT * C;
        floatX* ln2 = a->ln2 + l * BT * C;
        floatX* fch = a->fch + l * BT * 4 * C;
        floatX* fch_gelu = a->fch_gelu + l * BT * 4 * C;
        layernorm_forward(ln1, a->ln1_mean + l * BT, a->ln1_rstd + l * BT, residual, p[LAYER_LN1W], p[LAYER_LN1B], B, T,
                          C, st);
        matmul_forward(qkv, ln1, p[LAYER_QKVW], p[LAYER_QKVB], (int)BT, C, 3 * C, st);
#ifdef USE_CUDNN
        if (m->kernels.attention == ATTENTION_CUDNN)
            attention_forward_cudnn(atty, gpt2_att_lse(m, l), qkv, B, T, NH, C / NH, 1.0f / sqrtf((float)(C / NH)), st);
        else
#endif
        attention_forward(atty, s->qkvr, s->perm, s->scores, a->att + l * att, qkv, B, T, C, NH, st);
        matmul_forward(s->btc, atty, p[LAYER_ATTPROJW], p[LAYER_ATTPROJB], (int)BT, C, C, st);
        residual_forward(residual2, residual, s->btc, BT * C, st);
        layernorm_forward(ln2, a->ln2_mean + l * BT, a->ln2_rstd + l * BT, residual2, p[LAYER_LN2W], p[LAYER_LN2B], B,
                          T, C, st);
        matmul_forward(fch, ln2, p[LAYER_FCW], p[LAYER_FCB], (int)BT, C, 4 * C, st);
        gelu_forward(fch_gelu, fch, BT * 4 * C, st);
        matmul_forward(s->btc, fch_gelu, p[LAYER_FCPROJW], p[LAYER_FCPROJB], (int)BT, 4 * C, C, st);
        residual_forward(a->residual3 + l * BT * C, residual2, s->btc, BT * C, st);
        HOOK(m, forward_block_end, l);
    }
    HOOK(m, forward_block_begin, L);
    const floatX* last = a->residual3 + (size_t)(L - 1) * BT * C;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, last, m->param[gpt2_idx_lnfw(c)], m->param[gpt2_idx_lnfb(c)], B,
                      T, C, st);
    matmul_forward(a->logits, a->lnf, m->param[gpt2_idx_wte()], NULL, (int)BT, C, Vp, st);
    if (targets) crossentropy_forward(a->losses, a->lse, m->d_loss, 1, a->logits, m->d_targets, (int)BT, V, Vp, st);
    HOOK(m, forward_block_end, L);
}

// Backward of the last forward (which had targets). loss_scale = d(objective)/d(loss at
// one position): 1/(B*T) alone, 1/(B*T*k*DP) for k micro-steps on DP ranks.
// Gradients accumulate into the bound fp32 grad buffer views.
static void gpt2_backward(GPT2* m, float loss_scale) {
    const GPT2Config* c = &m->config;
    if (!m->has_targets) fatal("gpt2_backward needs a forward with targets");
    cudaStream_t st = m->stream;
    int B = m->B, T = m->T, L = c->num_layers, C = c->channels, NH = c->num_heads;
    int V = c->vocab_size, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t att = (size_t)m->max_B * NH * m->max_T * m->max_T;
    GPUActivations* a = &m->acts;
    GPUScratch* s = &m->scratch;
    int wte = gpt2_idx_wte(), wpe = gpt2_idx_wpe(), lnfw = gpt2_idx_lnfw(c), lnfb = gpt2_idx_lnfb(c);
    // Host work first, so its upload is queued early and the host is free afterwards.
    encoder_plan_build(&m->enc_plan, m->inputs, (int)BT, st);

    HOOK(m, backward_block_begin, L);
    floatX* dlogits = a->logits;
    crossentropy_backward(dlogits, a->lse, m->d_targets, loss_scale, (int)BT, V, Vp, st);
    matmul_backward(s->btc, m->grad[wte], NULL, s->colreduce, dlogits, a->lnf, m->param[wte], (int)BT, C, Vp, st);
    HOOK(m, grad_contribution_done, wte);
    cudaCheck(cudaMemsetAsync(s->dresidual, 0, BT * C * sizeof(floatX), st));
    const floatX* last = a->residual3 + (size_t)(L - 1) * BT * C;
    layernorm_backward(s->dresidual, m->grad[lnfw], m->grad[lnfb], s->colreduce, s->btc, last, m->param[lnfw],
                       a->lnf_mean, a->lnf_rstd, B, T, C, st);
    HOOK(m, grad_contribution_done, lnfw);
    HOOK(m, grad_contribution_done, lnfb);
    HOOK(m, backward_block_end, L);

    // s->dresidual holds d(loss)/d(output of block l); each block adds its input gradient.
    for (int l = L - 1; l >= 0; l--) {
        HOOK(m, backward_block_begin, l);
        int base = gpt2_idx_layer(l, 0);
        floatX* const* p = &m->param[base];
        float* const* g = &m->grad[base];
        const floatX* residual = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * BT * C;
        const floatX* ln1 = a->ln1 + l * BT * C;
        const floatX* qkv = a->qkv + l * BT * 3 * C;
        const floatX* atty = a->atty + l * BT * C;
        const floatX* residual2 = a->residual2 + l * BT * C;
        const floatX* ln2 = a->ln2 + l * BT * C;
        const floatX* fch = a->fch + l * BT * 4 * C;
        const floatX* fch_gelu = a->fch_gelu + l * BT * 4 * C;

        matmul_backward(s->dfch, g[LAYER_FCPROJW], g[LAYER_FCPROJB], s->colreduce, s->dresidual, fch_gelu,
                        p[LAYER_FCPROJW], (int)BT, 4 * C, C, st);
        HOOK(m, grad_contribution_done, base + LAYER_FCPROJW);
        HOOK(m, grad_contribution_done, base + LAYER_FCPROJB);
        gelu_backward(s->dfch, fch, s->dfch, BT * 4 * C, st);
        matmul_backward(s->btc, g[LAYER_FCW], g[LAYER_FCB], s->colreduce, s->dfch, ln2, p[LAYER_FCW], (int)BT, C, 4 * C,
                        st);
        HOOK(m, grad_contribution_done, base + LAYER_FCW);
        HOOK(m, grad_contribution_done, base + LAYER_FCB);
        layernorm_backward(s->dresidual, g[LAYER_LN2W], g[LAYER_LN2B], s->colreduce, s->btc, residual2, p[LAYER_LN2W],
                           a->ln2_mean + l * BT, a->ln2_rstd + l * BT, B, T, C, st);
        HOOK(m, grad_contribution_done, base + LAYER_LN2W);
        HOOK(m, grad_contribution_done, base + LAYER_LN2B);

        matmul_backward(s->btc, g[LAYER_ATTPROJW], g[LAYER_ATTPROJB], s->colreduce, s->dresidual, atty,
                        p[LAYER_ATTPROJW], (int)BT, C, C, st);
        HOOK(m, grad_contribution_done, base + LAYER_ATTPROJW);
        HOOK(m, grad_contribution_done, base + LAYER_ATTPROJB);
#ifdef USE_CUDNN
        if (m->kernels.attention == ATTENTION_CUDNN)
            attention_backward_cudnn(s->dqkv, s->btc, qkv, atty, gpt2_att_lse(m, l), B, T, NH, C / NH,
                                     1.0f / sqrtf((float)(C / NH)), st);
        else
#endif
        attention_backward(s->dqkv, s->qkvr, s->dqkvr, s->perm, s->scores, s->dpreatt, s->btc, qkv, a->att + l * att, B,
                           T, C, NH, st);
        matmul_backward(s->btc, g[LAYER_QKVW], g[LAYER_QKVB], s->colreduce, s->dqkv, ln1, p[LAYER_QKVW], (int)BT, C,
                        3 * C, st);
        HOOK(m, grad_contribution_done, base + LAYER_QKVW);
        HOOK(m, grad_contribution_done, base + LAYER_QKVB);
        layernorm_backward(s->dresidual, g[LAYER_LN1W], g[LAYER_LN1B], s->colreduce, s->btc, residual, p[LAYER_LN1W],
                           a->ln1_mean + l * BT, a->ln1_rstd + l * BT, B, T, C, st);
        HOOK(m, grad_contribution_done, base + LAYER_LN1W);
        HOOK(m, grad_contribution_done, base + LAYER_LN1B);
        HOOK(m, backward_block_end, l);
    }
    HOOK(m, backward_block_begin, -1);
    // An optimizer may take the encoder's part of dwte as compact rows (llmc/model_hooks.h),
    // in the plan's order of distinct tokens; the position map is the plan's own.
    float* rows = NULL;
    if (m->hooks.embedding_grad_rows) {
        const int* row_of_position = NULL;
        rows = m->hooks.embedding_grad_rows(m->hooks.ctx, wte, m->inputs, (int)BT, &row_of_position);
    }
    encoder_backward(rows ? rows : m->grad[wte], m->grad[wpe], s->dresidual, &m->enc_plan, B, T, C, rows != NULL, st);
    HOOK(m, grad_contribution_done, wte);
    HOOK(m, grad_contribution_done, wpe);
    HOOK(m, backward_block_end, -1);
}

#endif
