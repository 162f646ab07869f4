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
#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/dataloader.h"
#include "llmc/gpt2_cpu.h"
#include "llmc/logger.h"
#include "llmc/model_file.h"
#include "llmc/rng.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"
#include "llmc/train_loop.h"
#include "llmc/utils.h"
#ifdef USE_ZERO1
#include "zero1/trainer_glue.h"
#endif

#ifdef USE_ZERO1
#define DEFAULT_ZERO_STAGE 1
#else
#define DEFAULT_ZERO_STAGE 0
#endif

// ----------------------------------------------------------------------------
// The trainer: a model bound to a param and a grad buffer, and an optimizer.

typedef struct {
    TrainConfig cfg;
    int rank, world;
    int grad_accum_steps;      // micro-steps per optimizer step
    GPT2 model;
    size_t* offsets;           // start of every canonical tensor in params/grads
    size_t numel;              // buffer length (the dense replicated layout has no padding)
    float* params;             // fp32 compute params
    float* grads;              // fp32 gradient buffer
    float* adam_m;             // replicated AdamW state (-z 0), same layout as params
    float* adam_v;
#ifdef USE_ZERO1
    Zero1Glue* zero1;          // -z 1: owns the buffers and the optimizer
#endif
} Trainer;

// --test-plant-nan: writes a NaN into h0.qkvb's gradient as soon as backward finishes it,
// before the runtime's hook sees it (so that bucket's reduction cannot have started yet).
static GPT2* planting_model;
static void (*planted_hook)(void* ctx, int tensor);
static void plant_nan_hook(void* ctx, int tensor) {
    if (tensor == gpt2_idx_layer(0, LAYER_QKVB)) planting_model->grad[tensor][0] = NAN;
    if (planted_hook) planted_hook(ctx, tensor);
}

static void trainer_load_weights(Trainer* tr, const float* dense) {
    const GPT2Config* c = &tr->model.config;
    size_t* dense_offsets = (size_t*)mallocCheck(tr->model.num_tensors * sizeof(size_t));
    gpt2_tensor_offsets_dense(c, dense_offsets);
    for (int i = 0; i < tr->model.num_tensors; i++) {
        memcpy(tr->model.param[i], dense + dense_offsets[i], gpt2_tensor_numel(c, i) * sizeof(float));
    }
    free(dense_offsets);
}

// Checks the configuration against the model; returns the micro-steps per optimizer step.
static int check_config(const TrainConfig* cfg, const GPT2Config* mc, int world) {
    int grad_accum_steps = check_batch_config(cfg, mc, world);
#ifndef USE_ZERO1
    if (cfg->zero_stage == 1) {
        fatal("-z 1 needs the zero1/ plugin: rebuild with `make train_gpt2 USE_ZERO1=1`");
    }
    if (cfg->param_dtype != DTYPE_FP32 || cfg->grad_dtype != DTYPE_FP32) {
        fatal("--param-dtype/--grad-dtype bf16 need the zero1/ plugin: rebuild with `make train_gpt2 USE_ZERO1=1`");
    }
    if (cfg->trace_file) fatal("--trace needs the zero1/ plugin: rebuild with `make train_gpt2 USE_ZERO1=1`");
#endif
    if ((cfg->checkpoint_every > 0 || cfg->resume) && cfg->output_dir == NULL) {
        fatal("checkpoints (-n, -y) live in the output directory: give one with -o");
    }
    return grad_accum_steps;
}

// use_plugin: run the optimizer through zero1/ (with the plugin built in, always: -z 0 is
// then its replicated mode, bucketed all-reduce on the same buffers). Without it, the plain
// replicated path: one dense buffer, one MPI_Allreduce, no zero1/ code at all. Tests use
// the plain path as an independent reference.
static void trainer_init_with(Trainer* tr, const TrainConfig* cfg, int rank, int world, int use_plugin) {
    memset(tr, 0, sizeof(*tr));
    tr->cfg = *cfg;
    tr->rank = rank;
    tr->world = world;
    GPT2Config mc;
    float* dense = load_initial_weights(cfg, &mc);
    tr->grad_accum_steps = check_config(cfg, &mc, world);
    gpt2_init(&tr->model, &mc, cfg->B, cfg->T);
    int NT = tr->model.num_tensors;
    tr->offsets = (size_t*)mallocCheck(NT * sizeof(size_t));
#ifdef USE_ZERO1
    if (use_plugin || cfg->zero_stage == 1 || cfg->param_dtype == DTYPE_BF16 || cfg->grad_dtype == DTYPE_BF16) {
        tr->zero1 = zero1_glue_create(cfg, &tr->model, rank, world);
        trainer_load_weights(tr, dense);
        zero1_glue_after_load(tr->zero1);
        free(dense);
        return;
    }
#endif
    tr->numel = gpt2_tensor_offsets_dense(&mc, tr->offsets);
    tr->params = (float*)mallocCheck(tr->numel * sizeof(float));
    tr->grads = (float*)callocCheck(tr->numel, sizeof(float));
    tr->adam_m = (float*)callocCheck(tr->numel, sizeof(float));
    tr->adam_v = (float*)callocCheck(tr->numel, sizeof(float));
    gpt2_bind_buffers(&tr->model, tr->params, tr->grads, tr->offsets);
    trainer_load_weights(tr, dense);
    free(dense);
}

static void trainer_init(Trainer* tr, const TrainConfig* cfg, int rank, int world) {
#ifdef USE_ZERO1
    trainer_init_with(tr, cfg, rank, world, 1);
#else
    trainer_init_with(tr, cfg, rank, world, 0);
#endif
}

static void trainer_free(Trainer* tr) {
#ifdef USE_ZERO1
    if (tr->zero1) zero1_glue_destroy(tr->zero1);
#endif
    gpt2_free(&tr->model);
    free(tr->offsets);
    free(tr->params);
    free(tr->grads);
    free(tr->adam_m);
    free(tr->adam_v);
}

// Stops every rank if a gradient is not finite, naming the first tensor affected.
static void check_grads_finite(const GPT2* m, int step) {
    for (int i = 0; i < m->num_tensors; i++) {
        size_t n = gpt2_tensor_numel(&m->config, i);
        for (size_t j = 0; j < n; j++) {
            if (!isfinite(m->grad[i][j])) {
                char name[64];
                fatal("non-finite gradient in %s (element %zu) at step %d", gpt2_tensor_name(&m->config, i, name, 64),
                      j, step + 1);
            }
        }
    }
}

static void replicated_optimizer_step(Trainer* tr, StepResult* r, int step) {
    double t0 = wall_ms();
    if (tr->world > 1) mpiCheck(MPI_Allreduce(MPI_IN_PLACE, tr->grads, (int)tr->numel, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    r->comm_blocked_ms += wall_ms() - t0;
    if (tr->cfg.check_nan) check_grads_finite(&tr->model, step);
    double sumsq = 0.0;
#pragma omp parallel for reduction(+ : sumsq)
    for (size_t i = 0; i < tr->numel; i++) sumsq += (double)tr->grads[i] * tr->grads[i];
    r->grad_norm = (float)sqrt(sumsq);
    float clip = tr->cfg.grad_clip;
    float grad_scale = (clip > 0.0f && r->grad_norm > clip) ? clip / r->grad_norm : 1.0f;
    AdamWStep s = adamw_step_params(r->lr, tr->cfg.beta1, tr->cfg.beta2, tr->cfg.eps, tr->cfg.weight_decay, step + 1,
                                    grad_scale);
    const GPT2Config* c = &tr->model.config;
    for (int i = 0; i < tr->model.num_tensors; i++) {
        size_t off = tr->offsets[i];
        adamw_update_range(tr->params + off, tr->grads + off, tr->adam_m + off, tr->adam_v + off,
                           gpt2_tensor_numel(c, i), &s, gpt2_tensor_decays(c, i));
    }
}

// One optimizer step: k micro-steps of forward+backward, the gradient reduction, AdamW.
static StepResult trainer_step(Trainer* tr, int step, float lr, BatchFn next_batch, void* batch_ctx) {
    StepResult r = {step, 0.0f, 0.0f, lr, 0.0};
    GPT2* m = &tr->model;
    int B = tr->cfg.B, T = tr->cfg.T, k = tr->grad_accum_steps;
    // d(step loss)/d(position loss): the step loss is the mean over k*DP*B*T positions.
    float loss_scale = 1.0f / ((float)B * T * k * tr->world);
    double loss_sum = 0.0;
#ifdef USE_ZERO1
    if (tr->zero1) zero1_glue_begin_step(tr->zero1, step);
#endif
    if (tr->grads) memset(tr->grads, 0, tr->numel * sizeof(float));
    for (int micro = 0; micro < k; micro++) {
        const int *inputs, *targets;
        next_batch(batch_ctx, micro, &inputs, &targets);
#ifdef USE_ZERO1
        if (tr->zero1) zero1_glue_begin_micro_step(tr->zero1, micro == k - 1);
#endif
        gpt2_forward(m, inputs, targets, B, T);
        loss_sum += m->mean_loss;
        int plant = tr->cfg.plant_nan_step == step && micro == k - 1 && tr->rank == tr->world - 1;
        ModelHooks saved = m->hooks;
        if (plant) {  // test only: poison one gradient on the last rank, the moment it is final
            planting_model = m;
            planted_hook = saved.grad_contribution_done;
            m->hooks.grad_contribution_done = plant_nan_hook;
        }
        gpt2_backward(m, loss_scale);
        m->hooks = saved;
    }
    float local_loss = (float)(loss_sum / k), loss = local_loss;
    if (tr->world > 1) mpiCheck(MPI_Allreduce(&local_loss, &loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    r.loss = loss / tr->world;
#ifdef USE_ZERO1
    if (tr->zero1) {
        zero1_glue_finish_step(tr->zero1, step, lr, &r.grad_norm, &r.comm_blocked_ms);
        return r;
    }
#endif
    replicated_optimizer_step(tr, &r, step);
    return r;
}

// Makes the model's parameter views complete and current on this rank (with ZeRO-1,
// waits for the all-gathers still in flight).
static void trainer_sync_params(Trainer* tr) {
#ifdef USE_ZERO1
    if (tr->zero1) zero1_glue_sync_params(tr->zero1);
#endif
}

// A fingerprint of every parameter's bytes, to compare replicas.
static uint64_t params_fingerprint(const GPT2* m) {
    uint64_t h = FNV1A_START;
    for (int i = 0; i < m->num_tensors; i++) h = fnv1a(h, m->param[i], gpt2_tensor_numel(&m->config, i) * sizeof(float));
    return h;
}

// After training, every rank must hold the same parameters; a mismatch is a bug.
static int trainer_replicas_identical(Trainer* tr) {
    trainer_sync_params(tr);
    return all_ranks_equal(params_fingerprint(&tr->model), tr->world);
}

// Checkpoint state in model space (dense canonical arrays): fp32 master, m, v.
// Collective under ZeRO-1 (the shards are gathered).
static void trainer_export_state(Trainer* tr, float* master, float* m, float* v) {
    const GPT2Config* c = &tr->model.config;
    size_t* dense = (size_t*)mallocCheck(tr->model.num_tensors * sizeof(size_t));
    size_t n = gpt2_tensor_offsets_dense(c, dense);
#ifdef USE_ZERO1
    if (tr->zero1) {
        zero1_export_state(tr->zero1->rt, dense, m, v, master);
        free(dense);
        return;
    }
#endif
    // The plain path's buffers are dense canonical already.
    memcpy(master, tr->params, n * sizeof(float));
    memcpy(m, tr->adam_m, n * sizeof(float));
    memcpy(v, tr->adam_v, n * sizeof(float));
    free(dense);
}

static void trainer_import_state(Trainer* tr, const float* m, const float* v) {
    const GPT2Config* c = &tr->model.config;
    size_t* dense = (size_t*)mallocCheck(tr->model.num_tensors * sizeof(size_t));
    size_t n = gpt2_tensor_offsets_dense(c, dense);
#ifdef USE_ZERO1
    if (tr->zero1) {
        zero1_import_state(tr->zero1->rt, dense, m, v);
        free(dense);
        return;
    }
#endif
    memcpy(tr->adam_m, m, n * sizeof(float));
    memcpy(tr->adam_v, v, n * sizeof(float));
    free(dense);
}

static void save_checkpoint(Trainer* tr, int steps_done, const DataLoader* train, uint64_t sample_rng) {
    size_t n = gpt2_num_parameters(&tr->model.config);
    float* master = (float*)mallocCheck(n * sizeof(float));
    float* m = (float*)mallocCheck(n * sizeof(float));
    float* v = (float*)mallocCheck(n * sizeof(float));
    trainer_export_state(tr, master, m, v);
    CheckpointState s = {steps_done, 0, 0, sample_rng, tr->world, tr->cfg.B, tr->cfg.T, tr->grad_accum_steps};
    dataloader_position(train, &s.shard, &s.shard_tokens_done);
    if (tr->rank == 0) {
        checkpoint_save(tr->cfg.output_dir, &tr->model.config, master, m, v, &s);
        printf("checkpoint: step %d saved in %s/checkpoint_%08d\n", steps_done, tr->cfg.output_dir, steps_done);
    }
    mpiCheck(MPI_Barrier(MPI_COMM_WORLD));  // nobody runs ahead of a checkpoint being written
    free(master);
    free(m);
    free(v);
}

// -y 1: finds the newest checkpoint in -o, verified; its model.bin becomes the model to
// load. With none yet, the run starts from step 0 as if -y were 0.
static void find_resume_checkpoint(TrainConfig* cfg, char* dir, size_t n, CheckpointState* state) {
    static char model_path[PATH_MAX_LEN];
    if (cfg->output_dir == NULL) fatal("-y 1 resumes from the output directory: give it with -o");
    GPT2Config run_shape;
    model_shape_of(cfg->model, &run_shape);
    if (!checkpoint_open_for_resume(cfg->output_dir, &run_shape, cfg->model, dir, n, state)) {
        cfg->resume = 0;
        return;
    }
    path_format(model_path, sizeof(model_path), "%s/model.bin", dir);
    cfg->model = model_path;
}

// After the trainer loaded the checkpoint's weights: AdamW state, data position, RNG.
static void restore_checkpoint(Trainer* tr, const char* dir, const CheckpointState* state, DataLoader* train,
                               uint64_t* sample_rng) {
    const GPT2Config* mc = &tr->model.config;
    size_t n = gpt2_num_parameters(mc);
    float* m = (float*)mallocCheck(n * sizeof(float));
    float* v = (float*)mallocCheck(n * sizeof(float));
    char path[PATH_MAX_LEN];
    path_format(path, sizeof(path), "%s/optimizer.bin", dir);
    checkpoint_read_optimizer(path, mc, m, v, state->step);
    trainer_import_state(tr, m, v);
    free(m);
    free(v);
    dataloader_seek(train, state->shard, state->shard_tokens_done);
    *sample_rng = state->sample_rng;
    if (tr->rank == 0) {
        printf("resumed from %s: step %d (saved by %d ranks x B=%d x T=%d x %d micro-steps)\n", dir, state->step,
               state->world, state->B, state->T, state->grad_accum_steps);
    }
}

// ----------------------------------------------------------------------------
// The trainer as the training loop sees it

static float evaluate(Trainer* tr, DataLoader* val) {
    dataloader_reset(val);
    double sum = 0.0;
    for (int i = 0; i < tr->cfg.val_steps; i++) {
        dataloader_next_batch(val);
        gpt2_forward(&tr->model, val->inputs, val->targets, tr->cfg.B, tr->cfg.T);
        sum += tr->model.mean_loss;
    }
    float local = (float)(sum / tr->cfg.val_steps), total = local;
    if (tr->world > 1) mpiCheck(MPI_Allreduce(&local, &total, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    return total / tr->world;
}

static void next_token_logits(void* ctx, const int* tokens, int n, float* logits) {
    Trainer* tr = (Trainer*)ctx;
    int window = n < tr->cfg.T ? n : tr->cfg.T;
    gpt2_forward(&tr->model, tokens + (n - window), NULL, 1, window);
    int Vp = tr->model.config.padded_vocab_size;
    memcpy(logits, tr->model.acts.logits + (size_t)(window - 1) * Vp, (size_t)Vp * sizeof(float));
}

static StepResult loop_step(void* t, int step, float lr, BatchFn next_batch, void* batch_ctx) {
    return trainer_step((Trainer*)t, step, lr, next_batch, batch_ctx);
}
static float loop_evaluate(void* t, DataLoader* val) { return evaluate((Trainer*)t, val); }
static void loop_sample(void* t, const Tokenizer* tok, uint64_t* rng) {
    Trainer* tr = (Trainer*)t;
    print_sample(tr, next_token_logits, &tr->model.config, tr->cfg.T, tr->cfg.gen_tokens, tr->rank, tok, rng);
}
static void loop_checkpoint(void* t, int steps_done, const DataLoader* train, uint64_t rng) {
    save_checkpoint((Trainer*)t, steps_done, train, rng);
}

#ifndef TESTING
int main(int argc, char** argv) {
    int rank, world;
    mpi_start(&argc, &argv, &rank, &world);

    TrainConfig cfg;
    train_config_defaults(&cfg, DEFAULT_ZERO_STAGE);
    train_parse_args(&cfg, argc, argv);

    // -y 1: the newest checkpoint's master weights replace -e; the rest is restored below.
    char resume_dir[PATH_MAX_LEN];
    CheckpointState resume_state;
    if (cfg.resume) find_resume_checkpoint(&cfg, resume_dir, sizeof(resume_dir), &resume_state);

    Trainer tr;
    trainer_init(&tr, &cfg, rank, world);
    const GPT2Config* mc = &tr.model.config;
    RunIO io;
    run_io_open(&io, &cfg, rank, world, mc->vocab_size);

    long long tokens_per_step = (long long)cfg.B * cfg.T * world * tr.grad_accum_steps;
    int max_steps = resolve_max_steps(&cfg, &io.train, tokens_per_step);
    if (cfg.resume && checkpoint_run_is_complete(resume_dir, resume_state.step, max_steps)) {
        run_io_close(&io);
        trainer_free(&tr);
        MPI_Finalize();
        return 0;
    }
    if (rank == 0) {
        print_model_line(mc);
        printf("ranks %d | B %d | T %d | grad accumulation %d | %lld tokens/step | %d steps | -z %d | %d threads\n",
               world, cfg.B, cfg.T, tr.grad_accum_steps, tokens_per_step, max_steps, cfg.zero_stage,
               omp_get_max_threads());
    }
#ifdef USE_ZERO1
    if (tr.zero1) zero1_glue_print_start(tr.zero1, &cfg);
#endif

    uint64_t sample_rng = rng_seed((uint64_t)cfg.seed + 1337);
    int start_step = 0;
    if (cfg.resume) {
        restore_checkpoint(&tr, resume_dir, &resume_state, &io.train, &sample_rng);
        start_step = resume_state.step;
    }
    TrainLoop loop = {&tr, loop_step, loop_evaluate, loop_sample, loop_checkpoint};
    run_training(&loop, &cfg, rank, &io, start_step, max_steps, tokens_per_step, &sample_rng);
    size_t state_bytes = 2 * tr.numel * sizeof(float);  // replicated AdamW: m and v for every element
#ifdef USE_ZERO1
    if (tr.zero1) state_bytes = zero1_state_bytes(tr.zero1->rt);
#endif
    if (rank == 0) printf("optimizer state bytes on rank 0: %zu\n", state_bytes);
    int identical = trainer_replicas_identical(&tr);
    if (rank == 0) printf("parameters identical on all %d ranks: %s\n", world, identical ? "yes" : "NO");
#ifdef USE_ZERO1
    if (tr.zero1) zero1_glue_print_end(tr.zero1);
#endif
    run_io_close(&io);
    trainer_free(&tr);
    MPI_Finalize();
    return identical ? 0 : 1;
}
#endif
