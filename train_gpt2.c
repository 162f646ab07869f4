/*
 * GPT-2 training on the CPU: the reference trainer.
 *
 * fp32 compute with OpenBLAS and OpenMP, data parallel over MPI. With -z 0 every rank
 * sums the whole gradient buffer (MPI_Allreduce) and runs the full AdamW; with -z 1
 * (built with USE_ZERO1=1) the zero1/ plugin shards the optimizer instead.
 *
 *   make train_gpt2 && ./train_gpt2 -e d4 -b 4 -t 64 -x 20
 *   mpirun -np 4 ./train_gpt2 -e d4 -b 1 -t 64 -d 256
 */
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdint.h>
#include <time.h>

#include "llmc/adamw.h"
#include "llmc/gpt2_cpu.h"
#include "llmc/muon_cpu.h"
#include "run/blas_cores.h"
#include "run/memory_check.h"
#include "run/model_file.h"
#include "run/mpi_wait.h"
#include "run/run.h"
#include "run/seams.h"
#include "run/threads.h"

// The zero1/ plugin, when built in, is the default optimizer (its -z 0 is the bucketed
// replicated mode); without it the trainer has only its plain replicated optimizer. Test
// binaries swap in their own plugin_optimizer (dev/test/testing_cpu.h: the test devices).
#ifdef USE_ZERO1
#include "zero1/gpt2.h"
static Optimizer* zero1_cpu_optimizer(const TrainConfig* cfg, const GPT2Config* mc, int world) {
    return zero1_gpt2_optimizer(cfg, mc, zero1_backend_cpu(cfg, world), ZERO1_FP32);
}
static Optimizer* (*plugin_optimizer)(const TrainConfig*, const GPT2Config*, int) = zero1_cpu_optimizer;
static const MemoryZero1Sizes plugin_memory = zero1_gpt2_memory_buffers;
#define PLUGIN_BUILT "zero1/ in"
#define HAS_ZERO1 1
#else
static Optimizer* (*plugin_optimizer)(const TrainConfig*, const GPT2Config*, int) = NULL;
static const MemoryZero1Sizes plugin_memory = NULL;
#define PLUGIN_BUILT "no zero1/"
#define HAS_ZERO1 0
#endif
// The make line of this build with the plugin (the Makefile passes it), for the hints.
#ifndef REBUILD_WITH_ZERO1
#define REBUILD_WITH_ZERO1 "make train_gpt2 USE_ZERO1=1"
#endif
static const TrainerBuild TRAINER_BUILD = {"train_gpt2, CPU fp32, " PLUGIN_BUILT, 0, HAS_ZERO1, DTYPE_FP32, 0,
                                           REBUILD_WITH_ZERO1};

// ----------------------------------------------------------------------------
// The plain replicated optimizer: one dense buffer in canonical order, one all-reduce of
// the whole gradient (under --comm-timeout), the full AdamW (or, with --optimizer muon, Muon on
// the hidden matrices, its momentum in adam_m, and AdamW on the rest) on every rank. No zero1/ code
// at all (only the deadline of run/watchdog.h, which moves no data): tests use it as the
// independent reference for the plugin.

typedef struct {
    Optimizer base;
    GPT2Config config;
    TrainConfig cfg;
    size_t numel;
    size_t* offsets;           // canonical dense offsets (no padding)
    float *params, *grads, *adam_m, *adam_v;
    float norm;
    int muon;                  // --optimizer muon
    MuonConfig muon_config;
    MuonMatrix* muon_matrices; // the hidden matrices (their shapes set once, their buffers every step)
    float* muon_work;          // Newton-Schulz's scratch, the largest matrix's per thread
    double update_ms;          // the updates' wall time (print_end: the optimizer's share of a step)
    int updates;
} ReplicatedOptimizer;

static ReplicatedOptimizer* replicated(Optimizer* o) { return (ReplicatedOptimizer*)o; }

static void rep_load_weights(Optimizer* o, const float* dense) {
    memcpy(replicated(o)->params, dense, replicated(o)->numel * sizeof(float));
}
static void rep_begin_step(Optimizer* o, int step) {
    memset(replicated(o)->grads, 0, replicated(o)->numel * sizeof(float));
}
static void rep_begin_micro_step(Optimizer* o, int is_last) {}

// Stops every rank if a gradient is not finite, naming the first tensor affected.
static void check_grads_finite(const ReplicatedOptimizer* r, int step) {
    for (int i = 0; i < gpt2_num_tensors(&r->config); i++) {
        const float* g = r->grads + r->offsets[i];
        size_t n = gpt2_tensor_numel(&r->config, i);
        for (size_t j = 0; j < n; j++) {
            if (!isfinite(g[j])) {
                char name[64];
                fatal("non-finite gradient in %s (element %zu) at step %d",
                      gpt2_tensor_name(&r->config, i, name, 64), j, step + 1);
            }
        }
    }
}

// The sum of squares in fixed chunks, each summed in order, the chunks in order: the same
// bits for any thread count (an OpenMP reduction's order depends on it).
static double sum_squares_fixed_order(const float* x, size_t n) {
    enum { CHUNK = 1 << 16 };
    size_t chunks = (n + CHUNK - 1) / CHUNK;
    double* part = (double*)mallocCheck((chunks > 0 ? chunks : 1) * sizeof(double));
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        size_t end = (c + 1) * CHUNK < n ? (c + 1) * CHUNK : n;
        double s = 0.0;
        for (size_t i = c * CHUNK; i < end; i++) s += (double)x[i] * x[i];
        part[c] = s;
    }
    double sum = 0.0;
    for (size_t c = 0; c < chunks; c++) sum += part[c];
    free(part);
    return sum;
}

static void rep_finish_step(Optimizer* o, int step, float lr, const UpdateGate* gate, double* blocked_ms) {
    ReplicatedOptimizer* r = replicated(o);
    double t0 = wall_ms();
    if (o->world > 1) mpi_allreduce_sum_deadline(r->grads, r->numel, MPI_FLOAT, "gradient all-reduce", step + 1);
    *blocked_ms += wall_ms() - t0;
    if (r->cfg.check_nan) check_grads_finite(r, step);
    r->norm = (float)sqrt(sum_squares_fixed_order(r->grads, r->numel));
    if (gate && gate->skip(gate->ctx, r->norm)) return;
    float clip = r->cfg.grad_clip;
    float grad_scale = (clip > 0.0f && r->norm > clip) ? clip / r->norm : 1.0f;
    AdamWStep s = adamw_step_params(lr, r->cfg.beta1, r->cfg.beta2, r->cfg.eps, r->cfg.weight_decay, step + 1,
                                    grad_scale);
    double t1 = wall_ms();
    int muon_matrices = 0;
    for (int i = 0; i < gpt2_num_tensors(&r->config); i++) {
        size_t off = r->offsets[i];
        if (r->muon && gpt2_tensor_is_hidden_matrix(&r->config, i)) {
            MuonMatrix* m = &r->muon_matrices[muon_matrices++];
            m->param = r->params + off;
            m->grad = r->grads + off;
            m->momentum = r->adam_m + off;
            continue;
        }
        adamw_update_range(r->params + off, r->grads + off, r->adam_m + off, r->adam_v + off,
                           gpt2_tensor_numel(&r->config, i), &s, gpt2_tensor_decays(&r->config, i));
    }
    int C = r->config.channels;
    muon_update_matrices(r->muon_matrices, muon_matrices, lr, r->cfg.weight_decay, grad_scale, &r->muon_config,
                         r->muon_work, 4 * C, C);
    r->update_ms += wall_ms() - t1;
    r->updates++;
}

static float rep_read_norm(Optimizer* o) { return replicated(o)->norm; }
static void rep_sync_params(Optimizer* o) {}

// Checkpoints: every rank holds everything, so each saves and loads its 1/world part.
static int rep_checkpoint_pieces(Optimizer* o, OptimizerPiece* out, int max) {
    ReplicatedOptimizer* r = replicated(o);
    return optimizer_split_pieces(r->offsets, gpt2_num_tensors(&r->config), r->numel, utils_rank(), o->world, out, max);
}
// The buffers are dense canonical already: a range is at offsets[param] + start.
static float* rep_state_at(ReplicatedOptimizer* r, OptimizerState which, const OptimizerPiece* range) {
    float* base = which == OPTIMIZER_M ? r->adam_m : which == OPTIMIZER_V ? r->adam_v : r->params;
    return base + r->offsets[range->param] + range->start;
}
static void rep_read_piece(Optimizer* o, OptimizerState which, const OptimizerPiece* range, float* host) {
    memcpy(host, rep_state_at(replicated(o), which, range), range->n * sizeof(float));
}
static void rep_write_piece(Optimizer* o, OptimizerState which, const OptimizerPiece* range, const float* host) {
    memcpy(rep_state_at(replicated(o), which, range), host, range->n * sizeof(float));
}
// Every rank loaded its part of each array: share the parts.
static void rep_finish_import(Optimizer* o, int steps_done) {
    ReplicatedOptimizer* r = replicated(o);
    if (o->world == 1) return;
    float* arrays[] = {r->params, r->adam_m, r->adam_v};
    for (int i = 0; i < 3; i++) checkpoint_share_split(arrays[i], r->numel, o->world);
}
static size_t rep_state_bytes(const Optimizer* o) { return 2 * ((const ReplicatedOptimizer*)o)->numel * sizeof(float); }
static void rep_print_start(Optimizer* o) {
    if (utils_rank() == 0) checkpoint_print_bound();
}
static void rep_print_end(Optimizer* o) {
    ReplicatedOptimizer* r = replicated(o);
    if (utils_rank() == 0 && r->updates > 0) {
        printf("optimizer update (%s): %.1f ms per step on average\n", r->cfg.optimizer, r->update_ms / r->updates);
    }
}
static void rep_destroy(Optimizer* o) {
    ReplicatedOptimizer* r = replicated(o);
    void* all[] = {r->offsets, r->params, r->grads, r->adam_m, r->adam_v, r->muon_work, r->muon_matrices, r};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
}

static const OptimizerOps replicated_ops = {
    rep_load_weights, rep_begin_step, rep_begin_micro_step, rep_finish_step, rep_read_norm, rep_sync_params,
    rep_checkpoint_pieces, rep_read_piece, rep_write_piece, rep_finish_import, rep_state_bytes, rep_print_start,
    rep_print_end, rep_destroy,
};

static Optimizer* replicated_optimizer(const TrainConfig* cfg, const GPT2Config* mc, int world) {
    ReplicatedOptimizer* r = (ReplicatedOptimizer*)callocCheck(1, sizeof(ReplicatedOptimizer));
    r->config = *mc;
    r->cfg = *cfg;
    r->offsets = (size_t*)mallocCheck(gpt2_num_tensors(mc) * sizeof(size_t));
    r->numel = gpt2_tensor_offsets_dense(mc, r->offsets);
    r->params = (float*)callocCheck(r->numel, sizeof(float));
    r->grads = (float*)callocCheck(r->numel, sizeof(float));
    r->adam_m = (float*)callocCheck(r->numel, sizeof(float));
    r->adam_v = (float*)callocCheck(r->numel, sizeof(float));
    r->muon = config_uses_muon(cfg);
    if (r->muon) {
        config_muon(cfg, &r->muon_config);
        r->muon_work = (float*)mallocCheck(muon_matrices_work_floats(4 * mc->channels, mc->channels) * sizeof(float));
        r->muon_matrices = (MuonMatrix*)callocCheck((size_t)4 * mc->num_layers, sizeof(MuonMatrix));
        for (int i = 0, k = 0; i < gpt2_num_tensors(mc); i++) {
            if (!gpt2_tensor_is_hidden_matrix(mc, i)) continue;
            MuonMatrix* m = &r->muon_matrices[k++];
            gpt2_matrix_shape(mc, i, &m->rows, &m->cols);
            m->qkv = gpt2_matrix_is_qkv(mc, i);
        }
    }
    return optimizer_expose(&r->base, "replicated", &replicated_ops, r->params, r->grads, r->offsets, r->numel, world);
}

// ----------------------------------------------------------------------------
// The trainer: a model bound to an optimizer's buffers.

typedef struct {
    TrainConfig cfg;
    int rank, world;
    int grad_accum_steps;      // micro-steps per optimizer step
    GPT2 model;
    Optimizer* opt;
    float* micro_losses;       // this step's, one per micro-step (--dp-invariant sums them in its order)
} Trainer;

// cfg passed config_validate. use_plugin: run the optimizer through zero1/ (with the
// plugin built in, always: -z 0 is then its replicated mode). Without it, the plain
// replicated optimizer above, which tests use as the independent reference.
static void trainer_init_with(Trainer* tr, const TrainConfig* cfg, int rank, int world, int use_plugin) {
    memset(tr, 0, sizeof(*tr));
    tr->cfg = *cfg;
    tr->rank = rank;
    tr->world = world;
    GPT2Config mc;
    model_shape_of(cfg->model, &mc);  // the shape alone: memory is checked before the weights take any
    config_validate_model(cfg, &mc);
    tr->grad_accum_steps = config_micro_steps(cfg, world);
    tr->micro_losses = (float*)mallocCheck((size_t)tr->grad_accum_steps * sizeof(float));
    int plugin = plugin_optimizer && (use_plugin || cfg->zero_stage == 1 || cfg->param_dtype == DTYPE_BF16 ||
                                      cfg->grad_dtype == DTYPE_BF16 || cfg->average_in_collective);
    memory_check_cpu(cfg, &mc, world, plugin ? plugin_memory : NULL);
    float* dense = load_initial_weights(cfg->model, (uint64_t)cfg->seed, cfg->resume, &mc);
    gpt2_init(&tr->model, &mc, cfg->B, cfg->T);
    tr->opt = plugin ? plugin_optimizer(cfg, &tr->model.config, world) : replicated_optimizer(cfg, &mc, world);
    gpt2_bind_buffers(&tr->model, (float*)tr->opt->params, tr->opt->grads, tr->opt->offsets);
    // ZeRO-1's two round trips run through these hooks. Grads: backward registers each tensor's
    // gradient as ready (zero1_register_grad_ready), a full bucket starts its reduce-scatter
    // (start_grad_sync), finish_step waits for all (finish_grad_sync). Params: the all-gathers
    // finish_step starts after the update (start_param_sync) are waited for in the next
    // forward, block by block (zero1_finish_param_sync).
    tr->model.hooks = tr->opt->hooks;
    if (dense) tr->opt->ops->load_weights(tr->opt, dense);  // else a resume: checkpoint_restore loads it
    free(dense);
}

static void trainer_init(Trainer* tr, const TrainConfig* cfg, int rank, int world) {
    trainer_init_with(tr, cfg, rank, world, plugin_optimizer != NULL);
}

static void trainer_free(Trainer* tr) {
    free(tr->micro_losses);
    tr->opt->ops->destroy(tr->opt);
    gpt2_free(&tr->model);
}

// One optimizer step: k micro-steps of forward+backward, the gradient reduction, AdamW.
static StepResult trainer_step(void* t, int step, float lr, BatchFn next_batch, void* batch_ctx,
                               OutlierState* outliers) {
    Trainer* tr = (Trainer*)t;
    StepResult r = {step, 0.0f, 0.0f, lr, 0.0, 0, 0, NAN, NAN, 0, NAN, NAN};
    GPT2* m = &tr->model;
    Optimizer* opt = tr->opt;
    int B = tr->cfg.B, T = tr->cfg.T, k = tr->grad_accum_steps;
    float loss_scale = step_loss_scale(&tr->cfg, k, tr->world);
    double loss_sum = 0.0;
    opt->ops->begin_step(opt, step);
    for (int micro = 0; micro < k; micro++) {
        const int *inputs, *targets;
        next_batch(batch_ctx, micro, &inputs, &targets);
        opt->ops->begin_micro_step(opt, micro == k - 1);
        gpt2_forward(m, inputs, targets, B, T);
        loss_sum += m->mean_loss;
        tr->micro_losses[micro] = m->mean_loss;
        gpt2_backward(m, loss_scale);
    }
    float loss = (float)(loss_sum / k);
    double loss_wait_ms = wall_ms();  // where the ranks first wait for a late one: comm wait too
    if (tr->cfg.dp_invariant) {
        r.loss = step_dp_invariant_loss(tr->micro_losses, k, tr->world, step + 1);
    } else {
        if (tr->world > 1) mpi_allreduce_sum_deadline(&loss, 1, MPI_FLOAT, "loss all-reduce", step + 1);
        r.loss = loss / tr->world;
    }
    loss_wait_ms = wall_ms() - loss_wait_ms;
    StepGate g;
    UpdateGate gate;
    opt->ops->finish_step(opt, step, lr, step_gate_begin(&g, &gate, outliers, &tr->cfg, &r, NULL, NULL),
                          &r.comm_blocked_ms);
    r.comm_blocked_ms += loss_wait_ms;
    r.grad_norm = opt->ops->read_norm(opt);
    return r;
}

// Makes the model's parameter views complete and current on this rank (with ZeRO-1,
// waits for the all-gathers still in flight).
static void trainer_sync_params(Trainer* tr) { tr->opt->ops->sync_params(tr->opt); }

// A fingerprint of every parameter's bytes, to compare replicas.
static uint64_t params_fingerprint(const GPT2* m) {
    uint64_t h = FNV1A_START;
    for (int i = 0; i < m->num_tensors; i++) h = fnv1a(h, m->param[i], gpt2_tensor_numel(&m->config, i) * sizeof(float));
    return h;
}

// After training, every rank must hold the same parameters; a mismatch is a bug.
static int trainer_replicas_identical(void* t) {
    Trainer* tr = (Trainer*)t;
    trainer_sync_params(tr);
    return all_ranks_equal(params_fingerprint(&tr->model), tr->world);
}

// ----------------------------------------------------------------------------
// Evaluation, and the forwards of the HellaSwag-style eval and of samples

static float trainer_evaluate(void* t, DataLoader* val, int batches) {
    Trainer* tr = (Trainer*)t;
    trainer_sync_params(tr);  // a rank without a batch (-m below the ranks) still completes its params
    double sum = 0.0;
    for (int walked = 0; validation_next_batch(val, &walked, batches, tr->rank, tr->world);) {
        gpt2_forward(&tr->model, val->inputs, val->targets, tr->cfg.B, tr->cfg.T);
        sum += tr->model.mean_loss;
    }
    if (tr->world > 1) mpi_allreduce_sum_deadline(&sum, 1, MPI_DOUBLE, "validation loss all-reduce", -1);
    return (float)(sum / batches);
}

// The HellaSwag-style eval's forward (run/eval.h): the per-position losses.
static void hellaswag_rows(void* ctx, const int* inputs, const int* targets, int rows, int T, float* losses) {
    Trainer* tr = (Trainer*)ctx;
    gpt2_forward(&tr->model, inputs, targets, rows, T);
    memcpy(losses, tr->model.acts.losses, (size_t)rows * T * sizeof(float));
}

static void next_token_logits(void* ctx, const int* tokens, int n, float* logits) {
    Trainer* tr = (Trainer*)ctx;
    int window = n < tr->cfg.T ? n : tr->cfg.T;
    gpt2_forward(&tr->model, tokens + (n - window), NULL, 1, window);
    int Vp = tr->model.config.padded_vocab_size;
    memcpy(logits, tr->model.acts.logits + (size_t)(window - 1) * Vp, (size_t)Vp * sizeof(float));
}

// ----------------------------------------------------------------------------
// The functions a test build plants its faults with (run/seams.h)

static void trainer_write_grad(void* t, int tensor, float value) { ((Trainer*)t)->model.grad[tensor][0] = value; }
static void trainer_write_loss(void* t, float value) { ((Trainer*)t)->model.mean_loss = value; }

// MFU's peak on the CPU: the rate of the trainer's own matmul (its threads, OpenBLAS's
// kernels) on a block of the model's shape, best of a few calls: about 10 ms at start.
static void set_cpu_peak(Metrics* m, const GPT2Config* mc) {
    // A large product (as the classifier's), at which OpenBLAS runs near its best: a small one
    // measured a rate that the model's large matmuls beat (an MFU above 100%).
    int BT = 256, C = mc->channels, OC = 4096;
    float* inp = (float*)mallocCheck((size_t)BT * C * sizeof(float));
    float* weight = (float*)mallocCheck((size_t)OC * C * sizeof(float));
    float* out = (float*)mallocCheck((size_t)BT * OC * sizeof(float));
    for (size_t i = 0; i < (size_t)BT * C; i++) inp[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)OC * C; i++) weight[i] = (float)(i % 7) * 0.01f;
    double best_ms = 1e30;
    for (int i = 0; i < 6; i++) {  // the first call pages the buffers in; the best of 5 (a loaded host delays some)
        double t0 = wall_ms();
        matmul_forward(out, inp, weight, NULL, BT, C, OC);
        double ms = wall_ms() - t0;
        if (i > 0 && ms < best_ms) best_ms = ms;
    }
    double rate = 2.0 * BT * C * OC / (best_ms / 1e3);
    char what[200];
    snprintf(what, sizeof(what), "this rank's measured matmul rate, %.1f GFLOP/s (%d x %d x %d, %d threads)",
             rate / 1e9, BT, C, OC, omp_get_max_threads());
    metrics_set_peak(m, rate, what);
    free(inp);
    free(weight);
    free(out);
}

// ----------------------------------------------------------------------------
// The run: its steps between run_begin (main: MPI, flags, -y 1's checkpoint) and the end

static int train(Run* run) {
    CpuThreads threads = cpu_threads_setup();
    Trainer tr;
    trainer_init(&tr, &run->cfg, run->rank, run->world);  // memory checked, model, optimizer
    seam_plant_faults(&tr.model.hooks, &tr, trainer_write_grad, trainer_write_loss, &run->cfg, &tr.model.config,
                      tr.grad_accum_steps, run->rank, run->world);
    if (run_open(run, &tr.model.config, tr.opt)) {  // data, -o, main.log; 0: -y 1 found the run complete
        char fields[32], line[512];
        snprintf(fields, sizeof(fields), "%d threads", omp_get_max_threads());
        cpu_threads_describe(&threads, line, sizeof(line));
        set_cpu_peak(&run->metrics, &tr.model.config);
        RunEvals evals = {trainer_evaluate, hellaswag_rows, next_token_logits, &tr};
        for (int step = run_start(run, fields, line); run_evaluate(run, step, &evals); step++) {
            RunBatch b = run_step_begin(run, step);
            StepResult r = trainer_step(&tr, step, b.lr, b.next, b.ctx, &run->outliers);
            run_step_end(run, &r);
        }
        run_end(run, trainer_replicas_identical(&tr));
    }
    trainer_free(&tr);
    return run_close(run);
}

#ifndef TESTING
int main(int argc, char** argv) {
    blas_pick_kernels(argv);  // may restart the program on better OpenBLAS kernels: first, before MPI
    static Run run;  // 130 KB: off the stack, so that run_begin can check a small stack limit first
    run_begin(&run, &argc, &argv, &TRAINER_BUILD, NULL, 0);  // MPI, flags, -y 1's checkpoint, ranks agree
    return train(&run);
}
#endif
