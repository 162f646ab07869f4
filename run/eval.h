/*
 * What a run evaluates besides its loss: the validation batches (-m), the HellaSwag-style
 * eval (-H 1) and samples (-s). A trainer supplies only the forwards (HellaswagForward,
 * NextTokenLogits; the validation loop calls validation_next_batch).
 *
 * Validation: -m M counts global batches of B x T tokens, the first M of the val split in
 * the order of one rank (every rank's loader walks that order), so the same checkpoint gives
 * the same val loss at any rank count. Batch j is rank j % world's: a rank gets one fewer when
 * M is not a multiple of the ranks, none when M < ranks. The loss is the sum of the batches'
 * mean losses over all ranks divided by M (every batch has B x T tokens: the token mean).
 * An M beyond the split's batches is clamped to them, with one line (validation_batches).
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
#include "run/dataloader.h"
#include "run/hellaswag_file.h"
#include "run/mpi_wait.h"
#include "run/files.h"
#include "run/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

// The -m batches to read: M, or the val split's whole batches (one line on rank 0) when it
// has fewer, rather than reading batches twice (or looping for ever at -m 2147483647).
int validation_batches(const DataLoader* val, int M, int rank);

// Reads this rank's next validation batch into val (the other ranks' batches passed over
// unread; *walked counts the global batches passed, 0 to start from the split's first);
// returns 0 after this rank's last of the `batches`.
int validation_next_batch(DataLoader* val, int* walked, int batches, int rank, int world);

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
