/*
 * GPT-2 training on the GPU: floatX (bf16, or fp32 with PRECISION=FP32) params and
 * activations, fp32 gradient buffer, fp32 master weights + AdamW, cuBLASLt, NCCL.
 *
 * Same CLI (run/config.h), step line, main.log and files as train_gpt2.c. Data parallel
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
 * One compute stream (and an upload stream for the batches: llmc/batch_upload.cuh); no
 * device-wide synchronize inside a step; the host reads back only what it prints (the
 * loss and the grad norm, once per step).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <time.h>

#include "llmc/adamw.h"
#include "llmc/gpt2_spec.h"
#include "run/chip_peaks.h"
#include "run/memory_check.h"
#include "run/model_file.h"
#include "run/mpi_wait.h"
#include "run/run.h"
#include "run/seams.h"

#ifdef __CUDA_CPU__
// Built for the CPU execution layer, whose cuBLAS is OpenBLAS: restart on better kernels
// as the CPU trainer does (a GPU build links no OpenBLAS).
#include "run/blas_cores.h"
#define ON_CPU_LAYER 1
#else
#define ON_CPU_LAYER 0
#endif

#include "llmc/cuda_common.cuh"
#include "llmc/adamw.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/muon.cuh"
#include "llmc/gpt2_cuda.cuh"
#include "run/nccl_comm.h"

// ----------------------------------------------------------------------------
// This process's GPU.

typedef struct {
    int rank, world;              // data-parallel ranks (MPI_COMM_WORLD)
    int local_rank, local_world;  // among the ranks on this node
    cudaStream_t stream;          // the compute stream
} GpuSetup;

// After mpi_start: the GPU of this local rank (several ranks share one when there are more
// ranks than GPUs: tests), the libraries, and the compute stream.
static void gpu_setup(GpuSetup* g, int rank, int world) {
    g->rank = rank;
    g->world = world;
    g->local_rank = mpi_local_rank(&g->local_world);
    cuda_select_device(g->local_rank);
    cuda_libs_init();
    // A blocking stream: it stays ordered with the legacy default stream that plain
    // cudaMemcpy/cudaMemset calls at set-up use.
    cudaCheck(cudaStreamCreate(&g->stream));
}

// The libraries first: their handles are bound to the stream (cublasSetStream) and may still
// use it while they are destroyed.
static void gpu_teardown(GpuSetup* g) {
    cuda_libs_free();
    cudaCheck(cudaStreamDestroy(g->stream));
}

// ----------------------------------------------------------------------------
// The optimizer. With the zero1/ plugin built in it is the default (-z 1 ZeRO-1, -z 0 its
// bucketed replicated mode); the plain replicated optimizer below is always there. Test
// binaries swap in their own plugin_optimizer (dev/test/test_gpt2.cu: the hazard communicator).

#ifdef USE_ZERO1
#include "zero1/backend_cuda.h"
#include "zero1/gpt2.h"
static Optimizer* zero1_gpu_optimizer(const TrainConfig* cfg, const GPT2Config* mc, const GpuSetup* gpu) {
    Zero1Backend* backend = zero1_backend_cuda(cfg, gpu->stream, gpu->local_rank, gpu->local_world);
    return zero1_gpt2_optimizer(cfg, mc, backend, FLOATX_IS_BF16 ? ZERO1_BF16 : ZERO1_FP32);
}
static Optimizer* (*plugin_optimizer)(const TrainConfig*, const GPT2Config*, const GpuSetup*) = zero1_gpu_optimizer;
static const MemoryZero1Sizes plugin_memory = zero1_gpt2_memory_buffers;
#define PLUGIN_BUILT "zero1/ in"
#define HAS_ZERO1 1
#else
static Optimizer* (*plugin_optimizer)(const TrainConfig*, const GPT2Config*, const GpuSetup*) = NULL;
static const MemoryZero1Sizes plugin_memory = NULL;
#define PLUGIN_BUILT "no zero1/"
#define HAS_ZERO1 0
#endif
// The make line of this build with the plugin (the Makefile passes it), for the hints.
#ifndef REBUILD_WITH_ZERO1
#define REBUILD_WITH_ZERO1 "make train_gpt2cu USE_ZERO1=1"
#endif
#ifdef USE_CUDNN
#define HAS_CUDNN 1
#else
#define HAS_CUDNN 0
#endif
static const TrainerBuild TRAINER_BUILD = {"train_gpt2cu, GPU " PRECISION_NAME ", " PLUGIN_BUILT, 1, HAS_ZERO1,
                                           FLOATX_IS_BF16 ? DTYPE_BF16 : DTYPE_FP32, HAS_CUDNN, REBUILD_WITH_ZERO1};

// The plain replicated optimizer: dense buffers in canonical order, one NCCL all-reduce of
// the whole gradient, the full AdamW on every rank (fp32 master, m, v), the clip factor
// and the norm left on the device. With --optimizer muon, Muon (llmc/muon.cuh) updates the
// hidden matrices, its momentum in adam_m (v stays zero there), and AdamW the rest.
typedef struct {
    Optimizer base;
    GPT2Config config;
    TrainConfig cfg;
    const GpuSetup* gpu;
    NcclComm nccl;
    size_t numel;
    size_t* offsets;
    AdamWTensors tensors;    // every tensor, for the one AdamW launch of a step
    floatX* params;
    float *grads, *master, *adam_m, *adam_v;
    float* norm;             // device: [norm, clip factor]
    double* norm_partial;    // GLOBAL_NORM_BLOCKS
    float* norm_host;        // pinned
    int step;                // the step begun (0-based), for the deadline's message
    int muon;                // --optimizer muon
    MuonPlan muon_plan;
} ReplicatedOptimizer;

static ReplicatedOptimizer* replicated(Optimizer* o) { return (ReplicatedOptimizer*)o; }

// AdamW's step t (1-based) with this run's write-back rounding; t 0 (no step) rounds to nearest.
static AdamWStep rep_adamw_step(const ReplicatedOptimizer* r, float lr, int t) {
    AdamWStep s = adamw_step_params(lr, r->cfg.beta1, r->cfg.beta2, r->cfg.eps, r->cfg.weight_decay, t, 1.0f);
    adamw_step_stochastic(&s, r->cfg.stochastic_rounding && t > 0, (uint64_t)r->cfg.seed);
    return s;
}

static void rep_load_weights(Optimizer* o, const float* dense) {
    ReplicatedOptimizer* r = replicated(o);
    cudaCheck(cudaMemcpy(r->master, dense, r->numel * sizeof(float), cudaMemcpyHostToDevice));
    AdamWStep initial = rep_adamw_step(r, 0.0f, 0);  // step 0: to nearest even (the stochastic bits are a step's)
    copy_master_to_params(r->params, r->master, r->numel, &initial, r->gpu->stream);
    cudaCheck(cudaStreamSynchronize(r->gpu->stream));  // setup, not a training step
}

static void rep_begin_step(Optimizer* o, int step) {
    ReplicatedOptimizer* r = replicated(o);
    r->step = step;
    cudaCheck(cudaMemsetAsync(r->grads, 0, r->numel * sizeof(float), r->gpu->stream));
}
static void rep_begin_micro_step(Optimizer* o, int is_last) {}

// Only on the --check-nan failure path: names the first tensor with a non-finite gradient.
// The host's wait for the step's device work, which includes the gradients' NCCL all-reduce.
static void rep_sync_step(ReplicatedOptimizer* r) {
    char what[96];
    snprintf(what, sizeof(what), "the GPU step (its NCCL all-reduce) at step %d", r->step + 1);
    cudaDeadline(what, cudaStreamSynchronize(r->gpu->stream));
}

static void report_non_finite_grad(ReplicatedOptimizer* r, int step) {
    for (int i = 0; i < gpt2_num_tensors(&r->config); i++) {
        size_t n = gpt2_tensor_numel(&r->config, i);
        float* h = (float*)mallocCheck(n * sizeof(float));
        cudaCheck(cudaMemcpy(h, r->grads + r->offsets[i], n * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t j = 0; j < n; j++) {
            if (!isfinite(h[j])) {
                char name[64];
                fatal("non-finite gradient in %s (element %zu) at step %d",
                      gpt2_tensor_name(&r->config, i, name, 64), j, step);
            }
        }
        free(h);
    }
    fatal("non-finite gradient norm at step %d", step);
}

static void rep_finish_step(Optimizer* o, int step, float lr, const UpdateGate* gate, double* blocked_ms) {
    ReplicatedOptimizer* r = replicated(o);
    cudaStream_t st = r->gpu->stream;
    nccl_all_reduce_sum(r->grads, r->numel, &r->nccl, st);
    global_norm(r->norm, r->norm + 1, r->norm_partial, r->grads, r->numel, r->cfg.grad_clip, st);
    if (r->cfg.check_nan || gate) {  // the host decides from the norm: the step's one wait comes here
        cudaCheck(cudaMemcpyAsync(r->norm_host, r->norm, sizeof(float), cudaMemcpyDeviceToHost, st));
        rep_sync_step(r);
        // step + 1: the 1-based step of the step line, as train_gpt2.c's message says
        if (r->cfg.check_nan && !isfinite(r->norm_host[0])) report_non_finite_grad(r, step + 1);
        if (gate && gate->skip(gate->ctx, r->norm_host[0])) return;
    }
    AdamWStep s = rep_adamw_step(r, lr, step + 1);
    adamw_update(r->params, r->master, r->grads, r->adam_m, r->adam_v, &r->tensors, &s, r->norm + 1, st);
    if (r->muon) muon_plan_step(&r->muon_plan, r->params, r->master, r->grads, r->adam_m, &s, r->norm + 1, st);
}

static float rep_read_norm(Optimizer* o) {
    ReplicatedOptimizer* r = replicated(o);
    cudaCheck(cudaMemcpyAsync(r->norm_host, r->norm, sizeof(float), cudaMemcpyDeviceToHost, r->gpu->stream));
    rep_sync_step(r);
    return r->norm_host[0];
}
static void rep_sync_params(Optimizer* o) {}

// Checkpoints: every rank holds everything, so each saves and loads its 1/world part.
static int rep_checkpoint_pieces(Optimizer* o, OptimizerPiece* out, int max) {
    ReplicatedOptimizer* r = replicated(o);
    return optimizer_split_pieces(r->offsets, gpt2_num_tensors(&r->config), r->numel, r->gpu->rank, o->world, out, max);
}
// The fp32 arrays are dense canonical: a range is at offsets[param] + start.
static float* rep_state_at(ReplicatedOptimizer* r, OptimizerState which, const OptimizerPiece* range) {
    float* base = which == OPTIMIZER_M ? r->adam_m : which == OPTIMIZER_V ? r->adam_v : r->master;
    return base + r->offsets[range->param] + range->start;
}
// On the compute stream, so that the copy sees the step's result and no queued kernel
// still uses the buffer; synced, because the host buffer is reused at once.
static void rep_read_piece(Optimizer* o, OptimizerState which, const OptimizerPiece* range, float* host) {
    ReplicatedOptimizer* r = replicated(o);
    cudaCheck(cudaMemcpyAsync(host, rep_state_at(r, which, range), range->n * sizeof(float), cudaMemcpyDeviceToHost,
                              r->gpu->stream));
    cudaCheck(cudaStreamSynchronize(r->gpu->stream));
}
static void rep_write_piece(Optimizer* o, OptimizerState which, const OptimizerPiece* range, const float* host) {
    ReplicatedOptimizer* r = replicated(o);
    cudaCheck(cudaMemcpyAsync(rep_state_at(r, which, range), host, range->n * sizeof(float), cudaMemcpyHostToDevice,
                              r->gpu->stream));
    cudaCheck(cudaStreamSynchronize(r->gpu->stream));
}
// Every rank loaded its part of master, m and v: each part is broadcast from its rank
// (in place, one NCCL group), then the params are rounded from the master.
static void rep_finish_import(Optimizer* o, int steps_done) {
    ReplicatedOptimizer* r = replicated(o);
    cudaStream_t st = r->gpu->stream;
    if (o->world > 1) {
        float* arrays[] = {r->master, r->adam_m, r->adam_v};
        ncclCheck(ncclGroupStart());
        for (int i = 0; i < 3; i++) {
            for (int root = 0; root < o->world; root++) {
                size_t lo, hi;
                optimizer_split_range(r->numel, root, o->world, &lo, &hi);
                ncclCheck(ncclBroadcast(arrays[i] + lo, arrays[i] + lo, hi - lo, ncclFloat, root, r->nccl.comm, st));
            }
        }
        ncclCheck(ncclGroupEnd());
    }
    AdamWStep last = rep_adamw_step(r, 0.0f, steps_done);  // as the checkpoint's step wrote them back
    copy_master_to_params(r->params, r->master, r->numel, &last, st);
    cudaDeadline("the resume's NCCL broadcasts of the optimizer state", cudaStreamSynchronize(st));
}
static size_t rep_state_bytes(const Optimizer* o) { return 3 * ((const ReplicatedOptimizer*)o)->numel * sizeof(float); }
static void rep_print_start(Optimizer* o) {
    if (replicated(o)->gpu->rank == 0) checkpoint_print_bound();
}
static void rep_print_end(Optimizer* o) {}
static void rep_destroy(Optimizer* o) {
    ReplicatedOptimizer* r = replicated(o);
    void* all[] = {r->params, r->grads, r->master, r->adam_m, r->adam_v, r->norm, r->norm_partial};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) cudaCheck(cudaFree(all[i]));
    cudaCheck(cudaFreeHost(r->norm_host));
    adamw_tensors_free(&r->tensors);
    if (r->muon) muon_plan_free(&r->muon_plan);
    nccl_comm_free(&r->nccl);
    free(r->offsets);
    free(r);
}

static const OptimizerOps replicated_ops = {
    rep_load_weights, rep_begin_step, rep_begin_micro_step, rep_finish_step, rep_read_norm, rep_sync_params,
    rep_checkpoint_pieces, rep_read_piece, rep_write_piece, rep_finish_import, rep_state_bytes, rep_print_start,
    rep_print_end, rep_destroy,
};

// The model's tensors for AdamW: dense canonical, one after another from model-space index 0;
// with muon the hidden matrices are Muon's.
static void rep_adamw_tensors(AdamWTensors* t, const GPT2Config* mc, int muon) {
    int n = gpt2_num_tensors(mc);
    size_t* sizes = (size_t*)mallocCheck((size_t)n * sizeof(size_t));
    int* decays = (int*)mallocCheck((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        sizes[i] = gpt2_tensor_numel(mc, i);
        decays[i] = muon && gpt2_tensor_is_hidden_matrix(mc, i) ? ADAMW_NOT_MINE : gpt2_tensor_decays(mc, i);
    }
    adamw_tensors_init(t, sizes, decays, n, 0);
    free(sizes);
    free(decays);
}

static Optimizer* replicated_optimizer(const TrainConfig* cfg, const GPT2Config* mc, const GpuSetup* gpu) {
    ReplicatedOptimizer* r = (ReplicatedOptimizer*)callocCheck(1, sizeof(ReplicatedOptimizer));
    nccl_comm_init(&r->nccl, gpu->rank, gpu->world, gpu->local_rank, gpu->local_world);
    r->config = *mc;
    r->cfg = *cfg;
    r->gpu = gpu;
    r->offsets = (size_t*)mallocCheck(gpt2_num_tensors(mc) * sizeof(size_t));
    r->numel = gpt2_tensor_offsets_dense(mc, r->offsets);
    r->muon = config_uses_muon(cfg);
    rep_adamw_tensors(&r->tensors, mc, r->muon);
    r->params = alloc_x(r->numel);
    r->grads = alloc_f(r->numel);
    r->master = alloc_f(r->numel);
    r->adam_m = alloc_f(r->numel);
    r->adam_v = alloc_f(r->numel);
    r->norm = alloc_f(2);
    r->norm_partial = (double*)cudaMallocCheck(GLOBAL_NORM_BLOCKS * sizeof(double));
    cudaCheck(cudaMemset(r->grads, 0, r->numel * sizeof(float)));
    cudaCheck(cudaMemset(r->adam_m, 0, r->numel * sizeof(float)));
    cudaCheck(cudaMemset(r->adam_v, 0, r->numel * sizeof(float)));
    cudaCheck(cudaMallocHost((void**)&r->norm_host, 2 * sizeof(float)));
    if (r->muon) {
        MuonConfig muon;
        config_muon(cfg, &muon);
        muon_gpt2_plan(&r->muon_plan, mc, r->offsets, &muon, cfg->muon_ns_bf16, gpu->stream);
    }
    return optimizer_expose(&r->base, "replicated", &replicated_ops, r->params, r->grads, r->offsets, r->numel,
                            gpu->world);
}

// ----------------------------------------------------------------------------
// The trainer: a model bound to an optimizer's buffers.

typedef struct {
    TrainConfig cfg;
    int rank, world;
    const GpuSetup* gpu;
    int grad_accum_steps;
    GPT2 model;
    Optimizer* opt;
    float* loss_host;          // pinned: the loss sum read back with the norm
    float* micro_losses_host;  // pinned, --dp-invariant: each micro-step's loss, read back with the norm
} Trainer;

// Refuses a job that cannot fit this GPU (or the host) before allocating (run/memory_check.h):
// the GPU's free bytes, and its UUID to tell which ranks share it.
static void check_memory(const TrainConfig* cfg, const GPT2Config* mc, const GPT2Kernels* kernels, const GpuSetup* gpu,
                         int plugin) {
    // Every rank has its context and libraries by now: ranks sharing the GPU read the same free bytes.
    mpi_barrier_deadline("the memory check", -1);
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    int device;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    MemoryGpu mine = {fnv1a(FNV1A_START, &prop.uuid, sizeof(prop.uuid)), (double)free_bytes, ON_CPU_LAYER};
    memory_check_gpu(cfg, mc, kernels, gpu->world, plugin ? plugin_memory : NULL, (int)sizeof(floatX), &mine);
}

// Muon keeps to the replicated optimizer (llmc/muon.cuh, batched over the whole model) unless
// the run asks for what only zero1/ gives: then zero1/'s CUDA device runs it on the owned matrices.
static int muon_needs_plugin(const TrainConfig* cfg) {
    return cfg->zero_stage == 1 || cfg->grad_dtype == DTYPE_BF16 || cfg->average_in_collective || cfg->dp_invariant ||
           cfg->split_embedding || cfg->trace_file != NULL;
}

// use_plugin: through zero1/ (the default when built in), else the plain replicated optimizer.
static void trainer_init_with(Trainer* tr, const TrainConfig* cfg, const GpuSetup* gpu, int use_plugin) {
    memset(tr, 0, sizeof(*tr));
    tr->cfg = *cfg;
    tr->rank = gpu->rank;
    tr->world = gpu->world;
    tr->gpu = gpu;
    GPT2Config mc;
    model_shape_of(cfg->model, &mc);  // the shape alone: memory is checked before the weights take any
    config_validate_model(cfg, &mc);
    tr->grad_accum_steps = config_micro_steps(cfg, gpu->world);
    int plugin = plugin_optimizer && (config_uses_muon(cfg) ? muon_needs_plugin(cfg)
                                                            : use_plugin || cfg->zero_stage == 1 ||
                                                                  cfg->grad_dtype == DTYPE_BF16 || cfg->average_in_collective);
    GPT2Kernels kernels;
    config_gpt2_kernels(cfg, &kernels);
    if (kernels.attention == ATTENTION_FLASH && !flash_attention_supported(mc.channels, mc.num_heads)) {
        fatal("--attention flash: head size %d (channels %d / heads %d) must be a multiple of 16 up to %d; pass "
              "--attention naive", mc.channels / mc.num_heads, mc.channels, mc.num_heads, FLASH_HS_MAX);
    }
    check_memory(cfg, &mc, &kernels, gpu, plugin);
    float* dense = load_initial_weights(cfg->model, (uint64_t)cfg->seed, cfg->resume, &mc);
    gpt2_init(&tr->model, &mc, cfg->B, cfg->T, gpu->stream, &kernels);
#ifdef USE_CUDNN
    cudnn_attention_report(gpu->rank == 0);  // rank 0 speaks for the ranks' graph builds
#endif
    tr->opt = plugin ? plugin_optimizer(cfg, &tr->model.config, gpu) : replicated_optimizer(cfg, &mc, gpu);
    gpt2_bind_buffers(&tr->model, (floatX*)tr->opt->params, tr->opt->grads, tr->opt->offsets);
    // ZeRO-1's two round trips run through these hooks, when the work is queued. Grads: backward
    // registers each tensor's gradient as ready (zero1_register_grad_ready), a full bucket starts
    // its reduce-scatter (start_grad_sync), finish_step waits for all (finish_grad_sync). Params:
    // the all-gathers finish_step starts after the update (start_param_sync) are waited for in
    // the next forward, block by block (zero1_finish_param_sync).
    tr->model.hooks = tr->opt->hooks;
    if (dense) tr->opt->ops->load_weights(tr->opt, dense);  // else a resume: checkpoint_restore loads it
    free(dense);
    cudaCheck(cudaMallocHost((void**)&tr->loss_host, sizeof(float)));
    cudaCheck(cudaMallocHost((void**)&tr->micro_losses_host, (size_t)tr->grad_accum_steps * sizeof(float)));
}

static void trainer_init(Trainer* tr, const TrainConfig* cfg, const GpuSetup* gpu) {
    trainer_init_with(tr, cfg, gpu, plugin_optimizer != NULL);
}

static void trainer_free(Trainer* tr) {
    tr->opt->ops->destroy(tr->opt);
    gpt2_free(&tr->model);
    cudaCheck(cudaFreeHost(tr->loss_host));
    cudaCheck(cudaFreeHost(tr->micro_losses_host));
}

// The loss summed on the device since it was zeroed, summed over ranks on the host (one
// float); read with whatever the stream already synced.
static float loss_over_ranks(Trainer* tr, const char* what, int step) {
    float total = tr->loss_host[0];
    if (tr->world > 1) mpi_allreduce_sum_deadline(&total, 1, MPI_FLOAT, what, step);
    return total;
}

// The step's mean loss over micro-steps and ranks, read by the update gate (run/step.h)
// once finish_step has waited for the norm: the losses' copies to the host were queued
// before, so they have arrived. --dp-invariant's from each micro-step's, in its order.
typedef struct {
    Trainer* tr;
    int step;
} StepLoss;

static float step_loss_at_gate(void* ctx) {
    StepLoss* l = (StepLoss*)ctx;
    Trainer* tr = l->tr;
    int k = tr->grad_accum_steps;
    if (tr->cfg.dp_invariant) return step_dp_invariant_loss(tr->micro_losses_host, k, tr->world, l->step + 1);
    return loss_over_ranks(tr, "loss all-reduce", l->step + 1) * (1.0f / ((float)k * tr->world));
}

// Micro-step `micro`'s batch from the loader, its upload queued (llmc/batch_upload.cuh).
static void upload_micro_batch(Trainer* tr, int micro, BatchFn next_batch, void* batch_ctx) {
    const int *inputs, *targets;
    next_batch(batch_ctx, micro, &inputs, &targets);
    gpt2_upload_batch(&tr->model, inputs, targets, tr->cfg.B, tr->cfg.T);
}

// One optimizer step: k micro-steps of forward+backward, then the optimizer (reduction,
// norm, AdamW); the host reads the loss and the norm once, at the update gate: after the
// norm is computed and before AdamW is queued, so that a non-finite step is never applied.
// Micro-step i+1's batch is uploaded while micro-step i computes; the first batch of a
// step is read when the step begins (the loader's position is part of a checkpoint, and
// the step line reports epochs by it, so no batch is read ahead across steps).
static StepResult trainer_step(void* t, int step, float lr, BatchFn next_batch, void* batch_ctx,
                               OutlierState* outliers) {
    Trainer* tr = (Trainer*)t;
    StepResult r = {step, 0.0f, 0.0f, lr, 0.0, 0, 0, NAN, NAN, 0, NAN, NAN};
    GPT2* m = &tr->model;
    cudaStream_t st = tr->gpu->stream;
    Optimizer* opt = tr->opt;
    int B = tr->cfg.B, T = tr->cfg.T, k = tr->grad_accum_steps;
    float loss_scale = step_loss_scale(&tr->cfg, k, tr->world);
    opt->ops->begin_step(opt, step);
    cudaCheck(cudaMemsetAsync(m->d_loss, 0, sizeof(float), st));
    upload_micro_batch(tr, 0, next_batch, batch_ctx);
    for (int micro = 0; micro < k; micro++) {
        opt->ops->begin_micro_step(opt, micro == k - 1);
        gpt2_forward_batch(m, B, T, loss_scale);  // fused kernels: dlogits for loss_scale already here
        if (tr->cfg.dp_invariant) {  // this micro-step's loss alone
            cudaCheck(cudaMemcpyAsync(tr->micro_losses_host + micro, m->d_loss, sizeof(float), cudaMemcpyDeviceToHost, st));
            cudaCheck(cudaMemsetAsync(m->d_loss, 0, sizeof(float), st));
        }
        // The next micro-step's batch is read and its upload queued while this one computes.
        if (micro + 1 < k) upload_micro_batch(tr, micro + 1, next_batch, batch_ctx);
        gpt2_backward(m, loss_scale);
    }
    cudaCheck(cudaMemcpyAsync(tr->loss_host, m->d_loss, sizeof(float), cudaMemcpyDeviceToHost, st));
    StepLoss loss = {tr, step};
    StepGate g;
    UpdateGate gate;
    opt->ops->finish_step(opt, step, lr, step_gate_begin(&g, &gate, outliers, &tr->cfg, &r, step_loss_at_gate, &loss),
                          &r.comm_blocked_ms);
    r.grad_norm = opt->ops->read_norm(opt);
    return r;
}

static void trainer_sync_params(Trainer* tr) {
    seam_stop_at("sync_params", 1, "before its parameters' sync number");  // a peer that dies before its all-gathers
    tr->opt->ops->sync_params(tr->opt);
    cudaDeadline("the parameters' all-gathers before the replica check or an evaluation",
                 cudaStreamSynchronize(tr->gpu->stream));
}

// A fingerprint of every parameter's bytes, to compare replicas.
static uint64_t params_fingerprint(Trainer* tr) {
    trainer_sync_params(tr);
    const GPT2* m = &tr->model;
    uint64_t h = FNV1A_START;
    for (int i = 0; i < m->num_tensors; i++) {
        size_t bytes = gpt2_tensor_numel(&m->config, i) * sizeof(floatX);
        unsigned char* buf = (unsigned char*)mallocCheck(bytes);
        cudaCheck(cudaMemcpy(buf, m->param[i], bytes, cudaMemcpyDeviceToHost));
        h = fnv1a(h, buf, bytes);
        free(buf);
    }
    return h;
}

// After training, every rank must hold the same parameters; a mismatch is a bug.
static int trainer_replicas_identical(void* t) {
    Trainer* tr = (Trainer*)t;
    return all_ranks_equal(params_fingerprint(tr), tr->world);
}

static float trainer_evaluate(void* t, DataLoader* val, int batches) {
    Trainer* tr = (Trainer*)t;
    trainer_sync_params(tr);  // a rank without a batch (-m below the ranks) still completes its params
    GPT2* m = &tr->model;
    cudaCheck(cudaMemsetAsync(m->d_loss, 0, sizeof(float), tr->gpu->stream));
    for (int walked = 0; validation_next_batch(val, &walked, batches, tr->rank, tr->world);) {
        gpt2_forward(m, val->inputs, val->targets, tr->cfg.B, tr->cfg.T);
    }
    cudaCheck(cudaMemcpyAsync(tr->loss_host, m->d_loss, sizeof(float), cudaMemcpyDeviceToHost, tr->gpu->stream));
    cudaCheck(cudaStreamSynchronize(tr->gpu->stream));
    return loss_over_ranks(tr, "validation loss all-reduce", -1) / (float)batches;
}

// The HellaSwag-style eval's forward (run/eval.h): the per-position fp32 losses,
// read back (the forward's addition into d_loss is harmless: a step or evaluate zeroes it).
static void hellaswag_rows(void* ctx, const int* inputs, const int* targets, int rows, int T, float* losses) {
    Trainer* tr = (Trainer*)ctx;
    gpt2_forward(&tr->model, inputs, targets, rows, T);
    cudaCheck(cudaMemcpyAsync(losses, tr->model.acts.losses, (size_t)rows * T * sizeof(float), cudaMemcpyDeviceToHost,
                              tr->gpu->stream));
    cudaDeadline("the HellaSwag eval's forward (after the parameters' all-gathers)",
                 cudaStreamSynchronize(tr->gpu->stream));
}

// The logits of the last position of tokens[0..n) (the sampler's forward), as fp32 on the host.
static void next_token_logits(void* ctx, const int* tokens, int n, float* logits) {
    Trainer* tr = (Trainer*)ctx;
    int window = n < tr->cfg.T ? n : tr->cfg.T, Vp = tr->model.config.padded_vocab_size;
    gpt2_forward(&tr->model, tokens + (n - window), NULL, 1, window);
    floatX* row = (floatX*)mallocCheck((size_t)Vp * sizeof(floatX));
    cudaCheck(cudaMemcpyAsync(row, tr->model.acts.logits + (size_t)(window - 1) * Vp, (size_t)Vp * sizeof(floatX),
                              cudaMemcpyDeviceToHost, tr->gpu->stream));
    cudaDeadline("the sampler's forward (after the parameters' all-gathers)",
                 cudaStreamSynchronize(tr->gpu->stream));
    for (int v = 0; v < Vp; v++) logits[v] = (float)row[v];
    free(row);
}

// ----------------------------------------------------------------------------
// What the run prints of the GPU trainer

// The start line's last fields and the kernels line (rank 0, after the start line).
static void describe_trainer(const Trainer* tr, char* fields, size_t nf, char* line, size_t nl) {
    snprintf(fields, nf, "GPU %s | %s", cuda_libs.device_name, PRECISION_NAME);
    const GPT2Kernels* k = &tr->model.kernels;
    char ledger[160];
    memory_kernel_choices(&tr->cfg, &tr->model.config, k, (int)sizeof(floatX), ledger, sizeof(ledger));
    snprintf(line, nl, "kernels: attention %s | recompute GELU %d | fused kernels %d | %s",
             attention_kind_name(k->attention), k->recompute_gelu, k->fused, ledger);
}

static size_t gpu_memory_in_use(void* unused) {
    (void)unused;
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
}

static void print_gpu_memory(const Trainer* tr) {
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (tr->rank == 0) {
        printf("GPU memory in use at the end: %.1f MiB of %.1f MiB (the whole GPU: ranks sharing it add up)\n",
               (double)(total_bytes - free_bytes) / (1 << 20), (double)total_bytes / (1 << 20));
    }
}

// ----------------------------------------------------------------------------
// The functions a test build plants its faults with (run/seams.h)

// One float of a gradient, on the compute stream after the backward work queued so far.
static void trainer_write_grad(void* t, int tensor, float value) {
    GPT2* m = &((Trainer*)t)->model;
    cudaCheck(cudaMemcpyAsync(m->grad[tensor], &value, sizeof(float), cudaMemcpyHostToDevice, m->stream));
}

// The loss summed on the device so far, on the compute stream after the forward queued so far.
static void trainer_write_loss(void* t, float value) {
    GPT2* m = &((Trainer*)t)->model;
    cudaCheck(cudaMemcpyAsync(m->d_loss, &value, sizeof(float), cudaMemcpyHostToDevice, m->stream));
}

// MFU's peak: this GPU's dense rate for the build's precision (run/chip_peaks.h); the
// device memory in use, whose peak over the steps the step line reports.
static void set_gpu_metrics(Metrics* m) {
    int device;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    const ChipPeak* chip = chip_peak_find(prop.name);
    int bf16 = sizeof(floatX) == 2;
    char what[200];
    if (chip && !ON_CPU_LAYER) {
        double tflops = bf16 ? chip->bf16_tflops : chip->fp32_tflops;
        snprintf(what, sizeof(what), "%s (%s), dense %s %.1f TFLOPS per GPU", chip->chip, prop.name,
                 bf16 ? "BF16" : "FP32", tflops);
        metrics_set_peak(m, tflops * 1e12, what);
    } else if (ON_CPU_LAYER) {
        snprintf(what, sizeof(what), "the CPU execution layer plays '%s': no GPU's peak applies", prop.name);
        metrics_set_peak(m, 0, what);
    } else {
        snprintf(what, sizeof(what), "'%s' is not a chip whose dense %s peak is known (run/chip_peaks.c)", prop.name,
                 bf16 ? "BF16" : "FP32");
        metrics_set_peak(m, 0, what);
    }
    metrics_set_device(m, gpu_memory_in_use, NULL);
}

// ----------------------------------------------------------------------------
// The run: its steps between run_begin (main: MPI, flags, -y 1's checkpoint) and the end

static int train(Run* run) {
    GpuSetup gpu;
    gpu_setup(&gpu, run->rank, run->world);  // this rank's GPU, its libraries and compute stream
    Trainer tr;
    trainer_init(&tr, &run->cfg, &gpu);  // memory checked, model, optimizer
    seam_plant_faults(&tr.model.hooks, &tr, trainer_write_grad, trainer_write_loss, &run->cfg, &tr.model.config,
                      tr.grad_accum_steps, run->rank, run->world);
    if (run_open(run, &tr.model.config, tr.opt)) {  // data, -o, main.log; 0: -y 1 found the run complete
        RunEvals evals = {trainer_evaluate, hellaswag_rows, next_token_logits, &tr};
        char fields[160], line[256];  // what run_start prints of this trainer
        describe_trainer(&tr, fields, sizeof(fields), line, sizeof(line));
        set_gpu_metrics(&run->metrics);
        for (int step = run_start(run, fields, line); run_evaluate(run, step, &evals); step++) {
            RunBatch b = run_step_begin(run, step);
            StepResult r = trainer_step(&tr, step, b.lr, b.next, b.ctx, &run->outliers);
            run_step_end(run, &r);
        }
        run_end(run, trainer_replicas_identical(&tr));
        print_gpu_memory(&tr);
    }
    trainer_free(&tr);
    gpu_teardown(&gpu);
    return run_close(run);
}

#ifndef TESTING
int main(int argc, char** argv) {
#ifdef __CUDA_CPU__
    blas_pick_kernels(argv);  // the CPU layer's cuBLAS is OpenBLAS: restart on better kernels, as train_gpt2 does
#endif
    static Run run;  // 130 KB: off the stack, so that run_begin can check a small stack limit first
    run_begin(&run, &argc, &argv, &TRAINER_BUILD, NULL, 0);  // MPI, flags, -y 1's checkpoint, ranks agree
    return train(&run);
}
#endif
