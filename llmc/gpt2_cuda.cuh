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
 *
 * Batches come through llmc/batch_upload.cuh: gpt2_upload_batch copies one into a pinned
 * slot and queues its upload on the upload stream, gpt2_forward_batch runs the oldest
 * uploaded one (so a trainer can upload the next batch while this one computes);
 * gpt2_forward does both for evaluation and sampling. With --fused-kernels 1
 * (GPT2.kernels.fused) each residual add runs inside the LayerNorm that reads it
 * (residual2 -> ln2, residual3 -> the next block's ln1, the last -> lnf, the latter
 * inside the next block so that a ZeRO-1 gather of its weights is waited for first), and
 * a training forward told the backward's loss scale writes dlogits in its classifier pass
 * (llmc/classifier.cuh), so gpt2_backward skips crossentropy_backward; 0 runs the
 * separate reference kernels.
 */
#ifndef LLMC_GPT2_CUDA_CUH
#define LLMC_GPT2_CUDA_CUH

#include "llmc/gpt2_kernels.h"
#include "llmc/gpt2_spec.h"
#include "llmc/model_hooks.h"
#include "llmc/utils.h"

#include "llmc/cuda_common.cuh"
#include "llmc/attention.cuh"
#include "llmc/batch_upload.cuh"
#include "llmc/attention_flash.cuh"
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
    floatX* att;                        // (L,B,NH,T,T), naive attention only
    float* att_lse;                     // (L,B,NH,T) fp32 logsumexp of the scores, flash and cudnn
    floatX* residual2;                  // (L,B,T,C)
    floatX* ln2;                        // (L,B,T,C)
    float *ln2_mean, *ln2_rstd;
    floatX* fch;                        // (L,B,T,4C): the GELU's input
    floatX* fch_gelu;                   // (L,B,T,4C); with -r 1 one (B,T,4C), refilled by the backward
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
    floatX* qkvr;            // 3*(B,T,C) permuted q,k,v              (naive attention)
    floatX* dqkvr;           // 3*(B,T,C)                              (naive)
    floatX* perm;            // (B,T,C) attention output / dout permuted (naive)
    float* scores;           // (B,NH,T,T) fp32: preatt in forward, datt in backward (naive)
    floatX* dpreatt;         // (B,NH,T,T)                            (naive)
    float* att_rowdot;       // (B,NH,T) fp32 rowsum(dout * out)       (flash)
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
    const int* inputs;       // host (pinned), of the last forward: its batch slot's copy
    int has_targets;
    BatchUploader uploader;  // llmc/batch_upload.cuh: pinned host and device token buffers
    BatchSlot* batch;        // the last forward's slot, and the generation it held then
    long long batch_generation;
    float dlogits_scale;     // > 0: the last forward already turned its logits into dlogits for it
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
    size_t BT = (size_t)B * T, att = (size_t)B * NH * T * T;
    GPUActivations* a = &m->acts;
    a->encoded = alloc_x(BT * C);
    a->ln1 = alloc_x(L * BT * C);
    a->ln1_mean = alloc_f(L * BT);
    a->ln1_rstd = alloc_f(L * BT);
    a->qkv = alloc_x(L * BT * 3 * C);
    a->atty = alloc_x(L * BT * C);
    // Attention: naive keeps the probabilities per layer and needs (B,NH,T,T) scratch and
    // permuted copies; flash (llmc/attention_flash.cuh) and cuDNN keep one logsumexp per row and layer.
    int naive = kernels->attention == ATTENTION_NAIVE;
    if (kernels->attention == ATTENTION_FLASH) flash_attention_check((int)C, (int)NH);
    if (naive) a->att = alloc_x(L * att);
    else a->att_lse = alloc_f(L * B * NH * T);
    a->residual2 = alloc_x(L * BT * C);
    a->ln2 = alloc_x(L * BT * C);
    a->ln2_mean = alloc_f(L * BT);
    a->ln2_rstd = alloc_f(L * BT);
    a->fch = alloc_x(L * BT * 4 * C);
    a->fch_gelu = alloc_x((kernels->recompute_gelu ? 1 : L) * BT * 4 * C);
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
    if (naive) {
        s->qkvr = alloc_x(3 * BT * C);
        s->dqkvr = alloc_x(3 * BT * C);
        s->perm = alloc_x(BT * C);
        s->scores = alloc_f(att);
        s->dpreatt = alloc_x(att);
    } else {
        s->att_rowdot = alloc_f(B * NH * T);
    }
    // bias reductions need chunks*OC (OC <= 4C), LayerNorm 2*chunks*C
    s->colreduce = alloc_f((size_t)colreduce_num_chunks((int)BT) * 4 * C);
    s->norm_partial = (double*)cudaMallocCheck(GLOBAL_NORM_BLOCKS * sizeof(double));
    batch_uploader_init(&m->uploader, (int)BT);
    encoder_plan_init(&m->enc_plan, (int)BT, (int)C);
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
                   m->scratch.scores, m->scratch.dpreatt, m->scratch.att_rowdot, m->scratch.colreduce,
                   m->scratch.norm_partial, m->d_loss};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) cudaCheck(cudaFree(all[i]));
#ifdef USE_CUDNN
    if (m->kernels.attention == ATTENTION_CUDNN) cudnn_attention_free();
#endif
    encoder_plan_free(&m->enc_plan);
    batch_uploader_free(&m->uploader);
    free(m->param);
    free(m->grad);
}

// Layer l's GELU output: its own slice with -r 0, the one shared buffer with -r 1.
static floatX* gpt2_fch_gelu(const GPT2* m, int l, size_t BT) {
    return m->acts.fch_gelu + (m->kernels.recompute_gelu ? 0 : (size_t)l * BT * 4 * m->config.channels);
}

// The backward of the Linear layer whose weight is tensor w (dinp overwritten, the fp32 grad
// views of the weight and its bias accumulate and are then final for this micro-step: the
// hooks say so): the fused epilogues (--fused-kernels 1) or the reference kernels.
// gelu_pre: the input of the GELU whose output was inp; dinp then is the gradient of that input.
static void gpt2_linear_backward(GPT2* m, floatX* dinp, int w, const floatX* dout, const floatX* inp,
                                 const floatX* gelu_pre, int BT, int C, int OC) {
    int b = gpt2_idx_bias_of(w);
    float* scratch = m->scratch.colreduce;
    if (m->kernels.fused) {
        matmul_backward_fused(dinp, m->grad[w], m->grad[b], scratch, dout, inp, m->param[w], gelu_pre, BT, C, OC,
                              m->stream);
    } else {
        matmul_backward(dinp, m->grad[w], m->grad[b], scratch, dout, inp, m->param[w], BT, C, OC, m->stream);
        if (gelu_pre) gelu_backward(dinp, gelu_pre, dinp, (size_t)BT * C, m->stream);
    }
    HOOK(m, grad_contribution_done, w);
    HOOK(m, grad_contribution_done, b);
}

// The backward of the LayerNorm whose weight is tensor w: dinp and the fp32 grad views of
// the weight and its bias accumulate, which are then final for this micro-step.
static void gpt2_layernorm_backward(GPT2* m, floatX* dinp, int w, const floatX* dout, const floatX* inp,
                                    const float* mean, const float* rstd) {
    int b = gpt2_idx_bias_of(w);
    layernorm_backward(dinp, m->grad[w], m->grad[b], m->scratch.colreduce, dout, inp, m->param[w], mean, rstd, m->B,
                       m->T, m->config.channels, m->stream);
    HOOK(m, grad_contribution_done, w);
    HOOK(m, grad_contribution_done, b);
}

// Layer l's slice of acts.att_lse (its per-layer stride is the allocated shape's).
static float* gpt2_att_lse(const GPT2* m, int l) {
    return m->acts.att_lse + (size_t)l * m->max_B * m->config.num_heads * m->max_T;
}

// Layer l's attention, out (B,T,C) from qkv (B,T,3C), with the kernels gpt2_init chose. The
// per-layer slices of acts.att / acts.att_lse are strided by the allocated max_B, max_T.
static void gpt2_attention_forward(GPT2* m, int l, floatX* out, const floatX* qkv, int B, int T) {
    int C = m->config.channels, NH = m->config.num_heads;
    GPUScratch* s = &m->scratch;
    if (m->kernels.attention == ATTENTION_NAIVE) {
        size_t att = (size_t)m->max_B * NH * m->max_T * m->max_T;
        attention_forward(out, s->qkvr, s->perm, s->scores, m->acts.att + l * att, qkv, B, T, C, NH, m->stream);
    } else if (m->kernels.attention == ATTENTION_FLASH) {
        attention_flash_forward(out, gpt2_att_lse(m, l), qkv, B, T, C, NH, m->stream);
#ifdef USE_CUDNN
    } else if (m->kernels.attention == ATTENTION_CUDNN) {
        attention_forward_cudnn(out, gpt2_att_lse(m, l), qkv, B, T, NH, C / NH, 1.0f / sqrtf((float)(C / NH)),
                                m->stream);
#endif
    } else {
        fatal("attention kind %s is not built into this trainer", attention_kind_name(m->kernels.attention));
    }
}

// dqkv (B,T,3C) overwritten from dout (B,T,C) and layer l's forward (qkv, its output out).
static void gpt2_attention_backward(GPT2* m, int l, floatX* dqkv, const floatX* dout, const floatX* qkv,
                                    const floatX* out, int B, int T) {
    int C = m->config.channels, NH = m->config.num_heads;
    GPUScratch* s = &m->scratch;
    if (m->kernels.attention == ATTENTION_NAIVE) {
        size_t att = (size_t)m->max_B * NH * m->max_T * m->max_T;
        attention_backward(dqkv, s->qkvr, s->dqkvr, s->perm, s->scores, s->dpreatt, dout, qkv, m->acts.att + l * att, B,
                           T, C, NH, m->stream);
    } else if (m->kernels.attention == ATTENTION_FLASH) {
        attention_flash_backward(dqkv, s->att_rowdot, dout, out, qkv, gpt2_att_lse(m, l), B, T, C, NH, m->stream);
#ifdef USE_CUDNN
    } else if (m->kernels.attention == ATTENTION_CUDNN) {
        attention_backward_cudnn(dqkv, dout, qkv, out, gpt2_att_lse(m, l), B, T, NH, C / NH,
                                 1.0f / sqrtf((float)(C / NH)), m->stream);
#endif
    } else {
        fatal("attention kind %s is not built into this trainer", attention_kind_name(m->kernels.attention));
    }
}

// Queues the upload of a batch (targets may be NULL) for a later gpt2_forward_batch; the
// host arrays may be reused at once. Issued while the previous batch still computes, it
// overlaps with it (llmc/batch_upload.cuh).
static void gpt2_upload_batch(GPT2* m, const int* inputs, const int* targets, int B, int T) {
    batch_upload(&m->uploader, inputs, targets, B * T);
}

// Forward on the oldest uploaded batch (B,T); with targets, also adds the mean loss into
// m->d_loss (the caller zeroes it when a new sum starts). Nothing is read back.
// backward_scale > 0: gpt2_backward(m, backward_scale) follows; with fused kernels the
// classifier then writes dlogits over the logits here, in the same pass as the loss
// (llmc/classifier.cuh). 0 (evaluation, sampling, tests that read the logits): the
// logits stay.
static void gpt2_forward_batch(GPT2* m, int B, int T, float backward_scale) {
    const GPT2Config* c = &m->config;
    if (B > m->max_B || T > m->max_T || (size_t)B * T > (size_t)m->max_B * m->max_T) {
        fatal("forward with B=%d T=%d exceeds the allocated B=%d T=%d", B, T, m->max_B, m->max_T);
    }
    cudaStream_t st = m->stream;
    int L = c->num_layers, C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T;
    BatchSlot* batch = batch_take(&m->uploader, st);
    if ((size_t)batch->BT != BT) fatal("forward with B*T=%zu on an uploaded batch of %d tokens", BT, batch->BT);
    if (backward_scale > 0.0f && !batch->has_targets) fatal("a forward for a backward needs targets");
    int fused = m->kernels.fused;
    m->B = B;
    m->T = T;
    m->batch = batch;
    m->batch_generation = batch->generation;
    m->inputs = batch->h_inputs;
    m->has_targets = batch->has_targets;
    m->dlogits_scale = 0.0f;
    GPUActivations* a = &m->acts;
    GPUScratch* s = &m->scratch;

    HOOK(m, forward_block_begin, -1);
    encoder_forward(a->encoded, batch->d_inputs, m->param[gpt2_idx_wte()], m->param[gpt2_idx_wpe()], B, T, C, st);
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
        floatX* fch_gelu = gpt2_fch_gelu(m, l, BT);
        float *ln1_mean = a->ln1_mean + l * BT, *ln1_rstd = a->ln1_rstd + l * BT;
        float *ln2_mean = a->ln2_mean + l * BT, *ln2_rstd = a->ln2_rstd + l * BT;
        // Fused: the previous block's last residual add is done here, with this block's ln1
        // (inside this block, after its begin hook: ln1's weights may be gathered only now).
        if (fused && l > 0) {
            layernorm_fused_residual_forward(a->residual3 + (size_t)(l - 1) * BT * C, ln1, ln1_mean, ln1_rstd,
                                             a->residual2 + (size_t)(l - 1) * BT * C, s->btc, p[LAYER_LN1W],
                                             p[LAYER_LN1B], B, T, C, st);
        } else {
            layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p[LAYER_LN1W], p[LAYER_LN1B], B, T, C, st);
        }
        matmul_forward(qkv, ln1, p[LAYER_QKVW], p[LAYER_QKVB], (int)BT, C, 3 * C, st);
        gpt2_attention_forward(m, l, atty, qkv, B, T);
        matmul_forward(s->btc, atty, p[LAYER_ATTPROJW], p[LAYER_ATTPROJB], (int)BT, C, C, st);
        if (fused) {
            layernorm_fused_residual_forward(residual2, ln2, ln2_mean, ln2_rstd, residual, s->btc, p[LAYER_LN2W],
                                             p[LAYER_LN2B], B, T, C, st);
        } else {
            residual_forward(residual2, residual, s->btc, BT * C, st);
            layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p[LAYER_LN2W], p[LAYER_LN2B], B, T, C, st);
        }
        if (fused) {
            matmul_forward_gelu(fch_gelu, fch, ln2, p[LAYER_FCW], p[LAYER_FCB], (int)BT, C, 4 * C, st);
        } else {
            matmul_forward(fch, ln2, p[LAYER_FCW], p[LAYER_FCB], (int)BT, C, 4 * C, st);
            gelu_forward(fch_gelu, fch, BT * 4 * C, st);
        }
        matmul_forward(s->btc, fch_gelu, p[LAYER_FCPROJW], p[LAYER_FCPROJB], (int)BT, 4 * C, C, st);
        if (!fused) residual_forward(a->residual3 + l * BT * C, residual2, s->btc, BT * C, st);
        HOOK(m, forward_block_end, l);
    }
    HOOK(m, forward_block_begin, L);
    floatX* last = a->residual3 + (size_t)(L - 1) * BT * C;
    const floatX *lnfw = m->param[gpt2_idx_lnfw(c)], *lnfb = m->param[gpt2_idx_lnfb(c)];
    if (fused) {
        layernorm_fused_residual_forward(last, a->lnf, a->lnf_mean, a->lnf_rstd, a->residual2 + (size_t)(L - 1) * BT * C,
                                         s->btc, lnfw, lnfb, B, T, C, st);
    } else {
        layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, last, lnfw, lnfb, B, T, C, st);
    }
    matmul_forward(a->logits, a->lnf, m->param[gpt2_idx_wte()], NULL, (int)BT, C, Vp, st);
    if (batch->has_targets && fused && backward_scale > 0.0f) {
        crossentropy_forward_backward(a->logits, a->losses, a->lse, m->d_loss, 1, batch->d_targets, backward_scale,
                                      (int)BT, V, Vp, st);
        m->dlogits_scale = backward_scale;
    } else if (batch->has_targets) {
        crossentropy_forward(a->losses, a->lse, m->d_loss, 1, a->logits, batch->d_targets, (int)BT, V, Vp, st);
    }
    batch_release(batch, st);  // again after the backward's crossentropy_backward, if it runs
    HOOK(m, forward_block_end, L);
}

// Forward on host inputs (B,T): the batch is uploaded and run at once; the logits stay.
static void gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T) {
    gpt2_upload_batch(m, inputs, targets, B, T);
    gpt2_forward_batch(m, B, T, 0.0f);
}

// Backward of the last forward (which had targets). loss_scale = d(objective)/d(loss at
// one position): 1/(B*T) alone, 1/(B*T*k*DP) for k micro-steps on DP ranks.
// Gradients accumulate into the bound fp32 grad buffer views.
static void gpt2_backward(GPT2* m, float loss_scale) {
    const GPT2Config* c = &m->config;
    if (!m->has_targets) fatal("gpt2_backward needs a forward with targets");
    if (!batch_still_holds(m->batch, m->batch_generation)) {
        fatal("gpt2_backward: its forward's batch slot was refilled (upload at most one batch between a forward and its "
              "backward)");
    }
    if (m->dlogits_scale > 0.0f && m->dlogits_scale != loss_scale) {
        fatal("gpt2_backward with loss scale %g after a forward that computed dlogits for %g", loss_scale,
              m->dlogits_scale);
    }
    cudaStream_t st = m->stream;
    int B = m->B, T = m->T, L = c->num_layers, C = c->channels;
    int V = c->vocab_size, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T;
    GPUActivations* a = &m->acts;
    GPUScratch* s = &m->scratch;
    int wte = gpt2_idx_wte(), wpe = gpt2_idx_wpe();
    // Host work first, so its upload is queued early and the host is free afterwards.
    encoder_plan_build(&m->enc_plan, m->inputs, (int)BT, st);

    HOOK(m, backward_block_begin, L);
    floatX* dlogits = a->logits;
    if (m->dlogits_scale == 0.0f) {  // else the fused forward did it
        crossentropy_backward(dlogits, a->lse, m->batch->d_targets, loss_scale, (int)BT, V, Vp, st);
        batch_release(m->batch, st);
    }
    m->dlogits_scale = 0.0f;
    matmul_backward(s->btc, m->grad[wte], NULL, s->colreduce, dlogits, a->lnf, m->param[wte], (int)BT, C, Vp, st);
    HOOK(m, grad_contribution_done, wte);
    cudaCheck(cudaMemsetAsync(s->dresidual, 0, BT * C * sizeof(floatX), st));
    const floatX* last = a->residual3 + (size_t)(L - 1) * BT * C;
    gpt2_layernorm_backward(m, s->dresidual, gpt2_idx_lnfw(c), s->btc, last, a->lnf_mean, a->lnf_rstd);
    HOOK(m, backward_block_end, L);

    // s->dresidual holds d(loss)/d(output of block l); each block adds its input gradient.
    for (int l = L - 1; l >= 0; l--) {
        HOOK(m, backward_block_begin, l);
        int base = gpt2_idx_layer(l, 0);
        const floatX* residual = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * BT * C;
        const floatX* ln1 = a->ln1 + l * BT * C;
        const floatX* qkv = a->qkv + l * BT * 3 * C;
        const floatX* atty = a->atty + l * BT * C;
        const floatX* residual2 = a->residual2 + l * BT * C;
        const floatX* ln2 = a->ln2 + l * BT * C;
        const floatX* fch = a->fch + l * BT * 4 * C;
        floatX* fch_gelu = gpt2_fch_gelu(m, l, BT);

        // -r 1: the forward's GELU output was overwritten by later layers; the fcproj weight
        // gradient needs it again.
        if (m->kernels.recompute_gelu) gelu_forward(fch_gelu, fch, BT * 4 * C, st);
        // dfch = the gradient of the GELU's input (the GELU's backward fused or after it)
        gpt2_linear_backward(m, s->dfch, base + LAYER_FCPROJW, s->dresidual, fch_gelu, fch, (int)BT, 4 * C, C);
        gpt2_linear_backward(m, s->btc, base + LAYER_FCW, s->dfch, ln2, NULL, (int)BT, C, 4 * C);
        gpt2_layernorm_backward(m, s->dresidual, base + LAYER_LN2W, s->btc, residual2, a->ln2_mean + l * BT,
                                a->ln2_rstd + l * BT);

        gpt2_linear_backward(m, s->btc, base + LAYER_ATTPROJW, s->dresidual, atty, NULL, (int)BT, C, C);
        gpt2_attention_backward(m, l, s->dqkv, s->btc, qkv, atty, B, T);
        gpt2_linear_backward(m, s->btc, base + LAYER_QKVW, s->dqkv, ln1, NULL, (int)BT, C, 3 * C);
        gpt2_layernorm_backward(m, s->dresidual, base + LAYER_LN1W, s->btc, residual, a->ln1_mean + l * BT,
                                a->ln1_rstd + l * BT);
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
