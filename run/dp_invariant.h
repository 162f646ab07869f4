/*
 * --dp-invariant in the trainers (the mode and its contract: docs/zero1.md). zero1/'s
 * runtime sums the gradients and the norm; run/dataloader.h gives rank r's micro-step i
 * the step's micro-batch r*k + i (rank-major); here are the splits the mode keeps (refused
 * otherwise, one error each) and the loss summed in the same canonical order.
 */
#ifndef LLMC_DP_INVARIANT_H
#define LLMC_DP_INVARIANT_H

#include <mpi.h>

#include "run/config.h"
#include "run/mpi_wait.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

// What the mode cannot keep the same bits under, refused before anything is allocated.
void dp_invariant_check(const TrainConfig* cfg, int world, int micro_steps);

// The step's mean loss: every rank's micro-step losses gathered (rank-major, so in the
// order of the step's micro-batches), summed as a pairwise tree in double (zero1/exact_sum.h's
// binary counter), divided by their number. step is 1-based, for the deadline's message.
float dp_invariant_loss(const float* micro_losses, int micro_steps, int world, int step);

#ifdef __cplusplus
}
#endif
#endif
