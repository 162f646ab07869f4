/*
 * What the CPU and GPU trainers share around the step itself: the step's result and its
 * update gate (non-finite steps, -sl/-sg), the model's initial weights, the batch checks,
 * batches from the data loader, sampling, the replica check, and the run's inputs and
 * outputs (RunIO). The training loop and the trainers' main are in llmc/train_main.h.
 */
#ifndef LLMC_TRAIN_LOOP_H
#define LLMC_TRAIN_LOOP_H

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <time.h>

#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/dataloader.h"
#include "llmc/dp_invariant.h"
#include "llmc/eval_hellaswag.h"
#include "llmc/gpt2_spec.h"
#include "llmc/logger.h"
#include "llmc/model_file.h"
#include "llmc/mpi_wait.h"
#include "llmc/optimizer.h"
#include "llmc/outliers.h"
#include "llmc/rng.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

// MPI_Init, this process's rank and the world size; the error policy learns the rank.
static inline void mpi_start(int* argc, char*** argv, int* rank, int* world) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    utils_set_rank(*rank, *world);
}

static inline double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// What made a step's loss or grad norm unusable: a non-finite value (NaN or infinity).
enum { STEP_NONFINITE_LOSS = 1, STEP_NONFINITE_NORM = 2 };

typedef struct {
    int step;                  // 0-based index of this optimizer step
    float loss;                // mean over micro-steps and ranks
    float grad_norm;           // global L2 norm before clipping
    float lr;
    double comm_blocked_ms;    // host time spent waiting on communication
    int skipped;               // the update was skipped: a non-finite step, or (-sl/-sg) an outlier
    int nonfinite;             // STEP_NONFINITE_* bits: which of the two was not finite (0: both were)
    double z_loss, z_norm;     // -sl/-sg's z-scores (NaN while the windows fill, and in a non-finite step)
} StepResult;

// Every step's last word before its update (llmc/optimizer.h's UpdateGate), given the
// all-reduced grad norm once the host has it. A step whose loss or norm is not finite is
// never applied and stays out of -sl/-sg's windows (llmc/outliers.h); a finite one joins
// them, and -sl/-sg may skip it as an outlier. Every rank sees the same loss and norm, so
// all decide alike. loss_now, when set, reads the step's loss at the gate (the GPU
// trainer's, which the wait for the norm has brought to the host); else result->loss is it.
typedef struct {
    OutlierState* state;       // NULL: no windows (tests that drive trainer_step)
    float loss_z_max, norm_z_max;
    float (*loss_now)(void* ctx);
    void* loss_ctx;
    StepResult* result;
} StepGate;

static inline int step_gate_skip(void* ctx, float grad_norm) {
    StepGate* g = (StepGate*)ctx;
    StepResult* r = g->result;
    if (g->loss_now) r->loss = g->loss_now(g->loss_ctx);
    r->nonfinite = (isfinite(r->loss) ? 0 : STEP_NONFINITE_LOSS) | (isfinite(grad_norm) ? 0 : STEP_NONFINITE_NORM);
    if (r->nonfinite) {
        r->skipped = 1;
    } else if (g->state) {
        r->skipped = outlier_step(g->state, r->loss, grad_norm, g->loss_z_max, g->norm_z_max, &r->z_loss, &r->z_norm);
    }
    return r->skipped;
}

// The gate a trainer passes to finish_step, every step. Its cost is where the host has the
// norm: the CPU trainer at once; zero1/ after the norm's all-reduce, which it waits for
// anyway; the GPU trainer's one wait per step comes before AdamW instead of after it.
static inline const UpdateGate* step_gate_begin(StepGate* g, UpdateGate* gate, OutlierState* state,
                                                const TrainConfig* cfg, StepResult* r, float (*loss_now)(void*),
                                                void* loss_ctx) {
    *g = (StepGate){state, cfg->skip_loss_z, cfg->skip_norm_z, loss_now, loss_ctx, r};
    r->z_loss = r->z_norm = NAN;
    *gate = (UpdateGate){step_gate_skip, g};
    return gate;
}

// Supplies the inputs and targets (B*T each, host memory) of micro-step `micro`.
typedef void (*BatchFn)(void* ctx, int micro, const int** inputs, const int** targets);

// Descriptors dN are GPT-2s: its vocabulary and context length.
#define DESCRIPTOR_VOCAB 50257
#define DESCRIPTOR_MAX_SEQ_LEN 1024

// 1 when -e is a descriptor dN (mc filled and checked), 0 when it names a file; a "dN"
// whose depth is out of range is an error, not a file name to look for.
static inline int model_descriptor(const char* model, GPT2Config* mc) {
    int r = gpt2_config_from_descriptor(model, DESCRIPTOR_VOCAB, DESCRIPTOR_MAX_SEQ_LEN, mc);
    if (r == -2) {
        fatal("-e %s: a descriptor dN (a random GPT-2 of depth N; d12 is the 124M model) takes N from 1 to %d",
              model, GPT2_MAX_DESCRIPTOR_DEPTH);
    }
    if (r == 0) gpt2_config_check(mc, model);
    return r == 0;
}

// The shape of -e without its weights: a descriptor's, or a model file's header (checked).
static inline void model_shape_of(const char* model, GPT2Config* mc) {
    if (!model_descriptor(model, mc)) {
        gpt2_model_file_shape(model, mc);
    }
}

// The model of -e: an llm.c model file, or a descriptor dN initialised from --seed.
// Every rank does the same. Returns a dense canonical fp32 array; NULL on a resume (-y
// found a checkpoint, and -e is its model.bin: llmc/checkpoint_io.h), which loads each
// rank's pieces instead and needs only the shape here.
static inline float* load_initial_weights(const TrainConfig* cfg, GPT2Config* mc) {
    if (cfg->resume) {
        model_shape_of(cfg->model, mc);
        return NULL;
    }
    if (model_descriptor(cfg->model, mc)) {
        float* dense = (float*)mallocCheck(gpt2_num_parameters(mc) * sizeof(float));
        gpt2_init_random(mc, dense, (uint64_t)cfg->seed);
        return dense;
    }
    int version;
    float* dense = gpt2_model_file_read(cfg->model, mc, &version);
    gpt2_dense_check_finite(mc, dense, cfg->model, "a model with non-finite weights cannot train");
    return dense;
}

// Checks what every trainer needs of -t, -d and -o, and in a build without the zero1/ plugin
// (have_plugin 0) refuses the flags that need it, naming the make line that adds it.
// Returns the micro-steps per step.
static inline int check_run_config(const TrainConfig* cfg, const GPT2Config* mc, int world, int have_plugin,
                                   const char* rebuild) {
    if (cfg->T > mc->max_seq_len) fatal("-t %d exceeds the model's maximum sequence length %d", cfg->T, mc->max_seq_len);
    long long per_micro = (long long)cfg->B * cfg->T * world;
    if (cfg->total_batch_tokens != -1 && (cfg->total_batch_tokens <= 0 || cfg->total_batch_tokens % per_micro != 0)) {
        fatal("-d %d is not a positive multiple of B*T*ranks = %d*%d*%d = %lld", cfg->total_batch_tokens, cfg->B,
              cfg->T, world, per_micro);
    }
    if (!have_plugin) {
        const char* needs = cfg->zero_stage == 1                ? "-z 1 needs"
                            : cfg->grad_dtype != DTYPE_FP32     ? "--grad-dtype bf16 needs"
                            : cfg->trace_file                   ? "--trace needs"
                            : cfg->average_in_collective        ? "--average-in-collective needs"
                            : cfg->dist_opt_instances > 1       ? "--dist-opt-instances needs"
                            : cfg->dp_invariant                 ? "--dp-invariant needs"
                                                                : NULL;
        if (needs) fatal("%s the zero1/ plugin: rebuild with `%s`", needs, rebuild);
    }
    if ((cfg->checkpoint_every > 0 || cfg->resume_asked || cfg->start_over) && cfg->output_dir == NULL) {
        fatal("checkpoints (-n, -nk, -y, --start-over) live in the output directory: give one with -o");
    }
    int micro_steps = train_micro_steps(cfg, world);
    if (cfg->dp_invariant) dp_invariant_check(cfg, world, micro_steps);
    return micro_steps;
}

// d(step loss)/d(position loss): the step loss is the mean over k*DP*B*T positions; with
// --average-in-collective the reduction divides by DP itself.
static inline float step_loss_scale(const TrainConfig* cfg, int micro_steps, int world) {
    return 1.0f / ((float)cfg->B * cfg->T * micro_steps * (cfg->average_in_collective ? 1 : world));
}

static inline void loader_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    DataLoader* d = (DataLoader*)ctx;
    dataloader_next_batch(d);
    *inputs = d->inputs;
    *targets = d->targets;
}

// The same batch every time (-a 1).
static inline void fixed_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    DataLoader* d = (DataLoader*)ctx;
    *inputs = d->inputs;
    *targets = d->targets;
}

// 1 when every rank passed the same value.
static inline int all_ranks_equal(uint64_t mine, int world) {
    uint64_t* all = (uint64_t*)mallocCheck((size_t)world * sizeof(uint64_t));
    mpi_allgather_deadline(&mine, all, 1, MPI_UINT64_T, "replica check", -1);
    int same = 1;
    for (int r = 0; r < world; r++) same &= all[r] == all[0];
    free(all);
    return same;
}

// Samples the next token from the first V logits (softmax computed in place).
static inline int sample_from_logits(float* logits, int V, float coin) {
    float maxv = -INFINITY, sum = 0.0f;
    for (int v = 0; v < V; v++) maxv = fmaxf(maxv, logits[v]);
    for (int v = 0; v < V; v++) sum += (logits[v] = expf(logits[v] - maxv));
    for (int v = 0; v < V; v++) logits[v] /= sum;
    return sample_from_probs(logits, V, coin);
}

// Autoregressive sampling around a trainer's forward: next_logits(ctx, tokens, n) runs the
// model on tokens[0..n) and writes the fp32 logits (Vp of them) of the last position.
// Every rank generates the same text (same seed, same weights); rank 0 prints it.
static inline void print_sample(void* ctx, void (*next_logits)(void* ctx, const int* tokens, int n, float* logits),
                                const GPT2Config* c, int T, int gen_tokens, int rank, const Tokenizer* tok,
                                uint64_t* rng_state) {
    int* tokens = (int*)mallocCheck((size_t)T * sizeof(int));
    float* logits = (float*)mallocCheck((size_t)c->padded_vocab_size * sizeof(float));
    int eot = tok->init_ok ? (int)tok->eot_token : 50256;
    tokens[0] = eot < c->vocab_size ? eot : 0;
    if (rank == 0) printf("generating:\n---\n");
    int len = 1;
    for (int i = 0; i < gen_tokens; i++) {
        next_logits(ctx, tokens, len, logits);
        int next = sample_from_logits(logits, c->vocab_size, rng_f32(rng_state));
        if (len == T) {  // slide the context window
            memmove(tokens, tokens + 1, (size_t)(T - 1) * sizeof(int));
            len--;
        }
        tokens[len++] = next;
        if (rank == 0) {
            if (tok->init_ok) tokenizer_print(tok, (uint32_t)next);
            else printf("%d ", next);
            fflush(stdout);
        }
    }
    if (rank == 0) printf("\n---\n");
    free(tokens);
    free(logits);
}

// The run's inputs and outputs: train and validation data, the HellaSwag-style eval set
// (-H 1), the tokenizer for samples, main.log (appended to on resume).
typedef struct {
    DataLoader train, val;
    int has_val;
    HellaswagSet hellaswag;
    int has_hellaswag;
    Tokenizer tok;
    Logger logger;
    OutlierState outliers;  // -sl/-sg's windows (saved in checkpoints)
    SkipBatches skipped;    // the --skip-batches ranges applied so far (saved in checkpoints)
    int nonfinite_in_a_row; // non-finite steps in a row so far, a resumed run's included (saved in checkpoints)
    DataIdentity train_identity;  // the corpus of -i (saved in checkpoints)
} RunIO;

// The tokenizer for samples: --tokenizer's file, or where the flag was not given the
// corpus's own gpt2_tokenizer.bin beside the first train shard (prepro_corpus writes one
// there), else the default in data/.
static inline const char* run_tokenizer_path(const TrainConfig* cfg, const DataLoader* train, char* buf, size_t n) {
    if (cfg->tokenizer_path != TRAIN_DEFAULT_TOKENIZER) return cfg->tokenizer_path;
    const char* shard = train->files.gl_pathv[0];
    const char* slash = strrchr(shard, '/');
    path_format(buf, n, "%.*s/gpt2_tokenizer.bin", slash ? (int)(slash - shard) : 1, slash ? shard : ".");
    return access(buf, F_OK) == 0 ? buf : cfg->tokenizer_path;
}

static inline void run_io_open(RunIO* io, const TrainConfig* cfg, int rank, int world, int vocab_size,
                               int grad_accum_steps) {
    memset(io, 0, sizeof(*io));
    dataloader_init(&io->train, cfg->train_pattern, cfg->B, cfg->T, rank, world, vocab_size);
    if (cfg->shuffle) dataloader_shuffle(&io->train, (uint64_t)cfg->seed, (size_t)world * cfg->B * grad_accum_steps);
    if (cfg->dp_invariant) dataloader_rank_major(&io->train, grad_accum_steps);
    dataloader_trace(&io->train);
    dataloader_identity(&io->train, &io->train_identity);
    outlier_state_init(&io->outliers, cfg->outlier_window);
    io->has_val = cfg->val_every > 0;
    if (io->has_val) dataloader_init(&io->val, cfg->val_pattern, cfg->B, cfg->T, rank, world, vocab_size);
    io->has_hellaswag = cfg->hellaswag;
    if (io->has_hellaswag) {  // every rank reads and checks it: a bad file stops every rank here
        hellaswag_read(&io->hellaswag, cfg->hellaswag_path, vocab_size);
        hellaswag_check_fits(&io->hellaswag, cfg->T);
        if (rank == 0) printf("hellaswag: %s, %d items\n", cfg->hellaswag_path, io->hellaswag.num_items);
    }
    if (cfg->sample_every > 0) {
        char beside_shards[PATH_MAX_LEN];
        tokenizer_init(&io->tok, run_tokenizer_path(cfg, &io->train, beside_shards, sizeof(beside_shards)));
    }
    logger_init(&io->logger, cfg->output_dir, rank);
    if (rank == 0 && cfg->output_dir && !cfg->resume) checkpoint_claim_output_dir(cfg->output_dir, cfg->resume_asked, cfg->start_over);
    logger_open(&io->logger, cfg->resume);
}

static inline void run_io_close(RunIO* io) {
    logger_close(&io->logger);
    tokenizer_free(&io->tok);
    dataloader_free(&io->train);
    if (io->has_val) dataloader_free(&io->val);
    if (io->has_hellaswag) hellaswag_free(&io->hellaswag);
}

#ifdef __cplusplus
}
#endif
#endif
