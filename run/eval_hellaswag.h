/*
 * The HellaSwag-style eval (-H 1), shared by both trainers: rows, scoring, ranks.
 *
 * Each item gives 4 rows, its context followed by one of its 4 completions. A row's score
 * is the mean cross-entropy of the completion's tokens only: the losses at the positions
 * that predict them (the context's last position through the completion's last but one).
 * The predicted completion is the one with the lowest mean loss (the first of equal ones);
 * the accuracy is the items whose prediction is the label, over all items. This is what
 * llm.c reports as acc_norm (length-normalised by the mean); the unnormalised sum is not
 * computed.
 *
 * Rows are forwarded B at a time, padded with token 0 to the longest of them (causal
 * attention: what follows a position cannot change its loss), which the start-up check
 * (run/hellaswag_file.h) keeps within -t. Items are split over the ranks in contiguous shares;
 * the counts are summed with one all-reduce, so the result does not depend on the rank
 * count. A trainer supplies only the forward: HellaswagForward.
 */
#ifndef LLMC_EVAL_HELLASWAG_H
#define LLMC_EVAL_HELLASWAG_H

#include <mpi.h>

#include "run/hellaswag_file.h"
#include "run/mpi_wait.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

// Forwards `rows` rows of T positions (inputs and targets rows*T each, host memory) and
// writes each position's cross-entropy loss, -log p(target | inputs up to it), to losses.
typedef void (*HellaswagForward)(void* ctx, const int* inputs, const int* targets, int rows, int T, float* losses);

typedef struct {
    int correct, total;
} HellaswagScore;

// --hellaswag-dump: every item's losses, gathered to rank 0 (each item's owner adds its
// values to zeros: the sum is exact) and written there, one line per item:
// "k index label predicted loss0 loss1 loss2 loss3". Rewritten at every evaluation.
void hellaswag_dump(const HellaswagSet* s, const double* mine, int lo, int hi, int rank,
                    const char* path);

// The eval over every rank's share; every rank returns the whole count.
HellaswagScore hellaswag_evaluate(const HellaswagSet* s, HellaswagForward forward, void* ctx, int B, int T,
                                  int rank, int world, const char* dump_path);

#ifdef __cplusplus
}
#endif
#endif
