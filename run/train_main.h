/*
 * The trainers' main and training loop, shared by train_gpt2.c (CPU) and train_gpt2.cu
 * (GPU): parse the command line, agree on the job across ranks, build the trainer, open
 * the data and logs, resume or start, run the steps (validation, samples, the step line,
 * main.log, checkpoints), check the replicas, tear down. A trainer supplies what differs
 * (its device, its step and forwards, its start-up lines) as a TrainerKind.
 */
#ifndef LLMC_TRAIN_MAIN_H
#define LLMC_TRAIN_MAIN_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "run/checkpoint_io.h"
#include "run/config.h"
#include "run/eval_hellaswag.h"
#include "run/mpi_wait.h"
#include "run/optimizer.h"
#include "run/ranks_agree.h"
#include "run/test_hooks.h"
#include "run/test_stop.h"
#include "run/train_loop.h"

#ifdef __cplusplus
extern "C" {
#endif

// What the loop needs of a built trainer.
typedef struct {
    const GPT2Config* config;
    Optimizer* opt;
    int grad_accum_steps;      // micro-steps per optimizer step
    ModelHooks* hooks;         // the model's (run/test_hooks.h may wrap one)
} TrainerParts;

// A trainer, as main and the loop see it. Every function takes the trainer that create
// returned; the optional ones may be NULL.
typedef struct {
    const char* build;          // what this binary is, for ranks_agree (run/ranks_agree.h)
    int default_zero_stage;     // 1 with the zero1/ plugin built in, else 0
    void (*before_mpi)(char** argv);          // optional: runs first (it may restart the program)
    void (*set_defaults)(TrainConfig* cfg);   // optional: defaults of this build, before parsing
    // After ranks_agree: the device, the model and its optimizer; fills parts.
    void* (*create)(const TrainConfig* cfg, int rank, int world, TrainerParts* parts);
    void (*destroy)(void* trainer);
    StepResult (*step)(void* trainer, int step, float lr, BatchFn next_batch, void* batch_ctx, OutlierState* outliers);
    float (*evaluate)(void* trainer, DataLoader* val);         // the mean validation loss over ranks
    void (*next_token_logits)(void* trainer, const int* tokens, int n, float* logits);  // the sampler's forward
    HellaswagForward hellaswag_rows;                            // -H 1's forward
    int (*replicas_identical)(void* trainer);                   // 1 when every rank holds the same params
    void (*describe)(void* trainer, char* buf, size_t n);       // the start line's last fields
    void (*print_start)(void* trainer);                         // optional: rank 0, after the start line
    void (*print_end)(void* trainer);                           // optional: every rank, after the replica check
    void (*write_grad)(void* trainer, int tensor, float value); // one gradient element (run/test_hooks.h)
    void (*write_loss)(void* trainer, float value);             // the last forward's loss (run/test_hooks.h)
} TrainerKind;

typedef struct {
    const TrainerKind* kind;
    void* trainer;
    TrainerParts parts;
    const TrainConfig* cfg;
    int rank, world;
    RunIO io;
    int max_steps;
    long long tokens_per_step;
    uint64_t sample_rng;
} TrainRun;

// -x -1: one pass over the first train shard.
static inline int resolve_max_steps(const TrainConfig* cfg, const DataLoader* train, long long tokens_per_step) {
    if (cfg->max_steps != -1) return cfg->max_steps;
    int steps = (int)((train->shard_tokens - 1) / tokens_per_step);
    return steps < 1 ? 1 : steps;
}

// Validation (and with -H 1 the HellaSwag-style eval) every -v steps and at the end; a sample
// every -s steps and at the end. Rank 0 prints.
static inline void run_evaluations(TrainRun* run, int step, int last) {
    const TrainConfig* cfg = run->cfg;
    RunIO* io = &run->io;
    if (io->has_val && (step % cfg->val_every == 0 || last)) {
        float vl = run->kind->evaluate(run->trainer, &io->val);
        if (run->rank == 0) printf("val loss %.6f\n", vl);
        logger_log_val(&io->logger, step, vl);
    }
    if (io->has_hellaswag && (last || (cfg->val_every > 0 && step % cfg->val_every == 0))) {
        HellaswagScore s = hellaswag_evaluate(&io->hellaswag, run->kind->hellaswag_rows, run->trainer, cfg->B, cfg->T,
                                              run->rank, run->world, cfg->hellaswag_dump);
        float accuracy = (float)s.correct / (float)s.total;
        if (run->rank == 0) printf("step %d: hellaswag accuracy %.4f (%d/%d)\n", step, accuracy, s.correct, s.total);
        logger_log_eval(&io->logger, step, accuracy);
    }
    if (cfg->sample_every > 0 && step > 0 && (step % cfg->sample_every == 0 || last)) {
        print_sample(run->trainer, run->kind->next_token_logits, run->parts.config, cfg->T, cfg->gen_tokens, run->rank,
                     &io->tok, &run->sample_rng);
    }
}

// What a step's STEP_NONFINITE_* bits name, in messages and as main.log's nf: value.
static const char* const NONFINITE_WHAT[4] = {"", "loss", "grad norm", "loss and grad norm"};
static const char* const NONFINITE_LOG_KEY[4] = {"", "loss", "norm", "loss+norm"};

// The step line on rank 0 and main.log, and the epoch line when this step's batch began a
// pass. in_a_row: the non-finite steps up to and including this one.
static inline void report_step(TrainRun* run, const StepResult* r, double ms, size_t* epoch, int in_a_row) {
    int step = r->step;
    Logger* logger = &run->io.logger;
    if (run->rank == 0) {
        char why[64] = "";
        if (r->skipped) snprintf(why, sizeof(why), " | update skipped (%s%s)", r->nonfinite ? "non-finite " : "outlier",
                                 NONFINITE_WHAT[r->nonfinite]);
        printf("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | comm wait %.1f ms%s\n",
               step + 1, run->max_steps, r->loss, r->grad_norm, r->lr, ms, run->tokens_per_step / (ms / 1e3),
               r->comm_blocked_ms, why);
        if (r->nonfinite) {
            printf("step %d: update skipped: non-finite %s (%d in a row; --max-nonfinite-steps %d)\n", step + 1,
                   NONFINITE_WHAT[r->nonfinite], in_a_row, run->cfg->max_nonfinite_steps);
        } else if (r->skipped) {
            printf("step %d: update skipped: loss z-score %.2f, grad norm z-score %.2f\n", step + 1, r->z_loss,
                   r->z_norm);
        }
        fflush(stdout);
    }
    logger_log_train(logger, step + 1, r->loss, r->grad_norm, r->lr, ms);
    if (r->skipped) {
        logger_line(logger, "s:%d skp:1 zl:%.6g zn:%.6g%s%s\n", step + 1, r->z_loss, r->z_norm,
                    r->nonfinite ? " nf:" : "", NONFINITE_LOG_KEY[r->nonfinite]);
    }
    if (run->io.train.epoch != *epoch) {
        *epoch = run->io.train.epoch;
        if (run->rank == 0) printf("epoch %zu of the train data began with step %d\n", *epoch + 1, step + 1);
        logger_log_epoch(logger, step + 1, *epoch);
    }
}

// More non-finite steps in a row than --max-nonfinite-steps: the run has diverged. Every
// rank saw the same loss and norm, so every rank stops here alike. last_checkpoint: the
// newest this run saved or resumed from (0: none).
static inline void stop_if_diverged(const TrainRun* run, const StepResult* r, int in_a_row, int last_checkpoint) {
    if (in_a_row <= run->cfg->max_nonfinite_steps) return;
    char resume[PATH_MAX_LEN + 96] = "no checkpoint to resume from (-n)";
    if (last_checkpoint > 0) {
        snprintf(resume, sizeof(resume), "-y 1 resumes from the newest checkpoint, step %d, in %s", last_checkpoint,
                 run->cfg->output_dir);
    }
    char span[64];
    if (in_a_row == 1) snprintf(span, sizeof(span), "at step %d,", r->step + 1);
    else snprintf(span, sizeof(span), "in %d steps in a row, %d to %d,", in_a_row, r->step + 2 - in_a_row, r->step + 1);
    fatal("non-finite %s (loss %g, grad norm %g) %s more than --max-nonfinite-steps %d: the run has diverged and "
          "stops; those updates were skipped, so the weights are those after step %d; %s%s", NONFINITE_WHAT[r->nonfinite],
          (double)r->loss, (double)r->grad_norm, span, run->cfg->max_nonfinite_steps, r->step + 1 - in_a_row, resume,
          r->nonfinite & STEP_NONFINITE_NORM ? " (--check-nan names the first non-finite gradient)" : "");
}

// --skip-batches A-B, as step A begins: the loader moves past the batches of steps A..B.
static inline void skip_batches_now(TrainRun* run) {
    const TrainConfig* cfg = run->cfg;
    int steps = cfg->skip_to - cfg->skip_from + 1;
    dataloader_skip(&run->io.train, (size_t)steps * (size_t)run->parts.grad_accum_steps);
    skip_batches_add(&run->io.skipped, cfg->skip_from, cfg->skip_to);
    if (run->rank == 0) {
        printf("data: --skip-batches %d-%d: moved past %d optimizer step%s of data (%lld tokens), not trained on; "
               "step %d reads what step %d would have\n", cfg->skip_from, cfg->skip_to, steps, steps == 1 ? "" : "s",
               steps * run->tokens_per_step, cfg->skip_from, cfg->skip_to + 1);
    }
}

// Steps start_step..max_steps-1, with evaluations, the step line and main.log, and
// checkpoints every -n steps and at the end.
static inline void run_training(TrainRun* run, int start_step) {
    const TrainConfig* cfg = run->cfg;
    DataLoader* train = &run->io.train;
    // -a 1: every step trains on the run's first batch, a resumed run's too (its loader
    // was moved to the saved position).
    if (cfg->overfit_single_batch) {
        dataloader_reset(train);
        dataloader_next_batch(train);
    }
    double total_ms = 0.0;
    int timed_steps = 0, last_checkpoint = start_step;
    int* nonfinite_in_a_row = &run->io.nonfinite_in_a_row;  // a resumed run's goes on from its checkpoint's
    size_t epoch = train->epoch;
    for (int step = start_step; step <= run->max_steps; step++) {
        int last = step == run->max_steps;
        run_evaluations(run, step, last);
        if (last) break;
        if (step + 1 == cfg->skip_from) skip_batches_now(run);
        float lr = lr_at_step(cfg->lr, cfg->warmup_steps, cfg->final_lr_fraction, step, run->max_steps);
        BatchFn batch = cfg->overfit_single_batch ? fixed_batch : loader_batch;
        void* batch_ctx = train;
        test_hooks_begin_step(step, &batch, &batch_ctx);
        test_stop_at("step", step + 1, "before step");
        double t0 = wall_ms();
        StepResult r = run->kind->step(run->trainer, step, lr, batch, batch_ctx, &run->io.outliers);
        double ms = wall_ms() - t0;
        if (step > start_step) {  // the first step warms caches, allocations, libraries
            total_ms += ms;
            timed_steps++;
        }
        *nonfinite_in_a_row = r.nonfinite ? *nonfinite_in_a_row + 1 : 0;
        report_step(run, &r, ms, &epoch, *nonfinite_in_a_row);
        stop_if_diverged(run, &r, *nonfinite_in_a_row, last_checkpoint);
        if (cfg->checkpoint_every > 0 && ((step + 1) % cfg->checkpoint_every == 0 || step + 1 == run->max_steps)) {
            checkpoint_save_run(cfg, run->parts.config, run->parts.opt, run->parts.grad_accum_steps, step + 1,
                                run->max_steps, &run->io, run->sample_rng);
            if (run->rank == 0) checkpoint_prune(cfg->output_dir, cfg->checkpoints_keep, step + 1);  // -nk
            last_checkpoint = step + 1;
        }
        logger_check(&run->io.logger);  // a failed write ends the job, once this step's checkpoint was tried
    }
    if (run->rank == 0 && timed_steps > 0) {
        printf("average step %.1f ms, %.0f tok/s\n", total_ms / timed_steps,
               run->tokens_per_step / (total_ms / timed_steps / 1e3));
    }
}

// The start lines on rank 0: the model, the run's shape, and the trainer's own.
static inline void print_start_lines(const TrainRun* run) {
    const TrainConfig* cfg = run->cfg;
    const GPT2Config* mc = run->parts.config;
    char tail[256];
    run->kind->describe(run->trainer, tail, sizeof(tail));
    printf("GPT-2: L=%d NH=%d C=%d maxT=%d V=%d Vp=%d, %zu parameters\n", mc->num_layers, mc->num_heads, mc->channels,
           mc->max_seq_len, mc->vocab_size, mc->padded_vocab_size, gpt2_num_parameters(mc));
    printf("ranks %d | B %d | T %d | grad accumulation %d | %lld tokens/step | %d steps | -z %d | %s\n", run->world,
           cfg->B, cfg->T, run->parts.grad_accum_steps, run->tokens_per_step, run->max_steps, cfg->zero_stage, tail);
    if (run->kind->print_start) run->kind->print_start(run->trainer);
}

// The trainer's main. extra: a test binary's own option tables (NULL, 0 in the product:
// run/config.h). Returns the exit status: 1 when the ranks end with different parameters.
static inline int train_main(int argc, char** argv, const TrainerKind* kind, const OptionTable* extra, int n_extra) {
    if (kind->before_mpi) kind->before_mpi(argv);
    TrainRun run;
    memset(&run, 0, sizeof(run));
    run.kind = kind;
    mpi_start(&argc, &argv, &run.rank, &run.world);
    TrainConfig cfg;  // parsed before the trainer is built: -h and flag errors need no device
    train_config_defaults(&cfg, kind->default_zero_stage);
    if (kind->set_defaults) kind->set_defaults(&cfg);
    train_parse_args_with(&cfg, extra, n_extra, argc, argv);
    run.cfg = &cfg;
    mpi_wait_set_timeout(cfg.comm_timeout);  // every host collective from here on, a resume's load too
    // -y 1: the newest checkpoint's model replaces -e; its pieces are loaded below.
    CheckpointResume resume;
    if (cfg.resume) checkpoint_find_resume(&cfg, &resume);
    ranks_agree(&cfg, kind->build, cfg.resume ? resume.state.step : -1);  // one job on every rank

    run.trainer = kind->create(&cfg, run.rank, run.world, &run.parts);
    test_hooks_install(run.parts.hooks, run.trainer, kind->write_grad, kind->write_loss, &cfg, run.parts.config,
                       run.parts.grad_accum_steps, run.rank, run.world);
    Optimizer* opt = run.parts.opt;
    run_io_open(&run.io, &cfg, run.rank, run.world, run.parts.config->vocab_size, run.parts.grad_accum_steps);
    run.tokens_per_step = (long long)cfg.B * cfg.T * run.world * run.parts.grad_accum_steps;
    run.max_steps = resolve_max_steps(&cfg, &run.io.train, run.tokens_per_step);
    if (cfg.skip_from > run.max_steps) {
        fatal("--skip-batches %d-%d: the run ends at step %d (-x), before step %d", cfg.skip_from, cfg.skip_to,
              run.max_steps, cfg.skip_from);
    }
    int status = 0;
    if (!(cfg.resume && checkpoint_resume_check(&cfg, &resume, &run.io.train_identity, run.tokens_per_step,
                                                run.max_steps))) {
        if (run.rank == 0) print_start_lines(&run);
        opt->ops->print_start(opt);
        int start_step = checkpoint_start_step(&cfg, &resume, run.parts.config, opt, &run.io, &run.sample_rng);
        run_training(&run, start_step);
        size_t state_bytes = opt->ops->state_bytes(opt);
        if (run.rank == 0) printf("optimizer state bytes on rank 0: %zu\n", state_bytes);
        int identical = kind->replicas_identical(run.trainer);
        if (run.rank == 0) printf("parameters identical on all %d ranks: %s\n", run.world, identical ? "yes" : "NO");
        if (kind->print_end) kind->print_end(run.trainer);
        opt->ops->print_end(opt);
        status = identical ? 0 : 1;
    }
    run_io_close(&run.io);
    kind->destroy(run.trainer);
    MPI_Finalize();
    return status;
}

#ifdef __cplusplus
}
#endif
#endif
