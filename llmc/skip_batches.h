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
#ifndef LLMC_SKIP_BATCHES_H
#define LLMC_SKIP_BATCHES_H

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

// "A-B" or "A" (1 <= A <= B): 1 and *from, *to; 0 when malformed.
static inline int skip_batches_parse_range(const char* text, int* from, int* to) {
    char* end = NULL;
    long a = strtol(text, &end, 10), b = a;
    if (end == text || a < 1 || a > INT_MAX) return 0;
    if (*end == '-') {
        const char* second = end + 1;
        b = strtol(second, &end, 10);
        if (end == second || b < a || b > INT_MAX) return 0;
    }
    if (*end != '\0') return 0;
    *from = (int)a;
    *to = (int)b;
    return 1;
}

static inline int skip_batches_has(const SkipBatches* s, int from, int to) {
    for (int i = 0; i < s->count; i++)
        if (s->from[i] == from && s->to[i] == to) return 1;
    return 0;
}

static inline void skip_batches_add(SkipBatches* s, int from, int to) {
    if (s->count == SKIP_BATCHES_KEPT) {  // the oldest drops out
        for (int i = 1; i < s->count; i++) {
            s->from[i - 1] = s->from[i];
            s->to[i - 1] = s->to[i];
        }
        s->count--;
    }
    s->from[s->count] = from;
    s->to[s->count] = to;
    s->count++;
}

// state.txt's value: "none", or the ranges as "A-B,C-D".
static inline void skip_batches_format(const SkipBatches* s, FILE* f) {
    if (s->count == 0) fputs("none", f);
    for (int i = 0; i < s->count; i++) fprintf(f, "%s%d-%d", i ? "," : "", s->from[i], s->to[i]);
}

// The reverse; 0 on malformed text.
static inline int skip_batches_parse(const char* text, SkipBatches* s) {
    s->count = 0;
    if (strcmp(text, "none") == 0) return 1;
    char buf[SKIP_BATCHES_KEPT * 24];
    if (strlen(text) >= sizeof(buf)) return 0;
    strcpy(buf, text);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        int from, to;
        if (s->count == SKIP_BATCHES_KEPT || strchr(item, '-') == NULL || !skip_batches_parse_range(item, &from, &to)) {
            return 0;
        }
        skip_batches_add(s, from, to);
    }
    return s->count > 0;
}

#ifdef __cplusplus
}
#endif
#endif
