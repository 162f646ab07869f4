// run/run.c: a training run, as run/run.h describes it.
#include "run/run.h"

#include <mpi.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <string.h>

#include "llmc/rng.h"
#include "llmc/schedule.h"
#include "run/mpi_wait.h"
#include "run/ranks_agree.h"
#include "run/run_dir.h"
#include "run/seams.h"

// ---------------------------------------------------------------------------- begin, open

// A small stack limit (ulimit -s) crashes MPI_Init itself (Open MPI's output buffers, about
// 200 KiB): the soft limit is raised to RUN_STACK_MIN where the hard one allows (the main
// thread's stack grows up to the limit in force when it grows), else one error.
#define RUN_STACK_MIN (8u << 20)
static void run_check_stack(void) {
    struct rlimit lim;
    if (getrlimit(RLIMIT_STACK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= RUN_STACK_MIN) return;
    rlim_t want = lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= RUN_STACK_MIN ? RUN_STACK_MIN : lim.rlim_max;
    struct rlimit raised = {want, lim.rlim_max};
    if (want >= (1u << 20) && setrlimit(RLIMIT_STACK, &raised) == 0) return;
    // not fatal(): its 26 KB of buffers may not fit in what is left of such a stack
    fprintf(stderr, "error: the stack limit (ulimit -s) is %llu KiB and cannot be raised to 1 MiB or more (hard "
            "limit %llu KiB): MPI_Init needs more; raise it (ulimit -s 8192)\n", (unsigned long long)lim.rlim_cur >> 10,
            (unsigned long long)lim.rlim_max >> 10);
    exit(1);
}

void run_begin(Run* run, int* argc, char*** argv, const TrainerBuild* build, const OptionTable* extra, int n_extra) {
    memset(run, 0, sizeof(*run));
    run->build = build;
    files_size_limit_fails_writes();
    run_check_stack();
    mpi_start(argc, argv, &run->rank, &run->world);
    TrainConfig* cfg = &run->cfg;  // parsed before the trainer is built: -h and flag errors need no device
    config_defaults(cfg, build);
    config_parse(cfg, extra, n_extra, *argc, *argv);
    run->micro_steps = config_validate(cfg, build, run->world);
    mpi_wait_set_timeout(cfg->comm_timeout);  // every host collective from here on, a resume's load too
    if (cfg->output_dir) run_dir_check_length(cfg->output_dir);
    // -y 1: the newest checkpoint's model replaces -e; its pieces are loaded by run_start.
    if (cfg->resume) checkpoint_find_resume(cfg, &run->resume);
    ranks_agree(cfg, build->name, cfg->resume ? run->resume.state.step : -1);  // one job on every rank
}

// The tokenizer for samples: --tokenizer's file, or where the flag was not given the
// corpus's own gpt2_tokenizer.bin beside the first train shard (prepro_corpus writes one
// there), else the default in data/. A file named by the flag must be there, and one beside
// the shards that is a dangling link is an error, not a silent fall-back to data/'s.
static const char* run_tokenizer_path(const TrainConfig* cfg, const DataLoader* train, char* buf, size_t n) {
    if (cfg->tokenizer_path != TRAIN_DEFAULT_TOKENIZER) {
        if (access(cfg->tokenizer_path, R_OK) != 0) fatal("--tokenizer '%s': %s", cfg->tokenizer_path, strerror(errno));
        return cfg->tokenizer_path;
    }
    const char* shard = train->files.gl_pathv[0];
    const char* slash = strrchr(shard, '/');
    path_format(buf, n, "%.*s/gpt2_tokenizer.bin", slash ? (int)(slash - shard) : 1, slash ? shard : ".");
    struct stat st;
    if (lstat(buf, &st) == 0 && access(buf, R_OK) != 0) {
        fatal("%s, the corpus's tokenizer beside its shards, cannot be read (%s%s): fix it, or name one with "
              "--tokenizer", buf, S_ISLNK(st.st_mode) ? "a link to a missing file: " : "", strerror(errno));
    }
    return access(buf, F_OK) == 0 ? buf : cfg->tokenizer_path;
}

// The data, the evals' inputs, main.log (rank 0 makes, locks and claims -o first).
static void run_open_io(Run* run) {
    const TrainConfig* cfg = &run->cfg;
    int rank = run->rank, world = run->world, vocab_size = run->model->vocab_size;
    dataloader_init(&run->train, cfg->train_pattern, cfg->B, cfg->T, rank, world, vocab_size);
    if (cfg->shuffle) dataloader_shuffle(&run->train, (uint64_t)cfg->seed, (size_t)world * cfg->B * run->micro_steps);
    if (cfg->dp_invariant) dataloader_rank_major(&run->train, run->micro_steps);
    dataloader_trace(&run->train);
    dataloader_identity(&run->train, &run->train_identity);
    outlier_state_init(&run->outliers, cfg->outlier_window);
    spike_history_init(&run->outliers, cfg->spike_window);
    run->has_val = cfg->val_every > 0;
    if (run->has_val) {  // one order at every rank count: each rank walks a lone rank's (run/eval.h)
        dataloader_init(&run->val, cfg->val_pattern, cfg->B, cfg->T, rank, 1, vocab_size);
        run->val.rank = 0;
        run->val_batches = validation_batches(&run->val, cfg->val_steps, rank);
    }
    dataloader_check_roles(&run->train, run->has_val ? &run->val : NULL, cfg->train_pattern, cfg->val_pattern,
                           cfg->allow_train_val_overlap);
    run->has_hellaswag = cfg->hellaswag;
    if (run->has_hellaswag) {  // every rank reads and checks it: a bad file stops every rank here
        hellaswag_read(&run->hellaswag, cfg->hellaswag_path, vocab_size);
        hellaswag_check_fits(&run->hellaswag, cfg->T);
        if (rank == 0) printf("hellaswag: %s, %d items\n", cfg->hellaswag_path, run->hellaswag.num_items);
    }
    if (cfg->sample_every > 0) {
        char beside_shards[PATH_MAX_LEN];
        tokenizer_init(&run->tok, run_tokenizer_path(cfg, &run->train, beside_shards, sizeof(beside_shards)));
    }
    if (cfg->output_dir && rank == 0) {
        run_dir_open(cfg->output_dir);
        if (!cfg->resume) run_dir_claim(cfg->output_dir, cfg->resume_asked, cfg->start_over);
    }
    logger_open(&run->logger, rank == 0 ? cfg->output_dir : NULL, cfg->resume);
}

// A skip of more steps than one epoch of the train data holds would wrap into the next epoch
// and skip other batches than the ones named (and 1-2147483647 would spin for minutes).
static void run_check_skip_fits(const Run* run) {
    const TrainConfig* cfg = &run->cfg;
    if (!cfg->skip_from) return;
    size_t per_step = (size_t)run->world * (size_t)run->micro_steps;
    size_t epoch_steps = dataloader_batches_per_epoch(&run->train) / per_step;
    size_t steps = (size_t)cfg->skip_to - (size_t)cfg->skip_from + 1;
    if (steps > epoch_steps) {
        fatal("--skip-batches %d-%d moves past %zu steps' batches, more than one epoch of -i holds (%zu steps of %lld "
              "tokens): it would wrap into the next epoch and skip other data; name fewer steps", cfg->skip_from,
              cfg->skip_to, steps, epoch_steps, run->tokens_per_step);
    }
}

int run_open(Run* run, const GPT2Config* model, Optimizer* opt) {
    const TrainConfig* cfg = &run->cfg;
    run->model = model;
    run->opt = opt;
    run_open_io(run);
    run->tokens_per_step = (long long)cfg->B * cfg->T * run->world * run->micro_steps;
    run->max_steps = cfg->max_steps;
    if (run->max_steps == -1) {  // -x -1: one pass over the first train shard
        run->max_steps = (int)((run->train.shard_tokens - 1) / run->tokens_per_step);
        if (run->max_steps < 1) run->max_steps = 1;
    }
    if (cfg->skip_from > run->max_steps) {
        fatal("--skip-batches %d-%d: the run ends at step %d (-x), before step %d", cfg->skip_from, cfg->skip_to,
              run->max_steps, cfg->skip_from);
    }
    run_check_skip_fits(run);
    return !(cfg->resume && checkpoint_resume_check(cfg, &run->resume, &run->train_identity, run->tokens_per_step,
                                                    run->max_steps));
}

// ---------------------------------------------------------------------------- start

int run_start(Run* run, const char* trainer_fields, const char* trainer_line) {
    const TrainConfig* cfg = &run->cfg;
    const GPT2Config* mc = run->model;
    if (run->rank == 0) {
        printf("GPT-2: L=%d NH=%d C=%d maxT=%d V=%d Vp=%d, %zu parameters\n", mc->num_layers, mc->num_heads,
               mc->channels, mc->max_seq_len, mc->vocab_size, mc->padded_vocab_size, gpt2_num_parameters(mc));
        printf("ranks %d | B %d | T %d | grad accumulation %d | %lld tokens/step | %d steps | -z %d | %s\n", run->world,
               cfg->B, cfg->T, run->micro_steps, run->tokens_per_step, run->max_steps, cfg->zero_stage,
               trainer_fields);
        if (trainer_line) printf("%s\n", trainer_line);
        optimizer_print_routing(cfg, mc);
        printf("MFU: %s%s\n", run->metrics.peak_flops > 0 ? "against " : "not reported: ", run->metrics.peak_what);
    }
    run->metrics.flops_per_token = gpt2_flops_per_token(mc, cfg->T);
    run->metrics.straggler_every = cfg->straggler_every;
    run->opt->ops->print_start(run->opt);
    run->sample_rng = rng_seed((uint64_t)cfg->seed + 1337);
    // This job holds -o's lock now: temporaries there are dead, and after a full disk they
    // hold the space that the log's rewrite and the next save need.
    if (cfg->output_dir && run->rank == 0) checkpoint_remove_stale_temporaries(cfg->output_dir);
    int step = 0;
    run->moments_bound = checkpoint_moments_bound(cfg->beta1, cfg->beta2);
    if (cfg->resume) {  // the checkpoint's weights, AdamW state, data position, sampling RNG and windows
        const CheckpointState* saved = &run->resume.state;
        // the saved bound (0 from an earlier version: not checked); new betas add theirs
        float bound = saved->has_moments_bound ? saved->moments_bound : 0.0f;
        checkpoint_restore(&run->resume, mc, run->opt, &run->train, &run->sample_rng, config_uses_muon(cfg), bound);
        int same_betas = saved->beta1 == cfg->beta1 && saved->beta2 == cfg->beta2;
        run->moments_bound = same_betas || bound == 0 || run->moments_bound == 0 ? (same_betas ? bound : 0.0f)
                                                                                 : bound + run->moments_bound;
        if (saved->has_outliers) {  // -sl/-sg go on from the saved windows (at this run's --outlier-window)
            run->outliers.loss = outlier_window_resized(&saved->outliers.loss, cfg->outlier_window);
            run->outliers.norm = outlier_window_resized(&saved->outliers.norm, cfg->outlier_window);
        }
        run->skipped = saved->skipped;
        run->nonfinite_in_a_row = saved->nonfinite_in_a_row;  // 0 from a checkpoint that predates the count
        if (saved->has_spikes) {  // the spike detector goes on from the saved history and streak
            run->outliers.good_loss = outlier_window_resized(&saved->outliers.good_loss, cfg->spike_window);
            run->outliers.good_norm = outlier_window_resized(&saved->outliers.good_norm, cfg->spike_window);
            run->spikes = saved->spikes;
        }
        logger_resume_at(&run->logger, saved->step);
        step = saved->step;
    }
    // -a 1: every step trains on the run's first batch, a resumed run's too (its loader
    // was moved to the saved position).
    if (cfg->overfit_single_batch) {
        dataloader_reset(&run->train);
        dataloader_next_batch(&run->train);
    }
    const char* tb_dir = cfg->tensorboard_dir ? cfg->tensorboard_dir : cfg->output_dir;
    if (cfg->tensorboard && run->rank == 0 && tb_dir) run_dir_require();
    tensorboard_open(&run->tensorboard, cfg->tensorboard && run->rank == 0 ? tb_dir : NULL, step);
    run->first_step = run->last_checkpoint = run->last_saved = step;
    run->epoch = run->train.epoch;
    run->started_ms = wall_ms();
    if (cfg->exit_signal_handler) preempt_install();
    return step;
}

// ---------------------------------------------------------------------------- the steps

int run_evaluate(Run* run, int step, const RunEvals* evals) {
    const TrainConfig* cfg = &run->cfg;
    if (run->preempted) return 0;  // stopped with its checkpoint: no evals in the grace it has
    int last = step == run->max_steps;
    if (run->has_val && (step % cfg->val_every == 0 || last)) {
        float vl = evals->validation_loss(evals->ctx, &run->val, run->val_batches);
        if (run->rank == 0) printf("val loss %.6f\n", vl);
        logger_log_val(&run->logger, step, vl);
        tensorboard_write(&run->tensorboard, step, &(TbScalar){"val/loss", vl}, 1);
    }
    if (run->has_hellaswag && (last || (cfg->val_every > 0 && step % cfg->val_every == 0))) {
        HellaswagScore s = hellaswag_evaluate(&run->hellaswag, evals->hellaswag_rows, evals->ctx, cfg->B, cfg->T,
                                              run->rank, run->world, cfg->hellaswag_dump);
        float accuracy = (float)s.correct / (float)s.total;
        if (run->rank == 0) printf("step %d: hellaswag accuracy %.4f (%d/%d)\n", step, accuracy, s.correct, s.total);
        logger_log_eval(&run->logger, step, accuracy);
        tensorboard_write(&run->tensorboard, step, &(TbScalar){"eval/hellaswag", accuracy}, 1);
    }
    if (cfg->sample_every > 0 && step > 0 && (step % cfg->sample_every == 0 || last)) {
        print_sample(evals->ctx, evals->next_token_logits, run->model, cfg->T, cfg->gen_tokens, run->rank, &run->tok,
                     &run->sample_rng);
    }
    return !last;
}

// --skip-batches A-B, as step A begins: the loader moves past the batches of steps A..B.
static void run_skip_batches(Run* run) {
    const TrainConfig* cfg = &run->cfg;
    int steps = cfg->skip_to - cfg->skip_from + 1;
    dataloader_skip(&run->train, (size_t)steps * (size_t)run->micro_steps);
    skip_batches_add(&run->skipped, cfg->skip_from, cfg->skip_to);
    if (run->rank == 0) {
        printf("data: --skip-batches %d-%d: moved past %d optimizer step%s of data (%lld tokens), not trained on; "
               "step %d reads what step %d would have\n", cfg->skip_from, cfg->skip_to, steps, steps == 1 ? "" : "s",
               steps * run->tokens_per_step, cfg->skip_from, cfg->skip_to + 1);
    }
}

RunBatch run_step_begin(Run* run, int step) {
    const TrainConfig* cfg = &run->cfg;
    if (step + 1 == cfg->skip_from) run_skip_batches(run);
    RunBatch b = {lr_at_step(cfg->lr, cfg->warmup_steps, cfg->final_lr_fraction, step, run->max_steps),
                  cfg->overfit_single_batch ? fixed_batch : loader_batch, &run->train};
    seam_begin_step(step, &b.next, &b.ctx);
    seam_stop_at("step", step + 1, "before step");
    run->step_start_ms = wall_ms();
    seam_slow_step(run->rank);
    return b;
}

// What a step's STEP_NONFINITE_* (or SPIKE_*) bits name, in messages and as main.log's nf: (spk:) value.
static const char* const NONFINITE_WHAT[4] = {"", "loss", "grad norm", "loss and grad norm"};
static const char* const NONFINITE_LOG_KEY[4] = {"", "loss", "norm", "loss+norm"};

// A spike's step line and main.log fields (run/spikes.h).
static void run_report_spike(Run* run, const StepResult* r) {
    const TrainConfig* cfg = &run->cfg;
    if (run->rank == 0) {
        printf("step %d: update skipped: %s spike: loss %.6g = %.3gx, grad norm %.6g = %.3gx the medians of the last "
               "%d good steps (--spike-loss-factor %g, --spike-norm-factor %g); %d of the %d steps of this streak "
               "spiked (--max-spike-steps %d)\n", r->step + 1, NONFINITE_WHAT[r->spike], r->loss, r->loss_ratio,
               r->grad_norm, r->norm_ratio, run->outliers.good_loss.count, cfg->spike_loss_factor,
               cfg->spike_norm_factor, run->spikes.spikes, run->spikes.steps, cfg->max_spike_steps);
        fflush(stdout);
    }
    logger_line(&run->logger, "s:%d skp:1 zl:nan zn:nan spk:%s rl:%.6g rn:%.6g\n", r->step + 1,
                NONFINITE_LOG_KEY[r->spike], r->loss_ratio, r->norm_ratio);
}

// The step line on rank 0 and main.log, and the epoch line when this step's batch began a pass.
static void run_report_step(Run* run, const StepResult* r, double ms, const StepMetrics* m) {
    int step = r->step;
    char line_more[160], log_more[160];
    metrics_format_line(m, line_more, sizeof(line_more));
    metrics_format_log(m, log_more, sizeof(log_more));
    if (run->rank == 0) {
        char why[64] = "";
        if (r->spike) snprintf(why, sizeof(why), " | update skipped (%s spike)", NONFINITE_WHAT[r->spike]);
        else if (r->skipped) snprintf(why, sizeof(why), " | update skipped (%s%s)", r->nonfinite ? "non-finite " : "outlier",
                                      NONFINITE_WHAT[r->nonfinite]);
        printf("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | comm wait %.1f ms%s%s\n",
               step + 1, run->max_steps, r->loss, r->grad_norm, r->lr, ms, m->tokens_per_s, r->comm_blocked_ms,
               line_more, why);
        if (r->nonfinite) {
            printf("step %d: update skipped: non-finite %s (%d in a row; --max-nonfinite-steps %d)\n", step + 1,
                   NONFINITE_WHAT[r->nonfinite], run->nonfinite_in_a_row, run->cfg.max_nonfinite_steps);
        } else if (r->skipped && !r->spike) {
            printf("step %d: update skipped: loss z-score %.2f, grad norm z-score %.2f\n", step + 1, r->z_loss,
                   r->z_norm);
        }
        fflush(stdout);
    }
    logger_log_train(&run->logger, step + 1, r->loss, r->grad_norm, r->lr, ms, log_more);
    if (m->has_spread) {
        char spread[256];
        metrics_format_spread(m, step + 1, spread, sizeof(spread));
        logger_line(&run->logger, "%s", spread);
    }
    TbScalar scalars[METRICS_MAX_SCALARS];
    int n = metrics_scalars(m, r->loss, r->grad_norm, r->lr, ms, r->skipped, scalars);
    tensorboard_write(&run->tensorboard, step + 1, scalars, n);
    if (r->spike) {
        run_report_spike(run, r);
    } else if (r->skipped) {
        logger_line(&run->logger, "s:%d skp:1 zl:%.6g zn:%.6g%s%s\n", step + 1, r->z_loss, r->z_norm,
                    r->nonfinite ? " nf:" : "", NONFINITE_LOG_KEY[r->nonfinite]);
    }
    if (run->train.epoch != run->epoch) {
        run->epoch = run->train.epoch;
        if (run->rank == 0) printf("epoch %zu of the train data began with step %d\n", run->epoch + 1, step + 1);
        logger_log_epoch(&run->logger, step + 1, run->epoch);
    }
}

// More non-finite steps in a row than --max-nonfinite-steps: the run has diverged. Every
// rank saw the same loss and norm, so every rank stops here alike.
static void run_stop_if_diverged(const Run* run, const StepResult* r) {
    int in_a_row = run->nonfinite_in_a_row;
    if (in_a_row <= run->cfg.max_nonfinite_steps) return;
    char resume[PATH_MAX_LEN + 96] = "no checkpoint to resume from (-n)";
    if (run->last_checkpoint > 0) {
        snprintf(resume, sizeof(resume), "-y 1 resumes from the newest checkpoint, step %d, in %s",
                 run->last_checkpoint, run->cfg.output_dir);
    }
    char span[64];
    if (in_a_row == 1) snprintf(span, sizeof(span), "at step %d,", r->step + 1);
    else snprintf(span, sizeof(span), "in %d steps in a row, %d to %d,", in_a_row, r->step + 2 - in_a_row, r->step + 1);
    fatal("non-finite %s (loss %g, grad norm %g) %s more than --max-nonfinite-steps %d: the run has diverged and "
          "stops; those updates were skipped, so the weights are those after step %d; %s%s", NONFINITE_WHAT[r->nonfinite],
          (double)r->loss, (double)r->grad_norm, span, run->cfg.max_nonfinite_steps, r->step + 1 - in_a_row, resume,
          r->nonfinite & STEP_NONFINITE_NORM ? " (--check-nan names the first non-finite gradient)" : "");
}

// A checkpoint is in place: -nk may prune the older ones now, and it is the one to resume from.
static void run_checkpoint_committed(Run* run, int steps_done) {
    const TrainConfig* cfg = &run->cfg;
    if (run->rank == 0 && cfg->checkpoints_keep > 0) {  // -nk
        run_dir_require();
        checkpoint_prune(cfg->output_dir, cfg->checkpoints_keep, steps_done, run->spikes.vouched);
    }
    run->last_checkpoint = steps_done;
}

// --async-save: the save in flight is committed at the first step end where every rank's
// writer is done (wait 1: now), run/checkpoint_async.h.
static void run_async_save_progress(Run* run, int steps_done, int wait) {
    int committed = checkpoint_async_progress(&run->async_save, steps_done, wait);
    if (committed > 0) run_checkpoint_committed(run, committed);
}

// The checkpoint of steps_done (collective): the optimizer's state, and in state.txt the
// run's shape, data position, sampling RNG, windows, skipped ranges and corpus.
static void run_save_checkpoint(Run* run, int steps_done) {
    run->last_saved = steps_done;
    const TrainConfig* cfg = &run->cfg;
    CheckpointState s;
    memset(&s, 0, sizeof(s));
    s.step = steps_done;
    s.sample_rng = run->sample_rng;
    s.world = run->opt->world;
    s.B = cfg->B;
    s.T = cfg->T;
    s.grad_accum_steps = run->micro_steps;
    checkpoint_step_meaning(cfg, run->max_steps, &s);
    DataPosition at = dataloader_position(&run->train);
    s.epoch = at.epoch;
    s.shard = at.shard;
    s.shard_tokens_done = at.tokens_done;
    s.outliers = run->outliers;
    s.has_outliers = 1;
    s.skipped = run->skipped;
    s.nonfinite_in_a_row = run->nonfinite_in_a_row;
    s.has_nonfinite_count = 1;
    s.moments_bound = run->moments_bound;
    s.has_moments_bound = 1;
    s.spikes = run->spikes;
    s.has_spikes = 1;
    snprintf(s.corpus, sizeof(s.corpus), "%s", run->train_identity.corpus);
    s.corpus_shards = run->train_identity.shards;
    s.corpus_digest = run->train_identity.digest;
    s.has_corpus = 1;
    if (cfg->async_save) {  // the last step's save is waited for: the run ends with it in place
        run_async_save_progress(run, steps_done, 1);
        checkpoint_async_begin(&run->async_save, cfg->output_dir, run->model, run->opt, &s, cfg->comm_timeout);
        if (steps_done == run->max_steps) run_async_save_progress(run, steps_done, 1);
        return;
    }
    checkpoint_save(cfg->output_dir, run->model, run->opt, &s);
    run_checkpoint_committed(run, steps_done);
}

// A signal or --exit-duration-in-mins (run/preempt.h): this step's checkpoint in -o unless it
// has one, written before the run goes, then one line; run_evaluate ends the steps.
static void run_stop_preempted(Run* run, int steps_done, int why, int saved_now) {
    const TrainConfig* cfg = &run->cfg;
    if (cfg->output_dir && !saved_now) run_save_checkpoint(run, steps_done);
    if (cfg->async_save) run_async_save_progress(run, steps_done, 1);
    run->preempted = why;
    if (run->rank != 0) return;
    char cause[64], saved[PATH_MAX_LEN + 64] = "no -o, so nothing was saved";
    if (why == PREEMPT_DURATION) snprintf(cause, sizeof(cause), "--exit-duration-in-mins %g", cfg->exit_duration_mins);
    else snprintf(cause, sizeof(cause), "%s", why == SIGINT ? "SIGINT" : why == SIGTERM ? "SIGTERM" : "a signal");
    if (cfg->output_dir) {
        snprintf(saved, sizeof(saved), "checkpoint of step %d in %s/checkpoint_%08d: -y 1 resumes from it",
                 steps_done, cfg->output_dir, steps_done);
    }
    // main.log too: under mpirun, which stops passing on the ranks' output once it is signalled
    logger_line(&run->logger, "s:%d stop:%s\n", steps_done, why == PREEMPT_DURATION ? "duration" : cause);
    fprintf(stderr, "stopped by %s after step %d; %s\n", cause, steps_done, saved);
    fflush(stderr);
}

void run_step_end(Run* run, const StepResult* r) {
    const TrainConfig* cfg = &run->cfg;
    int step = r->step;
    double ms = wall_ms() - run->step_start_ms;
    if (step > run->first_step) {  // the first step warms caches, allocations, libraries
        run->total_ms += ms;
        run->timed_steps++;
    }
    run->nonfinite_in_a_row = r->nonfinite ? run->nonfinite_in_a_row + 1 : 0;
    StepMetrics m;
    metrics_step(&run->metrics, &m, step + 1, ms, r->comm_blocked_ms, run->tokens_per_step, run->rank, run->world,
                 preempt_request(wall_ms() - run->started_ms, cfg->exit_duration_mins));
    // the newest save begun, so that state.txt is the same with --async-save as without
    spike_streak_step(&run->spikes, step + 1, r->nonfinite || r->spike, r->spike, run->last_saved);
    run_report_step(run, r, ms, &m);
    run_stop_if_diverged(run, r);
    spike_stop_if_diverged(&run->spikes, cfg->max_spike_steps, step + 1, r->loss, r->grad_norm, r->loss_ratio,
                           r->norm_ratio, cfg->output_dir);
    int save_now = cfg->checkpoint_every > 0 && ((step + 1) % cfg->checkpoint_every == 0 || step + 1 == run->max_steps);
    if (save_now) {
        run_save_checkpoint(run, step + 1);
    } else if (cfg->async_save) {
        run_async_save_progress(run, step + 1, 0);
    }
    logger_check(&run->logger);  // a failed write ends the job, once this step's checkpoint was tried
    tensorboard_check(&run->tensorboard);
    if (m.stop) run_stop_preempted(run, step + 1, m.stop, save_now);
}

// ---------------------------------------------------------------------------- the end

void run_end(Run* run, int replicas_identical) {
    if (run->rank == 0 && run->timed_steps > 0) {
        double ms = run->total_ms / run->timed_steps;
        printf("average step %.1f ms, %.0f tok/s\n", ms, run->tokens_per_step / (ms / 1e3));
    }
    size_t state_bytes = run->opt->ops->state_bytes(run->opt);
    if (run->rank == 0) printf("optimizer state bytes on rank 0: %zu\n", state_bytes);
    if (run->rank == 0) {
        printf("parameters identical on all %d ranks: %s\n", run->world, replicas_identical ? "yes" : "NO");
    }
    run->opt->ops->print_end(run->opt);
    run->status = replicas_identical ? 0 : 1;
}

int run_close(Run* run) {
    checkpoint_async_free(&run->async_save);
    logger_close(&run->logger);
    tensorboard_close(&run->tensorboard);
    run_dir_close();
    tokenizer_free(&run->tok);
    dataloader_free(&run->train);
    if (run->has_val) dataloader_free(&run->val);
    if (run->has_hellaswag) hellaswag_free(&run->hellaswag);
    mpiDeadline("MPI_Finalize", MPI_Finalize());
    return run->preempted > PREEMPT_DURATION ? 128 + run->preempted : run->status;  // a signal's exit
}
