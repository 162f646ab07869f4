/*
 * Test only: the faults that test scripts plant in the product trainers, read once from the
 * environment (like LLMC_TEST_STOP in run/test_stop.h). STEP is 0-based; STEP+ plants
 * the fault in every step from STEP on (a run that has diverged).
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
 * They act from outside the step: run/train_main.h wraps the model's hooks once the trainer
 * is built, and the training loop wraps the step's batch function.
 */
#ifndef RUN_TEST_HOOKS_H
#define RUN_TEST_HOOKS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "llmc/gpt2_spec.h"
#include "llmc/model_hooks.h"
#include "run/step.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

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



// After the trainer is built: reads the environment and, where a fault is to be planted,
// wraps the model's hooks on the last rank. write_grad sets one element of a tensor's
// gradient, write_loss the loss of the forward just queued, each ordered after the work
// queued so far.
void test_hooks_install(ModelHooks* hooks, void* trainer,
                        void (*write_grad)(void* trainer, int tensor, float value),
                        void (*write_loss)(void* trainer, float value), const TrainConfig* cfg,
                        const GPT2Config* mc, int micro_steps, int rank, int world);

// The loop, before each step: the step's number for the gradient hook, and in a loss
// spike's step the batch function that replaces the targets.
void test_hooks_begin_step(int step, BatchFn* batch, void** batch_ctx);

#ifdef __cplusplus
}
#endif
#endif
