/*
 * A training run as both trainers' main drive it (train_gpt2.c, train_gpt2.cu), in order:
 *
 *   run_begin       MPI, the flags (config_validate), the deadline of every collective,
 *                   -y 1's checkpoint, the ranks agreeing on the job
 *   (the trainer builds its model and optimizer, memory checked before it allocates)
 *   run_open        the train and validation data, the evals' inputs, -o and main.log, the
 *                   run's length; 0 when -y 1 finds the run complete already
 *   run_start       the start lines and the optimizer's ledger, -y 1's checkpoint restored:
 *                   the first step
 *   run_evaluate    validation, HellaSwag and samples where due; 0 once the last step is done
 *   run_step_begin  the step's learning rate and batches (--skip-batches, -a 1, a test
 *                   build's planted faults: run/seams.h)
 *   run_step_end    the figures over the ranks (run/metrics.h), the step line, main.log and
 *                   TensorBoard (run/tensorboard.h), divergence (non-finite steps, spikes), the
 *                   checkpoint every -n steps
 *   run_end         the average step, the replica check, the optimizer's report
 *   run_close       the files closed, MPI finalized: the exit status
 *
 * What the two trainers differ in (their devices, steps and forwards) stays in them; what
 * they share is here.
 */
#ifndef RUN_RUN_H
#define RUN_RUN_H

#include <stdint.h>

#include "llmc/gpt2_spec.h"
#include "run/checkpoint_async.h"
#include "run/checkpoint_io.h"
#include "run/config.h"
#include "run/data_identity.h"
#include "run/dataloader.h"
#include "run/eval.h"
#include "run/log.h"
#include "run/metrics.h"
#include "run/optimizer.h"
#include "run/outliers.h"
#include "run/preempt.h"
#include "run/skip_batches.h"
#include "run/spikes.h"
#include "run/step.h"
#include "run/tensorboard.h"
#include "run/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    TrainConfig cfg;
    const TrainerBuild* build;
    int rank, world;
    int micro_steps;              // per optimizer step (config_validate)
    CheckpointResume resume;      // -y 1's checkpoint, while cfg.resume is 1
    CheckpointAsync async_save;   // --async-save 1: the save being written in the background
    // run_open: the inputs and outputs
    const GPT2Config* model;
    Optimizer* opt;
    DataLoader train, val;
    int has_val;
    int val_batches;              // -m, or the val split's batches when it holds fewer (run/eval.h)
    HellaswagSet hellaswag;
    int has_hellaswag;
    Tokenizer tok;
    Logger logger;                // main.log, appended to on resume
    Metrics metrics;              // the step line's figures; the trainer sets its peak before run_start
    TensorBoard tensorboard;      // rank 0's event files (run/tensorboard.h)
    int max_steps;
    long long tokens_per_step;
    // What a checkpoint saves besides the optimizer (run/checkpoint.h's state.txt)
    uint64_t sample_rng;
    OutlierState outliers;        // -sl/-sg's windows
    SkipBatches skipped;          // the --skip-batches ranges applied so far
    int nonfinite_in_a_row;       // non-finite steps in a row so far, a resumed run's included
    float moments_bound;          // AdamW's m^2 / v bound over the run's betas (checkpoint_moments_bound)
    SpikeStreak spikes;           // the open streak of spikes and the checkpoint before it (run/spikes.h)
    DataIdentity train_identity;  // the corpus of -i
    // The steps
    double step_start_ms, total_ms;
    int timed_steps, first_step, last_checkpoint;
    int last_saved;               // the step of the newest save begun (--async-save: before its commit)
    size_t epoch;                 // the train data's, as the last step line reported it
    int status;                   // the exit status: 1 when the replicas differ
    double started_ms;            // run_start's time, for --exit-duration-in-mins
    int preempted;                // run/preempt.h: the signal that stopped the run, PREEMPT_DURATION, or 0
} Run;

// The forwards the evaluations need, all of one trainer (ctx).
typedef struct {
    // The mean loss over the val split's first `batches` global batches, dealt out over the
    // ranks by validation_next_batch (run/eval.h)
    float (*validation_loss)(void* ctx, DataLoader* val, int batches);
    HellaswagForward hellaswag_rows;
    NextTokenLogits next_token_logits;
    void* ctx;
} RunEvals;

// The extra tables: a test binary's options (NULL, 0 in the product).
void run_begin(Run* run, int* argc, char*** argv, const TrainerBuild* build, const OptionTable* extra, int n_extra);

// With the trainer built for model (micro_steps per step, opt its optimizer): the data,
// main.log and -o (rank 0 claims it), the number of steps, -y 1's checks. Returns 0 when the
// checkpoint found is at -x already (nothing to run; it said so), else 1.
int run_open(Run* run, const GPT2Config* model, Optimizer* opt);

// Rank 0's start lines (the model; the run's shape, trainer_fields last; then the trainer's
// own line, trainer_line, when not NULL; what MFU is counted against) and the optimizer's
// ledger; -y 1's checkpoint restored; this segment's TensorBoard file. Returns the first step.
int run_start(Run* run, const char* trainer_fields, const char* trainer_line);

// Before step `step` runs, and once more after the last: validation and the HellaSwag-style
// eval every -v steps and at the end, a sample every -s steps and at the end. Returns 0
// when step is the end (-x), 1 while a step is to run.
int run_evaluate(Run* run, int step, const RunEvals* evals);

// The step's learning rate and the function that supplies its micro-steps' batches.
typedef struct {
    float lr;
    BatchFn next;
    void* ctx;
} RunBatch;
RunBatch run_step_begin(Run* run, int step);

// After the step: the figures over the ranks (collective: run/metrics.h), the step line,
// main.log and TensorBoard, the divergence checks (more non-finite steps in a row than
// --max-nonfinite-steps, or more spikes in one streak than --max-spike-steps, end the run),
// the checkpoint every -n steps and at the end, a failed main.log write ending the job.
void run_step_end(Run* run, const StepResult* r);

// After the last step: the average step time, the optimizer's state size, the replica
// check's verdict (replicas_identical: the trainer's, collective) and the optimizer's report.
void run_end(Run* run, int replicas_identical);

// Closes main.log and the data, releases -o, finalizes MPI. Returns the exit status.
int run_close(Run* run);

#ifdef __cplusplus
}
#endif
#endif
