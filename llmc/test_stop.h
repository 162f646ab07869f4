/*
 * Test only: stop points, so that no test races a signal, a removal or a second job against
 * a running program. LLMC_TEST_STOP=POINT:RANK:N (several, comma separated; RANK * for every
 * rank) makes that rank stop itself (SIGSTOP), once, when it reaches the named point at step
 * N (prepro_corpus's points: its run, 1). It first prints one line,
 *   test: rank R stops itself <where> N (LLMC_TEST_STOP, pid P)
 * and the test, once it sees the process stopped, acts (removes -o, starts a second job,
 * stops the other ranks) and continues it (SIGCONT) at a known place. Points:
 *   save:R:S          in the checkpoint save of step S, before the first collective write of
 *                     model.bin (a rank whose host hangs there)
 *   load:R:S          in the resume from step S, before MPI_File_open of model.bin
 *   save_open:R:S     in the save of step S, its temporary directory made, before MPI_File_open
 *   save_commit:R:S   in the save of step S, the files written, before rank 0's manifest and rename
 *   step:R:S          before step S (1-based, as the step lines count) runs
 *   wait:R:S          in the first deadline wait of step S (its description's "at step S") that
 *                     found its collective incomplete, right after the deadline read the clock
 *                     (llmc/watchdog.h): with step:0:S, rank R stops inside the wait for rank 0
 * Once: a spec that fired is recorded in the environment (LLMC_TEST_STOP_FIRED), which every
 * translation unit of the process reads (each has its own copy of this header's statics).
 *   corpus_commit:0:1 prepro_corpus, its shards written, before the manifest (tools/prepro_corpus.c)
 *   corpus_done:0:1   prepro_corpus, the corpus renamed into place, before its last directory check
 * Header only, C11 and C++.
 */
#ifndef LLMC_TEST_STOP_H
#define LLMC_TEST_STOP_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TEST_STOP_MAX 8

typedef struct {
    char point[24];
    int rank;  // -1: every rank
    long n;
} TestStop;

// LLMC_TEST_STOP, parsed once; a malformed value is an error (a test that meant to stop
// somewhere must not run on unstopped).
static inline int test_stop_specs(const TestStop** out) {
    static TestStop specs[TEST_STOP_MAX];
    static int count = -1;
    if (count < 0) {
        count = 0;
        const char* env = getenv("LLMC_TEST_STOP");
        for (const char* p = env; p && *p && count < TEST_STOP_MAX;) {
            TestStop* s = &specs[count];
            char rank[16];
            int used = 0;
            if (sscanf(p, "%23[a-z_]:%15[0-9*]:%ld%n", s->point, rank, &s->n, &used) != 3 || (p[used] && p[used] != ',')) {
                fatal("LLMC_TEST_STOP = '%s': expected POINT:RANK:N[,POINT:RANK:N...] (RANK a number or *)", env);
            }
            s->rank = strcmp(rank, "*") == 0 ? -1 : atoi(rank);
            count++;
            p += used + (p[used] == ',');
        }
    }
    *out = specs;
    return count;
}

// Stops this process when LLMC_TEST_STOP names (point, this rank, n) and that spec has not
// fired yet; where: how the line says it ("in the checkpoint save of step").
static inline void test_stop_at(const char* point, long n, const char* where) {
    const TestStop* specs;
    int count = test_stop_specs(&specs);
    for (int i = 0; i < count; i++) {
        const TestStop* s = &specs[i];
        if (strcmp(s->point, point) != 0 || s->n != n || (s->rank >= 0 && s->rank != utils_rank())) continue;
        char mark[16], fired[16 * TEST_STOP_MAX] = "";
        snprintf(mark, sizeof(mark), ",%d,", i);
        const char* before = getenv("LLMC_TEST_STOP_FIRED");
        if (before && strstr(before, mark)) continue;
        snprintf(fired, sizeof(fired), "%s%s", before ? before : "", mark);
        setenv("LLMC_TEST_STOP_FIRED", fired, 1);
        fflush(stdout);
        fprintf(stderr, "test: rank %d stops itself %s %ld (LLMC_TEST_STOP, pid %ld)\n", utils_rank(), where, n,
                (long)getpid());
        fflush(stderr);
        raise(SIGSTOP);
    }
}

// In a deadline wait that found its collective incomplete (llmc/watchdog.h), on its first
// poll: the wait point of the step its description names.
static inline void test_stop_in_wait(const char* what) {
    const TestStop* specs;
    if (test_stop_specs(&specs) == 0) return;
    const char* at = strstr(what, " at step ");
    long step = at ? strtol(at + 9, NULL, 10) : 0;
    if (step > 0) test_stop_at("wait", step, "in a deadline wait, right after its clock read, at step");
}

#ifdef __cplusplus
}
#endif
#endif
