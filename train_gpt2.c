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
#include "llmc/utils.h"
#ifdef USE_ZERO1
#include "zero1/trainer_glue.h"
#endif

#ifdef USE_ZERO1
#define DEFAULT_ZERO_STAGE 1
#else
#define DEFAULT_ZERO_STAGE 0
#endif

#define mpiCheck(call)                                                                       \
    do {                                                                                     \
        int mpi_status_ = (call);                                                            \
        if (mpi_status_ != MPI_SUCCESS) fatal("MPI error %d at %s:%d", mpi_status_, __FILE__, __LINE__); \
    } while (0)

static double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// ----------------------------------------------------------------------------
// The trainer: a model bound to a param and a grad buffer, and an optimizer.

typedef struct {
    int step;                  // 0-based index of this optimizer step
    float loss;                // mean over micro-steps and ranks
    float grad_norm;           // global L2 norm before clipping
    float lr;
    double comm_blocked_ms;    // time spent waiting on communication
} StepResult;

// Supplies the inputs and targets (B*T each) of micro-step `micro` of the current step.
typedef void (*BatchFn)(void* ctx, int micro, const int** inputs, const int** targets);

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

// Builds the model from a file or a descriptor; every rank does the same.
static float* load_initial_weights(const TrainConfig* cfg, GPT2Config* mc) {
    if (gpt2_config_from_descriptor(cfg->model, 50257, 1024, mc) == 0) {
        gpt2_config_check(mc, cfg->model);
        float* dense = (float*)mallocCheck(gpt2_num_parameters(mc) * sizeof(float));
        gpt2_init_random(mc, dense, (uint64_t)cfg->seed);
        return dense;
    }
    int version;
    return gpt2_model_file_read(cfg->model, mc, &version);
}

static void check_config(const TrainConfig* cfg, const GPT2Config* mc, int world) {
    if (cfg->T > mc->max_seq_len) fatal("-t %d exceeds the model's maximum sequence length %d", cfg->T, mc->max_seq_len);
    long long per_micro = (long long)cfg->B * cfg->T * world;
    if (cfg->total_batch_tokens != -1 && (cfg->total_batch_tokens <= 0 || cfg->total_batch_tokens % per_micro != 0)) {
        fatal("-d %d is not a positive multiple of B*T*ranks = %d*%d*%d = %lld", cfg->total_batch_tokens, cfg->B,
              cfg->T, world, per_micro);
    }
    if (cfg->master_weights != 1) fatal("-w 0 is not supported: the trainers always keep fp32 master weights");
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
    check_config(cfg, &mc, world);
    long long per_micro = (long long)cfg->B * cfg->T * world;
    tr->grad_accum_steps = cfg->total_batch_tokens == -1 ? 1 : (int)(cfg->total_batch_tokens / per_micro);
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

// FNV-1a over every parameter's bytes: a cheap fingerprint to compare replicas.
static uint64_t params_fingerprint(const GPT2* m) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < m->num_tensors; i++) {
        const unsigned char* p = (const unsigned char*)m->param[i];
        size_t n = gpt2_tensor_numel(&m->config, i) * sizeof(float);
        for (size_t j = 0; j < n; j++) h = (h ^ p[j]) * 1099511628211ull;
    }
    return h;
}

// After training, every rank must hold the same parameters; a mismatch is a bug.
static int trainer_replicas_identical(Trainer* tr) {
    trainer_sync_params(tr);
    uint64_t mine = params_fingerprint(&tr->model);
    uint64_t* all = (uint64_t*)mallocCheck((size_t)tr->world * sizeof(uint64_t));
    mpiCheck(MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD));
    int same = 1;
    for (int r = 0; r < tr->world; r++) same &= all[r] == all[0];
    free(all);
    return same;
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

// ----------------------------------------------------------------------------
// Batches from the data loader

static void loader_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    DataLoader* d = (DataLoader*)ctx;
    dataloader_next_batch(d);
    *inputs = d->inputs;
    *targets = d->targets;
}

// The same batch every time (-a 1).
static void fixed_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    DataLoader* d = (DataLoader*)ctx;
    *inputs = d->inputs;
    *targets = d->targets;
}

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

// Every rank generates the same text (same seed, same weights); rank 0 prints it.
static void print_sample(Trainer* tr, Tokenizer* tok, uint64_t* rng_state) {
    const GPT2Config* c = &tr->model.config;
    int T = tr->cfg.T, n = tr->cfg.gen_tokens;
    int* tokens = (int*)mallocCheck((size_t)T * sizeof(int));
    int eot = tok->init_ok ? (int)tok->eot_token : 50256;
    if (eot >= c->vocab_size) eot = 0;
    tokens[0] = eot;
    if (tr->rank == 0) printf("generating:\n---\n");
    int len = 1;
    for (int i = 0; i < n; i++) {
        int window = len < T ? len : T;
        const int* ctx = tokens + (len - window);
        gpt2_forward(&tr->model, ctx, NULL, 1, window);
        const float* logits = tr->model.acts.logits + (size_t)(window - 1) * c->padded_vocab_size;
        float* probs = tr->model.acts.probs;  // scratch
        float maxv = -INFINITY, sum = 0.0f;
        for (int v = 0; v < c->vocab_size; v++) maxv = fmaxf(maxv, logits[v]);
        for (int v = 0; v < c->vocab_size; v++) sum += (probs[v] = expf(logits[v] - maxv));
        for (int v = 0; v < c->vocab_size; v++) probs[v] /= sum;
        int next = sample_from_probs(probs, c->vocab_size, rng_f32(rng_state));
        if (len == T) {  // slide the context window
            memmove(tokens, tokens + 1, (size_t)(T - 1) * sizeof(int));
            len--;
        }
        tokens[len++] = next;
        if (tr->rank == 0) {
            if (tok->init_ok) tokenizer_print(tok, (uint32_t)next);
            else printf("%d ", next);
            fflush(stdout);
        }
    }
    if (tr->rank == 0) printf("\n---\n");
    free(tokens);
}

#ifndef TESTING
int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    utils_set_rank(rank, world);

    TrainConfig cfg;
    train_config_defaults(&cfg, DEFAULT_ZERO_STAGE);
    train_parse_args(&cfg, argc, argv);

    // -y 1: the newest checkpoint's master weights replace -e; the rest is restored below.
    CheckpointState resume_state;
    char resume_dir[PATH_MAX_LEN];
    char resume_model[PATH_MAX_LEN];
    if (cfg.resume) {
        if (cfg.output_dir == NULL) fatal("-y 1 resumes from the output directory: give it with -o");
        if (checkpoint_find_latest(cfg.output_dir, resume_dir, sizeof(resume_dir)) < 0) {
            fatal("-y 1: no checkpoint in %s", cfg.output_dir);
        }
        char state_path[PATH_MAX_LEN];
        path_format(state_path, sizeof(state_path), "%s/state.txt", resume_dir);
        checkpoint_read_state(state_path, &resume_state);
        path_format(resume_model, sizeof(resume_model), "%s/model.bin", resume_dir);
        cfg.model = resume_model;
    }

    Trainer tr;
    trainer_init(&tr, &cfg, rank, world);
    const GPT2Config* mc = &tr.model.config;
    DataLoader train, val;
    dataloader_init(&train, cfg.train_pattern, cfg.B, cfg.T, rank, world, mc->vocab_size);
    int do_val = cfg.val_every > 0;
    if (do_val) dataloader_init(&val, cfg.val_pattern, cfg.B, cfg.T, rank, world, mc->vocab_size);
    Tokenizer tok;
    memset(&tok, 0, sizeof(tok));
    if (cfg.sample_every > 0) tokenizer_init(&tok, cfg.tokenizer_path);
    Logger logger;
    logger_init(&logger, cfg.output_dir, rank, cfg.resume);

    long long tokens_per_step = (long long)cfg.B * cfg.T * world * tr.grad_accum_steps;
    int max_steps = cfg.max_steps;
    if (max_steps == -1) {
        max_steps = (int)((train.shard_tokens - 1) / tokens_per_step);
        if (max_steps < 1) max_steps = 1;
    }
    if (rank == 0) {
        printf("GPT-2: L=%d NH=%d C=%d maxT=%d V=%d Vp=%d, %zu parameters\n", mc->num_layers, mc->num_heads,
               mc->channels, mc->max_seq_len, mc->vocab_size, mc->padded_vocab_size, gpt2_num_parameters(mc));
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
        size_t n = gpt2_num_parameters(mc);
        float* m = (float*)mallocCheck(n * sizeof(float));
        float* v = (float*)mallocCheck(n * sizeof(float));
        char path[PATH_MAX_LEN];
        path_format(path, sizeof(path), "%s/optimizer.bin", resume_dir);
        checkpoint_read_optimizer(path, mc, m, v, resume_state.step);
        trainer_import_state(&tr, m, v);
        free(m);
        free(v);
        dataloader_seek(&train, resume_state.shard, resume_state.shard_tokens_done);
        sample_rng = resume_state.sample_rng;
        start_step = resume_state.step;
        if (rank == 0) {
            printf("resumed from %s: step %d (saved by %d ranks x B=%d x T=%d x %d micro-steps)\n", resume_dir,
                   start_step, resume_state.world, resume_state.B, resume_state.T, resume_state.grad_accum_steps);
        }
        if (start_step >= max_steps) fatal("-y 1: the checkpoint is at step %d, and -x is %d", start_step, max_steps);
    }
    if (cfg.overfit_single_batch) dataloader_next_batch(&train);
    double total_ms = 0.0;
    int timed_steps = 0;
    for (int step = start_step; step <= max_steps; step++) {
        int last = step == max_steps;
        if (do_val && (step % cfg.val_every == 0 || last)) {
            float vl = evaluate(&tr, &val);
            if (rank == 0) printf("val loss %.6f\n", vl);
            logger_log_val(&logger, step, vl);
        }
        if (cfg.sample_every > 0 && step > 0 && (step % cfg.sample_every == 0 || last)) print_sample(&tr, &tok, &sample_rng);
        if (last) break;
        float lr = lr_at_step(cfg.lr, cfg.warmup_steps, cfg.final_lr_fraction, step, max_steps);
        double t0 = wall_ms();
        StepResult r = trainer_step(&tr, step, lr, cfg.overfit_single_batch ? fixed_batch : loader_batch, &train);
        double ms = wall_ms() - t0;
        if (step > start_step) {  // the first step warms caches and allocations
            total_ms += ms;
            timed_steps++;
        }
        if (rank == 0) {
            printf("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | comm wait %.1f ms\n",
                   step + 1, max_steps, r.loss, r.grad_norm, lr, ms, tokens_per_step / (ms / 1e3), r.comm_blocked_ms);
            fflush(stdout);
        }
        logger_log_train(&logger, step + 1, r.loss, r.grad_norm, lr, ms);
        if (cfg.checkpoint_every > 0 && ((step + 1) % cfg.checkpoint_every == 0 || step + 1 == max_steps)) {
            save_checkpoint(&tr, step + 1, &train, sample_rng);
        }
    }
    if (rank == 0 && timed_steps > 0) {
        printf("average step %.1f ms, %.0f tok/s\n", total_ms / timed_steps, tokens_per_step / (total_ms / timed_steps / 1e3));
    }
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
    logger_close(&logger);
    tokenizer_free(&tok);
    dataloader_free(&train);
    if (do_val) dataloader_free(&val);
    trainer_free(&tr);
    MPI_Finalize();
    return identical ? 0 : 1;
}
#endif
