/*
 * Test only: the faults that test scripts plant in the product trainers, read once from the
 * environment (like LLMC_TEST_STOP in llmc/checkpoint_io.h). STEP is 0-based.
 *   LLMC_TEST_PLANT_NAN=STEP   a NaN in h0.qkvb's gradient on the last rank, in the step's last
 *                              micro-step, the moment backward has it final and before the
 *                              optimizer's hook sees it (so its bucket cannot be reducing yet):
 *                              --check-nan must stop every rank (test_zero1.sh, the GPU suite)
 *   LLMC_TEST_GRAD_SPIKE=STEP  the same element set to TEST_HOOKS_GRAD_SPIKE instead: a grad-norm
 *                              outlier for -sg (test_outliers.sh, the GPU suite's skip_update)
 *   LLMC_TEST_LOSS_SPIKE=STEP  every target of the step is the last token id: a loss outlier
 *                              for -sl (test_outliers.sh)
 * They act from outside the step: llmc/train_main.h wraps the model's gradient hook once the
 * trainer is built, and the training loop wraps the step's batch function.
 */
#ifndef LLMC_TEST_HOOKS_H
#define LLMC_TEST_HOOKS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "llmc/gpt2_spec.h"
#include "llmc/model_hooks.h"
#include "llmc/train_loop.h"
#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

// Far above any norm of a healthy step (the gradients are clipped to --grad-clip), so that
// its z-score exceeds any -sg threshold a test uses.
#define TEST_HOOKS_GRAD_SPIKE 1e4f

typedef struct {
    int installed;             // test_hooks_install has read the environment
    int plant_nan_step, grad_spike_step, loss_spike_step;  // -1: never
    int step;                  // the step the loop runs now
    int contributions;         // h0.qkvb's gradient contributions in this step so far
    int micro_steps, planting_rank, positions, vocab_size;
    ModelHooks inner;          // the optimizer's hooks, which the wrapper calls on
    void* trainer;
    void (*write_grad)(void* trainer, int tensor, float value);
    BatchFn batch;             // the loop's, during a loss spike's step
    void* batch_ctx;
    int* targets;
} TestHooks;

static TestHooks test_hooks;

static inline int test_hooks_step_from_env(const char* name) {
    const char* text = getenv(name);
    if (text == NULL || *text == '\0') return -1;
    char* end;
    long step = strtol(text, &end, 10);
    if (*end != '\0' || step < 0 || step > 1000000000L) fatal("%s = '%s': expected a 0-based step", name, text);
    return (int)step;
}

static inline void test_hooks_grad_done(void* ctx, int tensor) {
    TestHooks* h = &test_hooks;
    if (tensor == gpt2_idx_layer(0, LAYER_QKVB) && h->contributions++ == h->micro_steps - 1) {
        int nan = h->step == h->plant_nan_step, spike = h->step == h->grad_spike_step;
        if (nan || spike) {
            fprintf(stderr, "test: rank %d plants %s in h0.qkvb's gradient at step %d (%s)\n", utils_rank(),
                    nan ? "a NaN" : "a spike", h->step + 1, nan ? "LLMC_TEST_PLANT_NAN" : "LLMC_TEST_GRAD_SPIKE");
            h->write_grad(h->trainer, tensor, nan ? NAN : TEST_HOOKS_GRAD_SPIKE);
        }
    }
    if (h->inner.grad_contribution_done) h->inner.grad_contribution_done(ctx, tensor);
}

// After the trainer is built: reads the environment and, where a gradient is to be planted,
// wraps the model's gradient hook on the last rank. write_grad sets one element of a
// tensor's gradient, ordered after the backward work queued so far.
static inline void test_hooks_install(ModelHooks* hooks, void* trainer,
                                      void (*write_grad)(void* trainer, int tensor, float value),
                                      const TrainConfig* cfg, const GPT2Config* mc, int micro_steps, int rank,
                                      int world) {
    TestHooks* h = &test_hooks;
    h->installed = 1;
    h->plant_nan_step = test_hooks_step_from_env("LLMC_TEST_PLANT_NAN");
    h->grad_spike_step = test_hooks_step_from_env("LLMC_TEST_GRAD_SPIKE");
    h->loss_spike_step = test_hooks_step_from_env("LLMC_TEST_LOSS_SPIKE");
    h->micro_steps = micro_steps;
    h->positions = cfg->B * cfg->T;
    h->vocab_size = mc->vocab_size;
    if ((h->plant_nan_step >= 0 || h->grad_spike_step >= 0) && rank == world - 1) {
        h->inner = *hooks;
        h->trainer = trainer;
        h->write_grad = write_grad;
        hooks->grad_contribution_done = test_hooks_grad_done;  // its ctx stays the optimizer's
    }
}

static inline void test_hooks_spiked_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    TestHooks* h = (TestHooks*)ctx;
    h->batch(h->batch_ctx, micro, inputs, targets);
    if (!h->targets) h->targets = (int*)mallocCheck((size_t)h->positions * sizeof(int));
    for (int i = 0; i < h->positions; i++) h->targets[i] = h->vocab_size - 1;
    *targets = h->targets;
}

// The loop, before each step: the step's number for the gradient hook, and in a loss
// spike's step the batch function that replaces the targets.
static inline void test_hooks_begin_step(int step, BatchFn* batch, void** batch_ctx) {
    TestHooks* h = &test_hooks;
    h->step = step;
    h->contributions = 0;
    if (h->installed && step == h->loss_spike_step) {
        h->batch = *batch;
        h->batch_ctx = *batch_ctx;
        *batch = test_hooks_spiked_batch;
        *batch_ctx = h;
    }
}

#ifdef __cplusplus
}
#endif
#endif
