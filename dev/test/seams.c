/*
 * dev/test/seams.c: what a test build does at the seams of run/seams.h. Linked into a program
 * only by test builds (make test builds everything with TEST_SEAMS=1); it fills run_seams
 * before main runs. Each seam reads its environment variable once (docs/testing.md lists them).
 *
 * Stop points (LLMC_TEST_STOP), so that no test races a signal, a removal or a second job
 * against a running program. LLMC_TEST_STOP=POINT:RANK:N (several, comma separated; RANK *
 * for every rank) makes that rank stop itself (SIGSTOP), once, when it reaches the named point
 * at step N (prepro_corpus's points: its run, 1). It first prints one line,
 *   test: rank R stops itself <where> N (LLMC_TEST_STOP, pid P)
 * and the test, once it sees the process stopped, acts (removes -o, starts a second job,
 * stops the other ranks) and continues it (SIGCONT) at a known place. Points:
 *   save:R:S          in the checkpoint save of step S, before the first collective write of
 *                     model.bin (a rank whose host hangs there)
 *   load:R:S          in the resume from step S, before MPI_File_open of model.bin
 *   save_open:R:S     in the save of step S, its temporary directory made, before MPI_File_open
 *   save_commit:R:S   in the save of step S, the files written, before rank 0's manifest and rename
 *   save_write:R:S    --async-save: the background writer of step S's save, before its first
 *                     write; only that thread stops (it sleeps for good), the rank trains on:
 *                     a rank whose disk hangs (test_async_save.sh)
 *   step:R:S          before step S (1-based, as the step lines count) runs
 *   teardown:R:1      in the first ncclCommDestroy (run/nccl_comm.h's nccl_comm_destroy_deadline),
 *                     before it is called (a peer that dies there: dev/test/peer_killed.sh)
 *   sync_params:R:1   in the first trainer_sync_params of train_gpt2.cu (the run-end replica check
 *                     or an evaluation), before zero1/ queues its parameters' all-gathers
 *   wait:R:S          in the first deadline wait of step S (its description's "at step S") that
 *                     found its collective incomplete, right after the deadline read the clock
 *                     (run/watchdog.h): with step:0:S, rank R stops inside the wait for rank 0
 *   corpus_commit:0:1 prepro_corpus, its shards written, before the manifest (tools/prepro_corpus.c)
 *   corpus_done:0:1   prepro_corpus, the corpus renamed into place, before its last directory check
 * Once: a spec that fired is recorded in the environment (LLMC_TEST_STOP_FIRED), which a
 * restarted process (run/blas_cores.h) inherits.
 *
 * Faults planted in a step (STEP is 0-based; STEP+ plants the fault in every step from STEP
 * on: a run that has diverged):
 *   LLMC_TEST_PLANT_NAN=STEP[+]      a NaN in h0.qkvb's gradient on the last rank, in the step's
 *                                    last micro-step, the moment backward has it final and before
 *                                    the optimizer's hook sees it (so its bucket cannot be reducing
 *                                    yet): --check-nan must stop every rank (test_zero1.sh, the GPU
 *                                    suite); without it the step is skipped (test_nonfinite.sh)
 *   LLMC_TEST_GRAD_SPIKE=STEP[:X]    the same element set to X (default TEST_HOOKS_GRAD_SPIKE)
 *                                    instead: a grad-norm outlier for -sg (test_outliers.sh, the
 *                                    GPU suite's skip_update), or with --grad-clip 0 a gradient
 *                                    whose square overflows AdamW's v (test_nonfinite.sh)
 *   LLMC_TEST_LOSS_SPIKE=STEP        every target of the step is the last token id: a loss outlier
 *                                    for -sl (test_outliers.sh)
 *   LLMC_TEST_NAN_LOSS=STEP[+]       the last rank's loss of the step's last micro-step is NaN, its
 *                                    gradients untouched: a non-finite loss alone (test_nonfinite.sh)
 * They act from outside the step: the trainer's seam_plant_faults wraps the model's hooks once
 * it is built, and run_step_begin's seam_begin_step wraps the step's batch function.
 *
 * LLMC_TEST_DATA_TRACE=PREFIX: every row a rank reads is appended to PREFIX.rankN.
 * LLMC_TEST_BLAS_CORENAME=NAME: the first process believes OpenBLAS reported NAME (e.g.
 * Prescott), so that the restart on better kernels is tested on a machine OpenBLAS detects
 * right; the restarted process looks at the real name (dev/test/test_blas_cores.sh).
 * LLMC_TEST_TRACE_CLOCK_SKEW=RANK:US: that rank's trace clock reads US microseconds ahead
 * (negative: behind), as a host whose clock is off would; --trace's offsets must undo it
 * (dev/test/test_trace.sh).
 * LLMC_TEST_SLOW_RANK=RANK:MS: that rank sleeps MS milliseconds at the start of every step,
 * inside the step's time: a straggler for --straggler-every to name (test_metrics.sh).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/files.h"
#include "run/seams.h"

// ---------------------------------------------------------------------------- stop points

#define TEST_STOP_MAX 8

typedef struct {
    char point[24];
    int rank;  // -1: every rank
    long n;
} TestStop;

// LLMC_TEST_STOP, parsed once; a malformed value is an error (a test that meant to stop
// somewhere must not run on unstopped).
static int test_stop_specs(const TestStop** out) {
    static TestStop specs[TEST_STOP_MAX];
    static int count = -1;
    if (count < 0) {
        count = 0;
        const char* env = getenv("LLMC_TEST_STOP");
        for (const char* p = env; p && *p && count < TEST_STOP_MAX;) {
            TestStop* s = &specs[count];
            char rank[16];
            int used = 0;
            if (sscanf(p, "%23[a-z_]:%15[0-9*]:%ld%n", s->point, rank, &s->n, &used) != 3 || (p[used] && p[used] != ',')) {
                fatal("LLMC_TEST_STOP = '%s': expected POINT:RANK:N[,POINT:RANK:N...] (RANK a number or *)", env);
            }
            s->rank = strcmp(rank, "*") == 0 ? -1 : atoi(rank);
            count++;
            p += used + (p[used] == ',');
        }
    }
    *out = specs;
    return count;
}

static void test_stop_at(const char* point, long n, const char* where) {
    const TestStop* specs;
    int count = test_stop_specs(&specs);
    for (int i = 0; i < count; i++) {
        const TestStop* s = &specs[i];
        if (strcmp(s->point, point) != 0 || s->n != n || (s->rank >= 0 && s->rank != utils_rank())) continue;
        if (strcmp(point, "save_write") == 0) {  // the writer thread only: its rank trains on (never "fired")
            fprintf(stderr, "test: rank %d stalls its checkpoint writer %s %ld (LLMC_TEST_STOP, thread of pid %ld)\n",
                    utils_rank(), where, n, (long)getpid());
            for (;;) pause();
        }
        char mark[16], fired[16 * TEST_STOP_MAX] = "";
        snprintf(mark, sizeof(mark), ",%d,", i);
        const char* before = getenv("LLMC_TEST_STOP_FIRED");
        if (before && strstr(before, mark)) continue;
        snprintf(fired, sizeof(fired), "%s%s", before ? before : "", mark);
        setenv("LLMC_TEST_STOP_FIRED", fired, 1);
        fflush(stdout);
        fprintf(stderr, "test: rank %d stops itself %s %ld (LLMC_TEST_STOP, pid %ld)\n", utils_rank(), where, n,
                (long)getpid());
        fflush(stderr);
        raise(SIGSTOP);
    }
}

static void test_stop_in_wait(const char* what) {
    const TestStop* specs;
    if (test_stop_specs(&specs) == 0) return;
    const char* at = strstr(what, " at step ");
    long step = at ? strtol(at + 9, NULL, 10) : 0;
    if (step > 0) test_stop_at("wait", step, "in a deadline wait, right after its clock read, at step");
}

// ---------------------------------------------------------------------------- planted faults

// Far above any norm of a healthy step (the gradients are clipped to --grad-clip), so that
// its z-score exceeds any -sg threshold a test uses.
#define TEST_HOOKS_GRAD_SPIKE 1e4f

// When a fault acts: from step `step` (-1: never), in that step only or (from_on) in every later one.
typedef struct {
    int step, from_on;
} TestHookSteps;

typedef struct {
    int installed;             // test_hooks_install has read the environment
    TestHookSteps plant_nan, grad_spike, loss_spike, nan_loss;
    float spike_value;
    int step;                  // the step the loop runs now (-1 before the first)
    int contributions;         // h0.qkvb's gradient contributions in this step so far
    int forwards;              // forwards that reached the loss in this step so far
    int micro_steps, positions, vocab_size, last_block;
    ModelHooks inner;          // the optimizer's hooks, which the wrappers call on
    void* trainer;
    void (*write_grad)(void* trainer, int tensor, float value);
    void (*write_loss)(void* trainer, float value);
    BatchFn batch;             // the loop's, during a loss spike's step
    void* batch_ctx;
    int* targets;
} TestHooks;



static TestHooks test_hooks;

// NAME=STEP, or NAME=STEP+ where from_plus allows it, or NAME=STEP:X where value is
// given (*value: X; unchanged without it).
static TestHookSteps test_hooks_steps_from_env(const char* name, int from_plus, float* value) {
    TestHookSteps at = {-1, 0};
    const char* text = getenv(name);
    if (text == NULL || *text == '\0') return at;
    char* end;
    long step = strtol(text, &end, 10);
    at.from_on = from_plus && *end == '+';
    if (at.from_on) end++;
    if (value && *end == ':') *value = strtof(end + 1, &end);
    if (*end != '\0' || step < 0 || step > 1000000000L) {
        fatal("%s = '%s': expected a 0-based step%s%s", name, text, from_plus ? " (STEP+: every step from it)" : "",
              value ? " (STEP:X: the value X)" : "");
    }
    at.step = (int)step;
    return at;
}

static int test_hooks_acts(const TestHookSteps* at, int step) {
    return at->step >= 0 && (step == at->step || (at->from_on && step > at->step));
}

static void test_hooks_grad_done(void* ctx, int tensor) {
    TestHooks* h = &test_hooks;
    if (tensor == gpt2_idx_layer(0, LAYER_QKVB) && h->contributions++ == h->micro_steps - 1) {
        int nan = test_hooks_acts(&h->plant_nan, h->step), spike = test_hooks_acts(&h->grad_spike, h->step);
        if (nan || spike) {
            fprintf(stderr, "test: rank %d plants %s in h0.qkvb's gradient at step %d (%s)\n", utils_rank(),
                    nan ? "a NaN" : "a spike", h->step + 1, nan ? "LLMC_TEST_PLANT_NAN" : "LLMC_TEST_GRAD_SPIKE");
            h->write_grad(h->trainer, tensor, nan ? NAN : h->spike_value);
        }
    }
    if (h->inner.grad_contribution_done) h->inner.grad_contribution_done(ctx, tensor);
}

// The forward's last block (block L) ends after the loss: in the step's last micro-step, the
// loss becomes NaN. Evaluations run between steps and count into the step before, past its
// micro-steps, so they never match.
static void test_hooks_forward_end(void* ctx, int block) {
    TestHooks* h = &test_hooks;
    if (block == h->last_block && h->forwards++ == h->micro_steps - 1 && test_hooks_acts(&h->nan_loss, h->step)) {
        fprintf(stderr, "test: rank %d makes its loss NaN at step %d (LLMC_TEST_NAN_LOSS)\n", utils_rank(), h->step + 1);
        h->write_loss(h->trainer, NAN);
    }
    if (h->inner.forward_block_end) h->inner.forward_block_end(ctx, block);
}

static void test_hooks_install(ModelHooks* hooks, void* trainer,
                        void (*write_grad)(void* trainer, int tensor, float value),
                        void (*write_loss)(void* trainer, float value), const TrainConfig* cfg,
                        const GPT2Config* mc, int micro_steps, int rank, int world) {
    TestHooks* h = &test_hooks;
    h->installed = 1;
    h->step = -1;
    h->plant_nan = test_hooks_steps_from_env("LLMC_TEST_PLANT_NAN", 1, NULL);
    h->spike_value = TEST_HOOKS_GRAD_SPIKE;
    h->grad_spike = test_hooks_steps_from_env("LLMC_TEST_GRAD_SPIKE", 0, &h->spike_value);
    h->loss_spike = test_hooks_steps_from_env("LLMC_TEST_LOSS_SPIKE", 0, NULL);
    h->nan_loss = test_hooks_steps_from_env("LLMC_TEST_NAN_LOSS", 1, NULL);
    h->micro_steps = micro_steps;
    h->positions = cfg->B * cfg->T;
    h->vocab_size = mc->vocab_size;
    h->last_block = mc->num_layers;
    if (rank != world - 1) return;
    h->inner = *hooks;  // the wrappers call on with the optimizer's ctx, which stays in hooks
    h->trainer = trainer;
    h->write_grad = write_grad;
    h->write_loss = write_loss;
    if (h->plant_nan.step >= 0 || h->grad_spike.step >= 0) hooks->grad_contribution_done = test_hooks_grad_done;
    if (h->nan_loss.step >= 0) hooks->forward_block_end = test_hooks_forward_end;
}

static void test_hooks_spiked_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    TestHooks* h = (TestHooks*)ctx;
    h->batch(h->batch_ctx, micro, inputs, targets);
    if (!h->targets) h->targets = (int*)mallocCheck((size_t)h->positions * sizeof(int));
    for (int i = 0; i < h->positions; i++) h->targets[i] = h->vocab_size - 1;
    *targets = h->targets;
}

static void test_hooks_begin_step(int step, BatchFn* batch, void** batch_ctx) {
    TestHooks* h = &test_hooks;
    h->step = step;
    h->contributions = h->forwards = 0;
    if (h->installed && test_hooks_acts(&h->loss_spike, step)) {
        h->batch = *batch;
        h->batch_ctx = *batch_ctx;
        *batch = test_hooks_spiked_batch;
        *batch_ctx = h;
    }
}

// ---------------------------------------------------------------------------- traces, fakes

static FILE* seam_data_trace_open(int rank) {
    const char* prefix = getenv("LLMC_TEST_DATA_TRACE");
    if (!prefix) return NULL;
    char path[PATH_MAX_LEN];
    path_format(path, sizeof(path), "%s.rank%d", prefix, rank);
    FILE* f = fopenCheck(path, "a");
    setvbuf(f, NULL, _IOLBF, 0);  // a killed run's lines are there
    return f;
}

static const char* seam_blas_corename_fake(void) {
    const char* fake = getenv("LLMC_TEST_BLAS_CORENAME");
    return fake && *fake ? fake : NULL;
}

static double seam_trace_clock_skew(int rank) {
    const char* env = getenv("LLMC_TEST_TRACE_CLOCK_SKEW");
    int skewed;
    double us;
    char end;
    if (!env) return 0.0;
    if (sscanf(env, "%d:%lf%c", &skewed, &us, &end) != 2) fatal("LLMC_TEST_TRACE_CLOCK_SKEW=%s: expected RANK:US", env);
    return skewed == rank ? us : 0.0;
}

static void seam_slow_rank(int rank) {
    const char* spec = getenv("LLMC_TEST_SLOW_RANK");
    int slow_rank, ms, used = 0;
    if (!spec) return;
    if (sscanf(spec, "%d:%d%n", &slow_rank, &ms, &used) != 2 || spec[used] || ms < 0) {
        fatal("LLMC_TEST_SLOW_RANK = '%s': expected RANK:MS", spec);
    }
    if (rank == slow_rank) usleep((useconds_t)ms * 1000);
}

static const RunSeams TEST_SEAMS = {test_stop_at,          test_stop_in_wait,       test_hooks_install,
                                    test_hooks_begin_step, seam_data_trace_open,    seam_blas_corename_fake,
                                    seam_trace_clock_skew, seam_slow_rank};

// Before main: the program is a test build.
__attribute__((constructor)) static void seams_install(void) { run_seams = &TEST_SEAMS; }
