/*
 * GPT-2 on the CPU in fp32: activations, forward and backward.
 *
 * The model does not own its parameters or gradients. The trainer binds two flat
 * buffers (params, grads) and an offset per canonical tensor; every tensor is a view.
 * That is what lets zero1/ choose the layout (reverse order, alignment, padding, buckets)
 * while the kernels stay unaware of it. Backward accumulates straight into the grad
 * views: the buffer is zeroed once per optimizer step and sums the micro-steps.
 *
 * Hooks let a runtime act at layer boundaries without the model knowing about
 * communication: wait for a bucket's all-gather before a block runs, launch a bucket's
 * reduce-scatter when its last gradient is final, let the network progress, trace.
 * Block numbering: -1 = embeddings (wte, wpe), 0..L-1 = transformer blocks,
 * L = final LayerNorm and classifier (which reads wte again).
 */
#ifndef LLMC_GPT2_CPU_H
#define LLMC_GPT2_CPU_H

#include <math.h>

#include "llmc/attention.h"
#include "llmc/classifier.h"
#include "llmc/encoder.h"
#include "llmc/gelu.h"
#include "llmc/gpt2_spec.h"
#include "llmc/layernorm.h"
#include "llmc/matmul.h"
#include "llmc/model_hooks.h"
#include "llmc/residual.h"
#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif


// Activations of one layer are slices of these arrays (index by layer first).
typedef struct {
    float* encoded;                // (B,T,C)
    float *ln1, *ln1_mean, *ln1_rstd;  // (L,B,T,C), (L,B,T)
    float* qkv;                    // (L,B,T,3C)
    float* atty;                   // (L,B,T,C)
    float *preatt, *att;           // (L,B,NH,T,T)
    float* attproj;                // (L,B,T,C)
    float* residual2;              // (L,B,T,C)
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;         // (L,B,T,4C)
    float* fcproj;                 // (L,B,T,C)
    float* residual3;              // (L,B,T,C)
    float *lnf, *lnf_mean, *lnf_rstd;
    float* logits;                 // (B,T,Vp); reused for dlogits in backward
    float* probs;                  // (B,T,Vp)
    float* losses;                 // (B,T)
} Activations;

// Backward scratch: one layer's worth, reused by every layer.
typedef struct {
    float* dresidual;              // (B,T,C) gradient flowing down the residual stream
    float* dbtc;                   // (B,T,C)
    float* dqkv;                   // (B,T,3C)
    float *dfch, *dfch_gelu;       // (B,T,4C)
    float *dpreatt, *datt;         // (B,NH,T,T)
    float* dlosses;                // (B,T)
} BackwardScratch;

typedef struct {
    GPT2Config config;
    int num_tensors;
    float** param;                 // views into the bound param buffer, canonical order
    float** grad;                  // views into the bound grad buffer
    int max_B, max_T;              // activations are sized for these
    Activations acts;
    BackwardScratch scratch;
    int B, T;                      // shape of the last forward
    const int* inputs;             // of the last forward (borrowed)
    const int* targets;            // NULL if the last forward had none
    float mean_loss;               // of the last forward with targets
    ModelHooks hooks;              // all members may be NULL
} GPT2;

static inline float* alloc_floats(size_t n) { return (float*)mallocCheck(n * sizeof(float)); }

static inline void gpt2_init(GPT2* m, const GPT2Config* cfg, int B, int T) {
    memset(m, 0, sizeof(*m));
    m->config = *cfg;
    m->num_tensors = gpt2_num_tensors(cfg);
    m->param = (float**)callocCheck(m->num_tensors, sizeof(float*));
    m->grad = (float**)callocCheck(m->num_tensors, sizeof(float*));
    m->max_B = B;
    m->max_T = T;
    size_t L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T, att = (size_t)B * NH * T * T;
    Activations* a = &m->acts;
    a->encoded = alloc_floats(BT * C);
    a->ln1 = alloc_floats(L * BT * C);
    a->ln1_mean = alloc_floats(L * BT);
    a->ln1_rstd = alloc_floats(L * BT);
    a->qkv = alloc_floats(L * BT * 3 * C);
    a->atty = alloc_floats(L * BT * C);
    a->preatt = alloc_floats(L * att);
    a->att = alloc_floats(L * att);
    a->attproj = alloc_floats(L * BT * C);
    a->residual2 = alloc_floats(L * BT * C);
    a->ln2 = alloc_floats(L * BT * C);
    a->ln2_mean = alloc_floats(L * BT);
    a->ln2_rstd = alloc_floats(L * BT);
    a->fch = alloc_floats(L * BT * 4 * C);
    a->fch_gelu = alloc_floats(L * BT * 4 * C);
    a->fcproj = alloc_floats(L * BT * C);
    a->residual3 = alloc_floats(L * BT * C);
    a->lnf = alloc_floats(BT * C);
    a->lnf_mean = alloc_floats(BT);
    a->lnf_rstd = alloc_floats(BT);
    a->logits = alloc_floats(BT * Vp);
    a->probs = alloc_floats(BT * Vp);
    a->losses = alloc_floats(BT);
    BackwardScratch* s = &m->scratch;
    s->dresidual = alloc_floats(BT * C);
    s->dbtc = alloc_floats(BT * C);
    s->dqkv = alloc_floats(BT * 3 * C);
    s->dfch = alloc_floats(BT * 4 * C);
    s->dfch_gelu = alloc_floats(BT * 4 * C);
    s->dpreatt = alloc_floats(att);
    s->datt = alloc_floats(att);
    s->dlosses = alloc_floats(BT);
}

// Points every tensor at its offset in the two buffers.
static inline void gpt2_bind_buffers(GPT2* m, float* params, float* grads, const size_t* offsets) {
    for (int i = 0; i < m->num_tensors; i++) {
        m->param[i] = params + offsets[i];
        m->grad[i] = grads ? grads + offsets[i] : NULL;
    }
}

static inline void gpt2_free(GPT2* m) {
    float** all[] = {&m->acts.encoded, &m->acts.ln1, &m->acts.ln1_mean, &m->acts.ln1_rstd, &m->acts.qkv,
                     &m->acts.atty, &m->acts.preatt, &m->acts.att, &m->acts.attproj, &m->acts.residual2,
                     &m->acts.ln2, &m->acts.ln2_mean, &m->acts.ln2_rstd, &m->acts.fch, &m->acts.fch_gelu,
                     &m->acts.fcproj, &m->acts.residual3, &m->acts.lnf, &m->acts.lnf_mean, &m->acts.lnf_rstd,
                     &m->acts.logits, &m->acts.probs, &m->acts.losses, &m->scratch.dresidual, &m->scratch.dbtc,
                     &m->scratch.dqkv, &m->scratch.dfch, &m->scratch.dfch_gelu, &m->scratch.dpreatt,
                     &m->scratch.datt, &m->scratch.dlosses};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        free(*all[i]);
        *all[i] = NULL;
    }
    free(m->param);
    free(m->grad);
}


// Forward on inputs (B,T); with targets, also the per-position losses and their mean.
static inline void gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config* c = &m->config;
    if (B > m->max_B || T > m->max_T || (size_t)B * T > (size_t)m->max_B * m->max_T) {
        fatal("forward with B=%d T=%d exceeds the allocated B=%d T=%d", B, T, m->max_B, m->max_T);
    }
    int L = c->num_layers, C = c->channels, NH = c->num_heads, V = c->vocab_size, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T, att = (size_t)B * NH * T * T;
    m->B = B;
    m->T = T;
    m->inputs = inputs;
    m->targets = targets;
    Activations* a = &m->acts;

    HOOK(m, forward_block_begin, -1);
    encoder_forward(a->encoded, inputs, m->param[gpt2_idx_wte()], m->param[gpt2_idx_wpe()], B, T, C);
    HOOK(m, forward_block_end, -1);
    for (int l = 0; l < L; l++) {
        HOOK(m, forward_block_begin, l);
        float* const* p = &m->param[gpt2_idx_layer(l, 0)];
        const float* residual = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * BT * C;
        float* ln1 = a->ln1 + l * BT * C;
        float* qkv = a->qkv + l * BT * 3 * C;
        float* atty = a->atty + l * BT * C;
        float* attproj = a->attproj + l * BT * C;
        float* residual2 = a->residual2 + l * BT * C;
        float* ln2 = a->ln2 + l * BT * C;
        float* fch = a->fch + l * BT * 4 * C;
        float* fch_gelu = a->fch_gelu + l * BT * 4 * C;
        float* fcproj = a->fcproj + l * BT * C;
        layernorm_forward(ln1, a->ln1_mean + l * BT, a->ln1_rstd + l * BT, residual, p[LAYER_LN1W], p[LAYER_LN1B], B, T, C);
        matmul_forward(qkv, ln1, p[LAYER_QKVW], p[LAYER_QKVB], (int)BT, C, 3 * C);
        attention_forward(atty, a->preatt + l * att, a->att + l * att, qkv, B, T, C, NH);
        matmul_forward(attproj, atty, p[LAYER_ATTPROJW], p[LAYER_ATTPROJB], (int)BT, C, C);
        residual_forward(residual2, residual, attproj, BT * C);
        layernorm_forward(ln2, a->ln2_mean + l * BT, a->ln2_rstd + l * BT, residual2, p[LAYER_LN2W], p[LAYER_LN2B], B, T, C);
        matmul_forward(fch, ln2, p[LAYER_FCW], p[LAYER_FCB], (int)BT, C, 4 * C);
        gelu_forward(fch_gelu, fch, BT * 4 * C);
        matmul_forward(fcproj, fch_gelu, p[LAYER_FCPROJW], p[LAYER_FCPROJB], (int)BT, 4 * C, C);
        residual_forward(a->residual3 + l * BT * C, residual2, fcproj, BT * C);
        HOOK(m, forward_block_end, l);
    }
    HOOK(m, forward_block_begin, L);
    const float* last = a->residual3 + (size_t)(L - 1) * BT * C;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, last, m->param[gpt2_idx_lnfw(c)], m->param[gpt2_idx_lnfb(c)], B, T, C);
    matmul_forward(a->logits, a->lnf, m->param[gpt2_idx_wte()], NULL, (int)BT, C, Vp);
    if (targets) {
        crossentropy_softmax_forward(a->losses, a->probs, a->logits, targets, (int)BT, V, Vp);
        double sum = 0.0;
        for (size_t i = 0; i < BT; i++) sum += a->losses[i];
        m->mean_loss = (float)(sum / (double)BT);
    } else {
        m->mean_loss = -1.0f;
    }
    HOOK(m, forward_block_end, L);
}

// The backward of the Linear layer whose weight is tensor w: dinp (BT x C) = dout W,
// zeroed first; the weight's and the bias's gradients accumulate and are then final for
// this micro-step (the hooks say so).
static inline void gpt2_linear_backward(GPT2* m, float* dinp, int w, const float* dout, const float* inp, int BT,
                                        int C, int OC) {
    int b = gpt2_idx_bias_of(w);
    memset(dinp, 0, (size_t)BT * C * sizeof(float));
    matmul_backward(dinp, m->grad[w], m->grad[b], dout, inp, m->param[w], BT, C, OC);
    HOOK(m, grad_contribution_done, w);
    HOOK(m, grad_contribution_done, b);
}

// The backward of the LayerNorm whose weight is tensor w: dinp accumulates, and so do the
// weight's and the bias's gradients, which are then final for this micro-step.
static inline void gpt2_layernorm_backward(GPT2* m, float* dinp, int w, const float* dout, const float* inp,
                                           const float* mean, const float* rstd) {
    int b = gpt2_idx_bias_of(w);
    layernorm_backward(dinp, m->grad[w], m->grad[b], dout, inp, m->param[w], mean, rstd, m->B, m->T,
                       m->config.channels);
    HOOK(m, grad_contribution_done, w);
    HOOK(m, grad_contribution_done, b);
}

// Backward of the last forward (which had targets). loss_scale is d(objective)/d(loss at
// one position): 1/(B*T) for this batch alone, 1/(B*T*k*DP) when k micro-steps on DP
// ranks are summed into one step. Gradients accumulate into the bound grad buffer.
static inline void gpt2_backward(GPT2* m, float loss_scale) {
    const GPT2Config* c = &m->config;
    if (!m->targets) fatal("gpt2_backward needs a forward with targets");
    int B = m->B, T = m->T, L = c->num_layers, C = c->channels, NH = c->num_heads;
    int V = c->vocab_size, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T, att = (size_t)B * NH * T * T;
    Activations* a = &m->acts;
    BackwardScratch* s = &m->scratch;
    int wte = gpt2_idx_wte(), wpe = gpt2_idx_wpe();

    HOOK(m, backward_block_begin, L);
    for (size_t i = 0; i < BT; i++) s->dlosses[i] = loss_scale;
    float* dlogits = a->logits;  // the logits are not needed any more
    crossentropy_softmax_backward(dlogits, a->probs, m->targets, s->dlosses, (int)BT, V, Vp);
    memset(s->dbtc, 0, BT * C * sizeof(float));
    matmul_backward(s->dbtc, m->grad[wte], NULL, dlogits, a->lnf, m->param[wte], (int)BT, C, Vp);
    HOOK(m, grad_contribution_done, wte);
    memset(s->dresidual, 0, BT * C * sizeof(float));
    const float* last = a->residual3 + (size_t)(L - 1) * BT * C;
    gpt2_layernorm_backward(m, s->dresidual, gpt2_idx_lnfw(c), s->dbtc, last, a->lnf_mean, a->lnf_rstd);
    HOOK(m, backward_block_end, L);

    // s->dresidual now holds d(loss)/d(output of block L-1); each block turns it into the
    // gradient at its input in place (the residual adds pass gradients through unchanged).
    for (int l = L - 1; l >= 0; l--) {
        HOOK(m, backward_block_begin, l);
        int base = gpt2_idx_layer(l, 0);
        const float* residual = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * BT * C;
        const float* ln1 = a->ln1 + l * BT * C;
        const float* qkv = a->qkv + l * BT * 3 * C;
        const float* atty = a->atty + l * BT * C;
        const float* residual2 = a->residual2 + l * BT * C;
        const float* ln2 = a->ln2 + l * BT * C;
        const float* fch = a->fch + l * BT * 4 * C;
        const float* fch_gelu = a->fch_gelu + l * BT * 4 * C;

        gpt2_linear_backward(m, s->dfch_gelu, base + LAYER_FCPROJW, s->dresidual, fch_gelu, (int)BT, 4 * C, C);
        memset(s->dfch, 0, BT * 4 * C * sizeof(float));
        gelu_backward(s->dfch, fch, s->dfch_gelu, BT * 4 * C);
        gpt2_linear_backward(m, s->dbtc, base + LAYER_FCW, s->dfch, ln2, (int)BT, C, 4 * C);
        gpt2_layernorm_backward(m, s->dresidual, base + LAYER_LN2W, s->dbtc, residual2, a->ln2_mean + l * BT,
                                a->ln2_rstd + l * BT);

        gpt2_linear_backward(m, s->dbtc, base + LAYER_ATTPROJW, s->dresidual, atty, (int)BT, C, C);
        memset(s->dqkv, 0, BT * 3 * C * sizeof(float));
        attention_backward(s->dqkv, s->dpreatt, s->datt, s->dbtc, qkv, a->att + l * att, B, T, C, NH);
        gpt2_linear_backward(m, s->dbtc, base + LAYER_QKVW, s->dqkv, ln1, (int)BT, C, 3 * C);
        gpt2_layernorm_backward(m, s->dresidual, base + LAYER_LN1W, s->dbtc, residual, a->ln1_mean + l * BT,
                                a->ln1_rstd + l * BT);
        HOOK(m, backward_block_end, l);
    }
    HOOK(m, backward_block_begin, -1);
    // An optimizer may take the encoder's part of dwte as compact rows (llmc/model_hooks.h):
    // the same scatter, with each position's row index in place of its token.
    const int* row_of = m->inputs;
    float* dwte = m->grad[wte];
    if (m->hooks.embedding_grad_rows) {
        float* rows = m->hooks.embedding_grad_rows(m->hooks.ctx, wte, m->inputs, (int)BT, &row_of);
        if (rows) dwte = rows;
        else row_of = m->inputs;
    }
    encoder_backward(dwte, m->grad[wpe], s->dresidual, row_of, B, T, C);
    HOOK(m, grad_contribution_done, wte);
    HOOK(m, grad_contribution_done, wpe);
    HOOK(m, backward_block_end, -1);
}

#ifdef __cplusplus
}
#endif
#endif
