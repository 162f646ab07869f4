/*
 * zero1/split_embedding.h: the tied embedding's gradient in two parts (--split-embedding):
 * the last micro-step's encoder rows, planned, sent to the owners of their slots and added
 * into the reduced shard (zero1/split_embedding.c says how).
 *
 * The runtime (zero1/runtime.c) makes the decisions: when the model gets the rows, when
 * they are sent, when the exchange is waited for and when they are added. The functions
 * here take what they work on: the communicator that shares the embedding's bucket, the
 * device, the grad buffer.
 */
#ifndef ZERO1_SPLIT_EMBEDDING_H
#define ZERO1_SPLIT_EMBEDDING_H

#include <stddef.h>

#include "zero1/comm.h"
#include "zero1/device_ops.h"
#include "zero1/shards.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct SplitEmbedding SplitEmbedding;

// The embedding in the grad buffer, fixed for the run.
typedef struct {
    size_t start;            // its first element
    size_t rows, width;      // rows (one per token id) and elements per row
    Zero1Range bucket;       // its bucket (its own); rank o's slot: the o-th of comm->size equal parts
    size_t buffer_numel;     // the whole grad buffer (what adding the rows may touch)
    int max_positions;       // tokens per micro-step
    int average;             // the dense reduction averages over the ranks (ZERO1_AVG): the rows do too
} SplitEmbeddingShape;

// Buffers for the worst case (max_positions distinct rows on every rank of comm) on dev.
SplitEmbedding* split_embedding_create(const SplitEmbeddingShape* shape, const Zero1Comm* comm,
                                       const Zero1Device* dev);
void split_embedding_destroy(SplitEmbedding* sp, const Zero1Device* dev);  // sp may be NULL
const SplitEmbeddingShape* split_embedding_shape(const SplitEmbedding* sp);

// Step 1, before the encoder's backward: plans this step's exchange from tokens[0..n)
// (one blocking host all-gather on comm) and returns the zeroed compact rows, one per
// distinct token, ascending; *row_of_position (device, n ints): each position's row.
float* split_embedding_plan(SplitEmbedding* sp, Zero1Comm* comm, const Zero1Device* dev, const int* tokens, int n,
                            const int** row_of_position);
// Step 2: the all-to-all of the planned rows (bucket labels it in messages and traces).
Zero1Handle split_embedding_send(SplitEmbedding* sp, Zero1Comm* comm, int bucket);
// Step 3, once the exchange and the bucket's dense reduction are complete: the received
// rows added into this rank's slot of grads (the whole buffer), on dev's compute stream.
void split_embedding_add(const SplitEmbedding* sp, const Zero1Device* dev, float* grads);

// Rows this rank sent to other ranks, over all steps.
size_t split_embedding_rows_sent(const SplitEmbedding* sp);

#ifdef __cplusplus
}
#endif
#endif
