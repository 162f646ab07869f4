/*
 * --skip-batches A-B: the run does not train on the global batches that its steps A to B
 * (1-based, as the step lines count) would read. When step A begins, the data loader first
 * moves past B-A+1 optimizer steps' worth of rows (B-A+1 times -d tokens), reading none of
 * them, so step A trains on what step B+1 would have read; the step count, the schedule and
 * -x are not moved. It is how a run that diverged on some data goes on without it
 * (Megatron-LM's --iterations-to-skip skips whole iterations, their count going on).
 *
 * The position is the loader's own (epoch, shard, tokens), so a skip covers the same rows at
 * any rank count and with --shuffle. Checkpoints record the ranges a run has applied
 * (state.txt's skipped_batches), so a requeued job that repeats the flag after a checkpoint
 * past step A does not skip twice, and a resume whose checkpoint lies past step A without
 * that skip is refused rather than skipping other batches than the ones named.
 */
#ifndef RUN_SKIP_BATCHES_H
#define RUN_SKIP_BATCHES_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SKIP_BATCHES_KEPT 16  // ranges a checkpoint remembers (the newest; older ones drop out)

// The ranges a run has applied, oldest first.
typedef struct {
    int count;
    int from[SKIP_BATCHES_KEPT], to[SKIP_BATCHES_KEPT];
} SkipBatches;

void skip_batches_add(SkipBatches* s, int from, int to);

// state.txt's value: "none", or the ranges as "A-B,C-D".
void skip_batches_format(const SkipBatches* s, FILE* f);

int skip_batches_has(const SkipBatches* s, int from, int to);

// The reverse; 0 on malformed text.
int skip_batches_parse(const char* text, SkipBatches* s);

// "A-B" or "A" (1 <= A <= B): 1 and *from, *to; 0 when malformed.
int skip_batches_parse_range(const char* text, int* from, int* to);

#ifdef __cplusplus
}
#endif
#endif
