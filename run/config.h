/*
 * The trainers' command line, shared by train_gpt2 (CPU) and train_gpt2cu (GPU).
 *
 * One table drives parsing, range checks and the help text, so the help can never
 * disagree with the parser. Short flags are llm.c's (each takes a value: "-b 4");
 * long options cover the rest. An unknown flag, a missing or malformed value, or a
 * value out of range is a fatal error naming the flag.
 */
#ifndef RUN_CONFIG_H
#define RUN_CONFIG_H

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/gpt2_kernels.h"
#include "llmc/gpt2_spec.h"
#include "llmc/muon.h"
#include "run/outliers.h"
#include "run/spikes.h"
#include "run/skip_batches.h"
#include "run/files.h"
#include "zero1/layout.h"  // zero1_parse_bucket_size (header only)

#ifdef __cplusplus
extern "C" {
#endif

enum { DTYPE_FP32 = 0, DTYPE_BF16 = 1 };

typedef struct {
    const char* train_pattern;  // -i
    const char* val_pattern;    // -j
    const char* model;          // -e: model file or descriptor dN
    const char* output_dir;     // -o
    const char* tokenizer_path;
    int B, T;                   // -b -t
    int total_batch_tokens;     // -d (-1: B*T*ranks, no accumulation)
    int max_steps;              // -x (-1: one pass over the first train shard)
    float lr;                   // -l
    int warmup_steps;           // -u
    float final_lr_fraction;    // -q
    float weight_decay;         // -c
    int val_every, val_steps;   // -v -m
    int hellaswag;              // -H: the HellaSwag-style eval at every validation point and at the end
    const char* hellaswag_path; // its file (run/hellaswag_file.h)
    const char* hellaswag_dump; // debug: every item's completion losses, written by rank 0
    int sample_every, gen_tokens;  // -s -g
    int checkpoint_every;       // -n
    int checkpoints_keep;       // -nk (0: keep all)
    int async_save;             // --async-save 1: checkpoints written by a background thread (run/checkpoint_async.h)
    int resume;                 // -y 1, while -o holds a checkpoint to resume from (run/checkpoint_io.h clears it)
    int resume_asked;           // -y 1 as given
    int start_over;             // --start-over: a fresh run removes the checkpoints and main.log of the run in -o
    int allow_resume_change;    // resume even where what a step means differs from the checkpoint's
    int allow_train_val_overlap;  // -i and -j may read the same shard
    int allow_corpus_change;    // resume even on train data other than the checkpoint's
    int zero_stage;             // -z
    int master_weights;         // -w: llm.c's flag, only 1 (fp32 master weights are always kept)
    int overfit_single_batch;   // -a
    int shuffle;                // --shuffle: the train data's order per epoch, from --seed
    const char* skip_batches;   // --skip-batches A-B (run/skip_batches.h); parsed into the two below
    int skip_from, skip_to;     // 1-based steps whose batches are not trained on (0: none)
    float beta1, beta2, eps, grad_clip;
    int seed;
    long long bucket_size;      // -1: default max(40M, 1M*DP); 0: one bucket (also without overlap)
    int pad_busbw;
    int overlap_grad_reduce, overlap_param_gather;
    int check_nan;
    int max_nonfinite_steps;    // skipped non-finite steps in a row that a run survives (0: stop at the first)
    int exit_signal_handler;    // SIGTERM/SIGINT: finish the step, save, exit (run/preempt.h)
    float exit_duration_mins;   // end with a checkpoint after this many minutes (0: never)
    const char* trace_file;     // --trace: FILE.rankN.json per rank (zero1/trace.h)
    int trace_every;            // rewritten every K steps
    const char* trace_steps;    // --trace-steps A-B; parsed into the two below
    int trace_from, trace_to;   // 1-based steps recorded (0: all)
    int param_dtype, grad_dtype;
    int stochastic_rounding;    // bf16 params: AdamW's write-back rounds stochastically (bits from seed, step, element)
    int fp32_accumulation;      // bf16 on the wire, the shard summed in fp32 (all-to-all instead of reduce-scatter)
    int average_in_collective;  // the gradient reductions average; the loss scale drops its 1/world
    float skip_loss_z, skip_norm_z;  // -sl / -sg: skip an update whose z-score exceeds this (0: off)
    int outlier_window;         // steps in -sl/-sg's windows
    float spike_loss_factor, spike_norm_factor;  // a spike: above this times its recent median (0: off; run/spikes.h)
    int spike_window;           // good steps whose median the spike detector compares with
    int max_spike_steps;        // spike steps in one streak of skipped steps that a run survives
    float comm_timeout;         // seconds a rank waits on a collective before aborting the job (0: forever)
    int split_embedding;        // ZeRO-1: reduce wte's classifier part at once, its encoder part as sparse rows
    int dist_opt_instances;     // ZeRO-1 shards within W/K consecutive ranks, all-reduced across the K groups
    int dp_invariant;           // the same bits for any split of a step over ranks and micro-steps (docs/zero1.md)
    const char* comm_backend;   // GPU: auto|nccl|mpi
    const char* attention;      // GPU: --attention flash|naive|cudnn (llmc/gpt2_kernels.h)
    int recompute;              // GPU: -r 1 recomputes GELU in the backward
    int fused_kernels;          // GPU: --fused-kernels 0 runs the unfused reference kernels
    const char* optimizer;      // --optimizer adamw|muon (muon: the hidden matrices, AdamW the rest)
    float muon_momentum;        // the --muon-* flags: llmc/muon.h's MuonConfig (config_muon)
    int muon_nesterov, muon_ns_steps;
    const char* muon_coefficients;
    const char* muon_scale;
    float muon_extra_scale;
    int muon_split_qkv;
    int muon_ns_bf16;           // GPU: Newton-Schulz's GEMMs in bf16 with fp32 accumulation
    int tensorboard;            // --tensorboard 1: rank 0 writes event files (run/tensorboard.h)
    const char* tensorboard_dir;  // where (NULL: -o)
    int straggler_every;        // every N steps the ranks' time spread (run/metrics.h); 0: never
} TrainConfig;

typedef enum { OPT_INT, OPT_FLOAT, OPT_STR, OPT_FLAG, OPT_NOFLAG, OPT_DTYPE, OPT_BUCKET } OptionKind;

typedef struct {
    const char* short_name;  // "-b" or NULL
    const char* long_name;   // "--batch-size"
    OptionKind kind;
    size_t offset;           // into the table's struct (TrainConfig for TRAIN_OPTIONS)
    double min, max;         // inclusive range for numbers
    const char* help;
} OptionSpec;

#define CLI_FIELD(f) offsetof(TrainConfig, f)
// --tokenizer's default. While tokenizer_path is this very pointer the flag was not given,
// and the trainer first looks beside the train shards (run/run.c).
extern const char* const TRAIN_DEFAULT_TOKENIZER;
#define CLI_MIN_COMM_TIMEOUT_S 1.0  // --comm-timeout: 0 (none), or at least this
#define TRACE_EVERY_DEFAULT 10      // --trace-every: steps between rewrites of the trace files

extern const OptionSpec TRAIN_OPTIONS[];
extern const int NUM_TRAIN_OPTIONS;


// An option table and the struct its offsets point into. The trainers parse TRAIN_OPTIONS
// into a TrainConfig; test binaries add tables of their own (dev/test/testing_options.h),
// which only their help lists.
typedef struct {
    const OptionSpec* options;
    int count;
    void* fields;
} OptionTable;

// The current value of an option in fields (its table's struct), as text (the defaults,
// when printing the help).
const char* cli_value_text(const void* fields, const OptionSpec* o, char* buf, size_t n);

// A string option that takes one of a few words, given as "a|b|c".
void cli_choice(const char* flag, const char* value, const char* choices);

// What a trainer binary is: the facts its flags are judged against (config_validate), which
// the ranks also compare (run/ranks_agree.h).
typedef struct {
    const char* name;                // "train_gpt2, CPU fp32, zero1/ in"
    int gpu;                         // train_gpt2cu: its kernel and communication flags apply
    int has_zero1;                   // built with USE_ZERO1=1: -z 1 is then the default
    int param_dtype;                 // DTYPE_*: the CPU trainer's default, the GPU trainer's PRECISION
    int has_cudnn;                   // built with USE_CUDNN=1
    const char* rebuild_with_zero1;  // the make line that adds zero1/, for the hints
} TrainerBuild;

// The defaults of every option for this build.
void config_defaults(TrainConfig* c, const TrainerBuild* build);

// Parses argv into c (which holds the defaults) and into the extra tables' structs (a test
// binary's options; NULL, 0: none): each value alone, against its option's type and
// range. Exits 0 on -h (printing the defaults when -h comes first), fatal on any error.
#define CLI_MAX_EXTRA_TABLES 4
void config_parse(TrainConfig* c, const OptionTable* extra, int n_extra, int argc, char** argv);

// Every rule between flags, and between the flags and this build and rank count, in one
// place: the first one broken ends the run with one error (the ranks are told the same
// flags, so all stop alike). Returns the micro-steps per optimizer step.
int config_validate(const TrainConfig* c, const TrainerBuild* build, int world);

// The flags against the model's shape, once it is known (a resume's: the checkpoint's).
void config_validate_model(const TrainConfig* c, const GPT2Config* mc);

// The GPU model's kernels as the flags chose them (after config_validate).
void config_gpt2_kernels(const TrainConfig* c, GPT2Kernels* k);

// --optimizer muon (after config_validate).
static inline int config_uses_muon(const TrainConfig* c) { return strcmp(c->optimizer, "muon") == 0; }

// The --muon-* flags as llmc/muon.h takes them (after config_validate).
void config_muon(const TrainConfig* c, MuonConfig* m);

// Micro-steps per optimizer step: -d over B*T*ranks, 1 without -d (config_validate checks
// that it divides).
int config_micro_steps(const TrainConfig* c, int world);

#ifdef __cplusplus
}
#endif
#endif
