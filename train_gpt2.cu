/*
 * GPT-2 training on the GPU: floatX (bf16, or fp32 with PRECISION=FP32) params and
 * activations, fp32 gradient buffer, fp32 master weights + AdamW, cuBLASLt, NCCL.
 *
 * Same CLI (llmc/cli.h), step line, main.log and files as train_gpt2.c. Data parallel
 * over MPI-launched ranks, one GPU per local rank, NCCL bootstrapped through MPI:
 *   make train_gpt2cu && ./train_gpt2cu -e d12 -b 16 -t 1024 -x 20
 *   mpirun -np 8 ./train_gpt2cu -e d12 -b 16 -t 1024
 *
 * Buffers exactly as on the CPU side: one contiguous floatX param buffer and one
 * contiguous fp32 grad buffer in canonical layer-major order, every tensor a view
 * (m->param[i], m->grad[i]) at offsets[i]; the backward kernels accumulate straight
 * into the grad views. zero1/ can therefore choose the offsets (reverse order,
 * padding, buckets) without the kernels knowing. -z 0 (replicated): the whole grad
 * buffer is summed with one NCCL all-reduce, then every rank runs the full AdamW.
 *
 * One compute stream; no device-wide synchronize inside a step; the host reads back
 * only what it prints (the loss and the grad norm, once per step).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <time.h>

#include "llmc/adamw.h"
#include "llmc/cli.h"
#include "llmc/dataloader.h"
#include "llmc/gpt2_spec.h"
#include "llmc/logger.h"
#include "llmc/model_file.h"
#include "llmc/rng.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"
#include "llmc/train_loop.h"
#include "llmc/utils.h"

#include "llmc/cuda_common.cuh"
#include "llmc/adamw.cuh"
#include "llmc/attention.cuh"
#include "llmc/classifier.cuh"
#include "llmc/encoder.cuh"
#include "llmc/gelu.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/nccl_comm.cuh"
#include "llmc/residual.cuh"

// ----------------------------------------------------------------------------
// The model on the GPU

// Host callbacks at layer boundaries, as in gpt2_cpu.h (block -1 = embeddings,
// 0..L-1 = transformer blocks, L = final LayerNorm + classifier). A GPU runtime
// records CUDA events in them; the model itself never waits.
typedef struct {
    void* ctx;
    void (*forward_block_begin)(void* ctx, int block);
    void (*forward_block_end)(void* ctx, int block);
    void (*backward_block_begin)(void* ctx, int block);
    void (*backward_block_end)(void* ctx, int block);
    void (*grad_contribution_done)(void* ctx, int tensor);
} GPUModelHooks;

// Per-layer slices are indexed by layer first. floatX unless noted.
typedef struct {
    floatX* encoded;                    // (B,T,C)
    floatX* ln1;                        // (L,B,T,C)
    float *ln1_mean, *ln1_rstd;         // (L,B,T) fp32
    floatX* qkv;                        // (L,B,T,3C)
    floatX* atty;                       // (L,B,T,C)
    floatX* att;                        // (L,B,NH,T,T)
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
    GPUModelHooks hooks;     // all members may be NULL
    cudaStream_t stream;     // the one compute stream
} GPT2;

#define HOOK(m, name, ...) \
    do { if ((m)->hooks.name) (m)->hooks.name((m)->hooks.ctx, __VA_ARGS__); } while (0)

static floatX* alloc_x(size_t n) { return (floatX*)cudaMallocCheck(n * sizeof(floatX)); }
static float* alloc_f(size_t n) { return (float*)cudaMallocCheck(n * sizeof(float)); }

static void gpt2_init(GPT2* m, const GPT2Config* cfg, int B, int T, cudaStream_t stream) {
    memset(m, 0, sizeof(*m));
    m->config = *cfg;
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
    a->att = alloc_x(L * att);
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
    s->qkvr = alloc_x(3 * BT * C);
    s->dqkvr = alloc_x(3 * BT * C);
    s->perm = alloc_x(BT * C);
    s->scores = alloc_f(att);
    s->dpreatt = alloc_x(att);
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
                   m->acts.att, m->acts.residual2, m->acts.ln2, m->acts.ln2_mean, m->acts.ln2_rstd, m->acts.fch,
                   m->acts.fch_gelu, m->acts.residual3, m->acts.lnf, m->acts.lnf_mean, m->acts.lnf_rstd,
                   m->acts.logits, m->acts.losses, m->acts.lse, m->scratch.btc, m->scratch.dresidual,
                   m->scratch.dqkv, m->scratch.dfch, m->scratch.qkvr, m->scratch.dqkvr, m->scratch.perm,
                   m->scratch.scores, m->scratch.dpreatt, m->scratch.colreduce, m->scratch.norm_partial,
                   m->d_inputs, m->d_targets, m->d_loss};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) cudaCheck(cudaFree(all[i]));
    encoder_plan_free(&m->enc_plan);
    free(m->param);
    free(m->grad);
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
    encoder_backward(m->grad[wte], m->grad[wpe], s->dresidual, &m->enc_plan, B, T, C, st);
    HOOK(m, grad_contribution_done, wte);
    HOOK(m, grad_contribution_done, wpe);
    HOOK(m, backward_block_end, -1);
}

// ----------------------------------------------------------------------------
// The trainer: a model bound to a param and a grad buffer, and an optimizer.

typedef struct {
    TrainConfig cfg;
    int rank, world;
    NcclComm nccl;
    cudaStream_t stream;
    int grad_accum_steps;
    GPT2 model;
    size_t* offsets;           // start of every canonical tensor in the buffers
    size_t numel;              // buffer length (dense replicated layout: no padding)
    floatX* params;            // device, compute dtype
    float* grads;              // device, fp32 gradient buffer
    float* master;             // device, fp32 master weights (same layout)
    float* adam_m;             // device, replicated AdamW state (-z 0)
    float* adam_v;
    float* d_norm;             // device scalars: grad norm and clip factor
    float* d_grad_scale;
    float* h_readback;         // pinned: loss sum, norm
} Trainer;

// Checks the configuration against the model; returns the micro-steps per optimizer step.
static int check_config(const TrainConfig* cfg, const GPT2Config* mc, int world) {
    int grad_accum_steps = check_batch_config(cfg, mc, world);
    if (cfg->zero_stage == 1) {
        fatal("-z 1 (ZeRO-1) is not wired into train_gpt2cu yet; use -z 0 (replicated) on the GPU");
    }
    if (cfg->grad_dtype != DTYPE_FP32) fatal("--grad-dtype bf16 is not supported by train_gpt2cu (fp32 grad buffer)");
    if (cfg->trace_file) fatal("--trace is not supported by train_gpt2cu yet");
    if (cfg->checkpoint_every > 0 || cfg->resume) fatal("checkpoints (-n, -y) are not available in train_gpt2cu yet");
    return grad_accum_steps;
}

// Copies a dense canonical fp32 array into the master weights and the param buffer.
static void trainer_load_weights(Trainer* tr, const float* dense) {
    const GPT2Config* c = &tr->model.config;
    size_t* dense_offsets = (size_t*)mallocCheck(tr->model.num_tensors * sizeof(size_t));
    gpt2_tensor_offsets_dense(c, dense_offsets);
    for (int i = 0; i < tr->model.num_tensors; i++) {
        cudaCheck(cudaMemcpy(tr->master + tr->offsets[i], dense + dense_offsets[i], gpt2_tensor_numel(c, i) * sizeof(float),
                             cudaMemcpyHostToDevice));
    }
    free(dense_offsets);
    copy_master_to_params(tr->params, tr->master, tr->numel, tr->stream);
    cudaCheck(cudaStreamSynchronize(tr->stream));  // setup, not a training step
}

static void trainer_init(Trainer* tr, const TrainConfig* cfg, int rank, int world, const NcclComm* nccl,
                         cudaStream_t stream) {
    memset(tr, 0, sizeof(*tr));
    tr->cfg = *cfg;
    tr->rank = rank;
    tr->world = world;
    tr->nccl = *nccl;
    tr->stream = stream;
    GPT2Config mc;
    float* dense = load_initial_weights(cfg, &mc);
    tr->grad_accum_steps = check_config(cfg, &mc, world);
    gpt2_init(&tr->model, &mc, cfg->B, cfg->T, stream);
    int NT = tr->model.num_tensors;
    tr->offsets = (size_t*)mallocCheck(NT * sizeof(size_t));
    tr->numel = gpt2_tensor_offsets_dense(&mc, tr->offsets);
    tr->params = alloc_x(tr->numel);
    tr->grads = alloc_f(tr->numel);
    tr->master = alloc_f(tr->numel);
    tr->adam_m = alloc_f(tr->numel);
    tr->adam_v = alloc_f(tr->numel);
    cudaCheck(cudaMemset(tr->grads, 0, tr->numel * sizeof(float)));
    cudaCheck(cudaMemset(tr->adam_m, 0, tr->numel * sizeof(float)));
    cudaCheck(cudaMemset(tr->adam_v, 0, tr->numel * sizeof(float)));
    tr->d_norm = alloc_f(1);
    tr->d_grad_scale = alloc_f(1);
    cudaCheck(cudaMallocHost((void**)&tr->h_readback, 2 * sizeof(float)));
    gpt2_bind_buffers(&tr->model, tr->params, tr->grads, tr->offsets);
    trainer_load_weights(tr, dense);
    free(dense);
}

static void trainer_free(Trainer* tr) {
    gpt2_free(&tr->model);
    free(tr->offsets);
    void* all[] = {tr->params, tr->grads, tr->master, tr->adam_m, tr->adam_v, tr->d_norm, tr->d_grad_scale};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) cudaCheck(cudaFree(all[i]));
    cudaCheck(cudaFreeHost(tr->h_readback));
}

// Only on the --check-nan failure path: names the first tensor with a non-finite gradient.
static void report_non_finite_grad(Trainer* tr, int step) {
    const GPT2* m = &tr->model;
    for (int i = 0; i < m->num_tensors; i++) {
        size_t n = gpt2_tensor_numel(&m->config, i);
        float* h = (float*)mallocCheck(n * sizeof(float));
        cudaCheck(cudaMemcpy(h, m->grad[i], n * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t j = 0; j < n; j++) {
            if (!isfinite(h[j])) {
                char name[64];
                fatal("non-finite gradient in %s (element %zu) at step %d", gpt2_tensor_name(&m->config, i, name, 64),
                      j, step);
            }
        }
        free(h);
    }
    fatal("non-finite gradient norm at step %d", step);
}

// One optimizer step: k micro-steps of forward+backward, the gradient all-reduce,
// the norm, AdamW; then the host reads the loss and the norm (the printed scalars).
static StepResult trainer_step(Trainer* tr, int step, float lr, BatchFn next_batch, void* batch_ctx) {
    StepResult r = {step, 0.0f, 0.0f, lr, 0.0};
    GPT2* m = &tr->model;
    cudaStream_t st = tr->stream;
    int B = tr->cfg.B, T = tr->cfg.T, k = tr->grad_accum_steps;
    // d(step loss)/d(position loss): the step loss is the mean over k*DP*B*T positions.
    float loss_scale = 1.0f / ((float)B * T * k * tr->world);
    cudaCheck(cudaMemsetAsync(tr->grads, 0, tr->numel * sizeof(float), st));
    cudaCheck(cudaMemsetAsync(m->d_loss, 0, sizeof(float), st));
    for (int micro = 0; micro < k; micro++) {
        const int *inputs, *targets;
        next_batch(batch_ctx, micro, &inputs, &targets);
        gpt2_forward(m, inputs, targets, B, T);
        gpt2_backward(m, loss_scale);
        if (tr->cfg.plant_nan_step == step && micro == k - 1 && tr->rank == tr->world - 1) {
            // test-only: poison a gradient on one rank. All-ones bytes are a float NaN; a
            // memset needs no host source (an async copy from a stack variable would rely on
            // the driver staging pageable memory before this scope ends).
            cudaCheck(cudaMemsetAsync(m->grad[gpt2_idx_layer(0, LAYER_QKVB)], 0xFF, sizeof(float), st));
        }
    }
    // Replicated data parallel: sum the whole grad buffer and the loss over ranks.
    nccl_all_reduce_sum(tr->grads, tr->numel, &tr->nccl, st);
    nccl_all_reduce_sum(m->d_loss, 1, &tr->nccl, st);
    global_norm(tr->d_norm, tr->d_grad_scale, m->scratch.norm_partial, tr->grads, tr->numel, tr->cfg.grad_clip, st);
    if (tr->cfg.check_nan) {  // opt-in: costs one wait per step
        float norm;
        cudaCheck(cudaMemcpyAsync(&tr->h_readback[1], tr->d_norm, sizeof(float), cudaMemcpyDeviceToHost, st));
        cudaCheck(cudaStreamSynchronize(st));
        norm = tr->h_readback[1];
        // step + 1: the 1-based step of the step line, as train_gpt2.c's message says
        if (!isfinite(norm)) report_non_finite_grad(tr, step + 1);
    }
    AdamWStep s = adamw_step_params(lr, tr->cfg.beta1, tr->cfg.beta2, tr->cfg.eps, tr->cfg.weight_decay, step + 1, 1.0f);
    const GPT2Config* c = &m->config;
    for (int i = 0; i < m->num_tensors; i++) {
        size_t off = tr->offsets[i];
        adamw_update(tr->params + off, tr->master + off, tr->grads + off, tr->adam_m + off, tr->adam_v + off,
                     gpt2_tensor_numel(c, i), &s, tr->d_grad_scale, gpt2_tensor_decays(c, i), st);
    }
    cudaCheck(cudaMemcpyAsync(&tr->h_readback[0], m->d_loss, sizeof(float), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaMemcpyAsync(&tr->h_readback[1], tr->d_norm, sizeof(float), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaStreamSynchronize(st));
    r.loss = tr->h_readback[0] / ((float)k * tr->world);
    r.grad_norm = tr->h_readback[1];
    return r;
}

// A fingerprint of the param buffer's bytes, to compare replicas.
static uint64_t params_fingerprint(const Trainer* tr) {
    size_t bytes = tr->numel * sizeof(floatX);
    unsigned char* h = (unsigned char*)mallocCheck(bytes);
    cudaCheck(cudaMemcpy(h, tr->params, bytes, cudaMemcpyDeviceToHost));
    uint64_t x = fnv1a(FNV1A_START, h, bytes);
    free(h);
    return x;
}

// After training, every rank must hold the same parameters; a mismatch is a bug.
static int trainer_replicas_identical(Trainer* tr) { return all_ranks_equal(params_fingerprint(tr), tr->world); }

static float evaluate(Trainer* tr, DataLoader* val) {
    dataloader_reset(val);
    GPT2* m = &tr->model;
    cudaCheck(cudaMemsetAsync(m->d_loss, 0, sizeof(float), tr->stream));
    for (int i = 0; i < tr->cfg.val_steps; i++) {
        dataloader_next_batch(val);
        gpt2_forward(m, val->inputs, val->targets, tr->cfg.B, tr->cfg.T);
    }
    nccl_all_reduce_sum(m->d_loss, 1, &tr->nccl, tr->stream);
    cudaCheck(cudaMemcpyAsync(&tr->h_readback[0], m->d_loss, sizeof(float), cudaMemcpyDeviceToHost, tr->stream));
    cudaCheck(cudaStreamSynchronize(tr->stream));
    return tr->h_readback[0] / ((float)tr->cfg.val_steps * tr->world);
}

// The logits of the last position of tokens[0..n) (the sampler's forward), as fp32 on the host.
static void next_token_logits(void* ctx, const int* tokens, int n, float* logits) {
    Trainer* tr = (Trainer*)ctx;
    int window = n < tr->cfg.T ? n : tr->cfg.T, Vp = tr->model.config.padded_vocab_size;
    gpt2_forward(&tr->model, tokens + (n - window), NULL, 1, window);
    floatX* row = (floatX*)mallocCheck((size_t)Vp * sizeof(floatX));
    cudaCheck(cudaMemcpyAsync(row, tr->model.acts.logits + (size_t)(window - 1) * Vp, (size_t)Vp * sizeof(floatX),
                              cudaMemcpyDeviceToHost, tr->stream));
    cudaCheck(cudaStreamSynchronize(tr->stream));
    for (int v = 0; v < Vp; v++) logits[v] = (float)row[v];
    free(row);
}

static StepResult loop_step(void* t, int step, float lr, BatchFn next_batch, void* batch_ctx) {
    return trainer_step((Trainer*)t, step, lr, next_batch, batch_ctx);
}
static float loop_evaluate(void* t, DataLoader* val) { return evaluate((Trainer*)t, val); }
static void loop_sample(void* t, const Tokenizer* tok, uint64_t* rng) {
    Trainer* tr = (Trainer*)t;
    print_sample(tr, next_token_logits, &tr->model.config, tr->cfg.T, tr->cfg.gen_tokens, tr->rank, tok, rng);
}

// After mpi_start: the GPU of this local rank, the libraries and NCCL; returns the compute stream.
static cudaStream_t gpu_setup(int rank, int world, NcclComm* nccl) {
    int local_world;
    int local_rank = mpi_local_rank(&local_world);
    cuda_select_device(local_rank);
    cuda_libs_init();
    nccl_comm_init(nccl, rank, world, local_rank, local_world);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    return stream;
}

#ifndef TESTING
int main(int argc, char** argv) {
    int rank, world;
    mpi_start(&argc, &argv, &rank, &world);
    NcclComm nccl;
    // Parse first: -h and flag errors need no GPU.
    TrainConfig cfg;
    train_config_defaults(&cfg, 0);
    train_parse_args(&cfg, argc, argv);
    cudaStream_t stream = gpu_setup(rank, world, &nccl);

    Trainer tr;
    trainer_init(&tr, &cfg, rank, world, &nccl, stream);
    const GPT2Config* mc = &tr.model.config;
    RunIO io;
    run_io_open(&io, &cfg, rank, world, mc->vocab_size);

    long long tokens_per_step = (long long)cfg.B * cfg.T * world * tr.grad_accum_steps;
    int max_steps = resolve_max_steps(&cfg, &io.train, tokens_per_step);
    if (rank == 0) {
        print_model_line(mc);
        printf("ranks %d | B %d | T %d | grad accumulation %d | %lld tokens/step | %d steps | -z %d | GPU %s | %s\n",
               world, cfg.B, cfg.T, tr.grad_accum_steps, tokens_per_step, max_steps, cfg.zero_stage,
               cuda_libs.device_name, PRECISION_NAME);
    }

    uint64_t sample_rng = rng_seed((uint64_t)cfg.seed + 1337);
    TrainLoop loop = {&tr, loop_step, loop_evaluate, loop_sample, NULL};
    run_training(&loop, &cfg, rank, &io, 0, max_steps, tokens_per_step, &sample_rng);
    int identical = trainer_replicas_identical(&tr);
    if (rank == 0) printf("parameters identical on all %d ranks: %s\n", world, identical ? "yes" : "NO");
    run_io_close(&io);
    trainer_free(&tr);
    nccl_comm_free(&nccl);
    cudaCheck(cudaStreamDestroy(stream));
    cuda_libs_free();
    MPI_Finalize();
    return identical ? 0 : 1;
}
#endif
