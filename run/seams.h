/*
 * The places where a test build acts on a program: a rank stops itself at a named point (so
 * that a test removes -o, starts a second job or stops a peer at a known moment), a fault
 * is planted in a step (a NaN or a spike in a gradient, a NaN loss, a loss spike), the rows
 * a rank reads are traced, OpenBLAS's kernel report is faked, a rank's trace clock is skewed. The product has only these
 * calls, each a no-op there; what they do lives in dev/test/seams.c, which test builds link
 * (docs/testing.md lists the environment variables that drive it).
 */
#ifndef RUN_SEAMS_H
#define RUN_SEAMS_H

#include <stdio.h>

#include "llmc/gpt2_spec.h"
#include "llmc/model_hooks.h"
#include "run/config.h"
#include "run/step.h"

#ifdef __cplusplus
extern "C" {
#endif

// Sets one element of a tensor's gradient / the loss of the forward just queued, ordered
// after the trainer's work queued so far (the trainer's own functions).
typedef void (*SeamWriteGrad)(void* trainer, int tensor, float value);
typedef void (*SeamWriteLoss)(void* trainer, float value);

typedef struct {
    void (*stop_at)(const char* point, long n, const char* where);
    void (*stop_in_wait)(const char* what);
    void (*plant_faults)(ModelHooks* hooks, void* trainer, SeamWriteGrad write_grad, SeamWriteLoss write_loss,
                         const TrainConfig* cfg, const GPT2Config* mc, int micro_steps, int rank, int world);
    void (*begin_step)(int step, BatchFn* batch, void** batch_ctx);
    FILE* (*data_trace)(int rank);
    const char* (*blas_corename)(void);
    double (*trace_clock_skew_us)(int rank);
} RunSeams;

// NULL in the product; a test build's dev/test/seams.c sets it before main runs.
extern const RunSeams* run_seams;

// A rank stops itself (SIGSTOP) at point (step or run n); where: how its line says it.
void seam_stop_at(const char* point, long n, const char* where);
// In a deadline wait that found its collective incomplete (run/watchdog.h), on its first poll.
void seam_stop_in_wait(const char* what);
// Once the trainer is built: faults planted in the model's hooks (the last rank's).
void seam_plant_faults(ModelHooks* hooks, void* trainer, SeamWriteGrad write_grad, SeamWriteLoss write_loss,
                       const TrainConfig* cfg, const GPT2Config* mc, int micro_steps, int rank, int world);
// Before each step: its number, and in a loss spike's step a batch function that changes the targets.
void seam_begin_step(int step, BatchFn* batch, void** batch_ctx);
// Where a rank's data loader writes the rows it reads ("epoch shard row" lines), or NULL.
FILE* seam_data_trace(int rank);
// The OpenBLAS kernels a test build pretends OpenBLAS chose, or NULL (run/blas_cores.h).
const char* seam_blas_corename(void);
// Microseconds added to this rank's trace clock (zero1/trace_clock.h), as if its host's
// clock were that far off rank 0's; 0 in the product.
double seam_trace_clock_skew_us(int rank);

#ifdef __cplusplus
}
#endif
#endif
