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
 *                     (run/watchdog.h): with step:0:S, rank R stops inside the wait for rank 0
 * Once: a spec that fired is recorded in the environment (LLMC_TEST_STOP_FIRED), which every
 * translation unit of the process reads (each has its own copy of this header's statics).
 *   corpus_commit:0:1 prepro_corpus, its shards written, before the manifest (tools/prepro_corpus.c)
 *   corpus_done:0:1   prepro_corpus, the corpus renamed into place, before its last directory check
 * Header only, C11 and C++.
 */
#ifndef RUN_TEST_STOP_H
#define RUN_TEST_STOP_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TEST_STOP_MAX 8

typedef struct {
    char point[24];
    int rank;  // -1: every rank
    long n;
} TestStop;

// Stops this process when LLMC_TEST_STOP names (point, this rank, n) and that spec has not
// fired yet; where: how the line says it ("in the checkpoint save of step").
void test_stop_at(const char* point, long n, const char* where);

// In a deadline wait that found its collective incomplete (run/watchdog.h), on its first
// poll: the wait point of the step its description names.
void test_stop_in_wait(const char* what);

#ifdef __cplusplus
}
#endif
#endif
