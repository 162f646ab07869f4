/*
 * What a run evaluates besides its loss: the HellaSwag-style eval (-H 1) and samples (-s).
 * A trainer supplies only the forwards (HellaswagForward, NextTokenLogits).
 *
 * The HellaSwag-style eval: rows, scoring, ranks.
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
 * count.
 */
#ifndef RUN_EVAL_H
#define RUN_EVAL_H

#include <mpi.h>

#include "llmc/gpt2_spec.h"
#include "run/hellaswag_file.h"
#include "run/mpi_wait.h"
#include "run/files.h"
#include "run/tokenizer.h"

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


// Runs the model on tokens[0..n) and writes the fp32 logits (Vp of them) of the last position.
typedef void (*NextTokenLogits)(void* ctx, const int* tokens, int n, float* logits);

// Autoregressive sampling of gen_tokens tokens from <|endoftext|> around a trainer's forward,
// the context window sliding at T. Every rank generates the same text (same seed, same
// weights); rank 0 prints it.
void print_sample(void* ctx, NextTokenLogits next_logits, const GPT2Config* c, int T, int gen_tokens, int rank,
                  const Tokenizer* tok, uint64_t* rng_state);

#ifdef __cplusplus
}
#endif
#endif
