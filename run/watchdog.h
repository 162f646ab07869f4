/*
 * run/watchdog.h: deadlines for host waits on communication, the one place that decides
 * how long a rank waits and how the job ends when it waited too long.
 *
 * A collective never completes when another rank stopped (a crash inside a kernel, a
 * SIGSTOP, a host whose network went away): MPI_Wait and cudaStreamSynchronize then block
 * forever and the job hangs until a person notices. Every host wait on communication
 * (zero1/comm_mpi.c's wait, the trainers' own collectives through run/mpi_wait.h, the GPU
 * step's one sync through zero1/watchdog_cuda.h) polls instead, with this file's deadline
 * (the GPU trainers' other waits on NCCL work block under the watchdog thread below:
 * run/nccl_comm.h's cudaDeadline):
 *
 *   watchdog_poll_until(done, ctx, timeout_s, describe, end_job)
 *
 * calls done(ctx) until it answers 1: back to back for the first 0.25 s (as MPI_Wait polls;
 * Open MPI yields the core inside each call where ranks outnumber cores), then with naps
 * between calls, 20 us doubling up to 1 ms, so that a rank stalled for seconds (a stopped
 * peer) uses about 2% of a core. Why not nap sooner: Open MPI moves a collective on only
 * while some rank polls it, so a napping rank slows its peers down. Measured at np=2:
 * naps from the first poll made a 4 KB reduce-scatter plus all-gather take 0.46 ms instead
 * of MPI_Wait's 0.003 ms, made a rank arriving 20 ms late wait 1.1 ms instead of 0.2 ms for
 * a 400 KB reduce-scatter, and (naps after 50 ms) the plain trainer's 64 MB gradient
 * all-reduce lose 50 ms a step; a healthy wait rarely lasts 0.25 s. Past timeout_s (0:
 * never) it asks describe() what it was waiting for and calls watchdog_abort_job:
 *
 *   error: [rank 2] zero1: reduce-scatter of bucket 1 at step 5 did not complete within
 *   10 s (a rank stopped or its network is gone); aborting the job
 *
 * A deadline counts the time this process ran, not wall time: the wait adds up the
 * intervals between its own clock reads, and an interval longer than 1 s means the process
 * was stopped (SIGSTOP, a scheduler's suspend or preemption) or not scheduled, so it counts
 * nothing. A job stopped and continued as a whole thus goes on whatever the length of the
 * stop (every rank's clock stood still with it), while ranks that keep running and poll for
 * a peer that stopped alone add up their waiting and end the job; a rank that was itself
 * stopped does not blame the others when it is continued. The check uses the very clock
 * read that the sum took, so a stop between the two cannot count either.
 *
 * watchdog_abort_job prints that line, arms an alarm that ends this process a few seconds
 * later whatever happens, and calls end_job (MPI_Abort): MPI_Abort itself can block when
 * the launcher cannot be reached, e.g. from a host whose link is down. The other ranks time
 * out too; so that one of them speaks, a rank first waits 0.25 s per rank number (at most
 * 3 s), and in the usual case the lowest live rank's abort ends the rest before they print.
 *
 * Some waits cannot be polled: a collective MPI-IO call (MPI_File_open, write_at_all,
 * read_at_all, sync, close) blocks inside the library until every rank has joined, and
 * the non-blocking forms are not an option (Open MPI 4's MPI_File_iwrite_at_all crashed
 * on a full disk). For those a watchdog thread keeps the time instead:
 *
 *   watchdog_arm("checkpoint save: MPI_File_write_at_all of DIR/model.bin at step 4",
 *                timeout_s, end_job);   ... the blocking call ...   watchdog_disarm();
 *
 * The thread (started on the first arm) looks every 50 ms and adds up its own ticks the same
 * way; past timeout_s it ends the job exactly as a poll would, with the same message. It calls end_job
 * from its own thread while the main thread sits inside MPI: MPI_Abort is the one call
 * that must work from anywhere, and the alarm ends the process if it does not.
 *
 * Header only, no MPI and no CUDA (callers pass end_job), C11 and C++.
 */
#ifndef RUN_WATCHDOG_H
#define RUN_WATCHDOG_H

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WATCHDOG_DEFAULT_TIMEOUT_S 600.0
#define WATCHDOG_ABORT_GRACE_S 5        // after end_job is called, the alarm ends the process
#define WATCHDOG_POLL_SPIN_S 0.25     // polls back to back this long, then naps
#define WATCHDOG_POLL_FIRST_US 20
#define WATCHDOG_POLL_MAX_US 1000
#define WATCHDOG_STOPPED_GAP_S 1.0     // a longer gap between polls: this process did not run

double watchdog_monotonic_s(void);

// The time this process ran since start: the sum of the intervals between its clock reads,
// each at most WATCHDOG_STOPPED_GAP_S (a longer one: the process was not running).
typedef struct {
    double last_s, ran_s;
} WatchdogClock;

void watchdog_sleep_us(long us);

// Ends the job: "error: [rank R] <message>" on stderr, then end_job (NULL: this process
// only). Never returns; the alarm armed first ends the process if end_job blocks.
void watchdog_abort_job(const char* message, void (*end_job)(void)) LLMC_NORETURN;

// Polls done(ctx) until it returns 1 (the schedule above); past timeout_s (<= 0: never) of
// this process's running time ends the job, naming what describe(ctx, buf, n) says was
// waited for. done() is called once before the clock starts, so a completed wait costs one call.
void watchdog_poll_until(int (*done)(void* ctx), void* ctx, double timeout_s,
                      const char* (*describe)(void* ctx, char* buf, size_t n), void (*end_job)(void));

// ----------------------------------------------------------------------------
// The watchdog thread, for calls that block

#define WATCHDOG_THREAD_TICK_US 50000

typedef struct {
    pthread_mutex_t lock;
    int started, armed;
    char what[PATH_MAX_LEN + 128];
    WatchdogClock clock;  // the armed call's running time
    double timeout_s;
    void (*end_job)(void);
} WatchdogThread;

// Until watchdog_disarm, a blocking call named `what` has timeout_s (<= 0: no deadline).
void watchdog_arm(const char* what, double timeout_s, void (*end_job)(void));

void watchdog_disarm(void);

#ifdef __cplusplus
}
#endif
#endif
