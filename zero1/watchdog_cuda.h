/*
 * zero1/watchdog_cuda.h: run/watchdog.h's deadline where a GPU trainer's host waits.
 *
 * On a GPU nothing in the step blocks the host until it reads what it prints (the loss and
 * the grad norm, one sync per step): zero1's wait() only makes the compute stream wait on
 * an NCCL event. So a peer that stopped or lost its network shows as that one sync never
 * returning, with NCCL kernels spinning on the GPU. zero1_cuda_sync_deadline replaces the
 * cudaStreamSynchronize there: it polls cudaStreamQuery (watchdog_poll_until's schedule) and,
 * each time, asks the NCCL communicators for an asynchronous error (NCCL notices a dead
 * peer's socket before any deadline). On an error or past the deadline it prints which,
 * aborts the communicators (ncclCommAbort: their kernels would otherwise spin forever and
 * keep the process from exiting), then ends the job (watchdog_abort_job). ncclCommAbort may
 * itself block, behind a kernel that never ends (it frees device memory, which waits for the
 * device): the aborts run on a thread of their own, and past ZERO1_CUDA_ABORT_WAIT_S the job
 * ends without them (one note says so; watchdog_abort_job's alarm is the last resort).
 *
 * Communicators: raw ncclComm_t (the replicated trainer's), and every zero1 communicator of
 * the step, whatever its backend or wrapper: each gets progress() at every poll (NCCL's
 * reports an asynchronous error, ending the process with its own error line) and abort()
 * at the end (NCCL's is ncclCommAbort; where the host's waits block it does nothing).
 *
 * Tested without a GPU (dev/test/test_watchdog_cuda.cu); never run on a GPU yet.
 */
#ifndef ZERO1_WATCHDOG_CUDA_H
#define ZERO1_WATCHDOG_CUDA_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>

#include "run/files.h"
#include "run/watchdog.h"
#include "zero1/comm.h"

typedef struct {
    double timeout_s;               // --comm-timeout; 0: wait forever (errors still end the job)
    Zero1Comm* const* zero1_comms;  // zero1 communicators (zero1/comm.h), any backend
    int num_zero1_comms;
    const ncclComm_t* nccl_comms;   // raw NCCL communicators (NULL entries are skipped)
    int num_nccl_comms;
    void (*end_job)(void);          // after the communicators are aborted: MPI_Abort, or NULL
} Zero1CudaWatch;

// How long the job's end waits for the communicators' aborts (below WATCHDOG_ABORT_GRACE_S,
// whose alarm would end the process first).
#define ZERO1_CUDA_ABORT_WAIT_S 2.0

// The watch whose job is ending: watchdog_abort_job's end_job takes no argument.
static const Zero1CudaWatch* zero1_cuda_ending_watch_ = NULL;
static pthread_mutex_t zero1_cuda_abort_lock_ = PTHREAD_MUTEX_INITIALIZER;
static int zero1_cuda_aborts_returned_ = 0;

static void* zero1_cuda_abort_all_(void* arg) {
    const Zero1CudaWatch* w = (const Zero1CudaWatch*)arg;
    for (int i = 0; i < w->num_zero1_comms; i++) zero1_comm_abort(w->zero1_comms[i]);
    for (int i = 0; i < w->num_nccl_comms; i++) {
        if (w->nccl_comms[i]) ncclCommAbort(w->nccl_comms[i]);
    }
    pthread_mutex_lock(&zero1_cuda_abort_lock_);
    zero1_cuda_aborts_returned_ = 1;
    pthread_mutex_unlock(&zero1_cuda_abort_lock_);
    return NULL;
}

// Whether every abort of the ending job has returned: an end_job that would use a
// communicator must not while its abort still runs.
static inline int zero1_cuda_aborts_returned(void) {
    pthread_mutex_lock(&zero1_cuda_abort_lock_);
    int done = zero1_cuda_aborts_returned_;
    pthread_mutex_unlock(&zero1_cuda_abort_lock_);
    return done;
}

static void zero1_cuda_end_job_(void) {
    const Zero1CudaWatch* w = zero1_cuda_ending_watch_;
    pthread_t aborter;
    if (pthread_create(&aborter, NULL, zero1_cuda_abort_all_, (void*)w) != 0) {
        zero1_cuda_abort_all_((void*)w);  // no thread to spare: here (the alarm covers a block)
    } else {
        pthread_detach(aborter);
        double t0 = watchdog_monotonic_s();
        while (!zero1_cuda_aborts_returned() && watchdog_monotonic_s() - t0 < ZERO1_CUDA_ABORT_WAIT_S) {
            watchdog_sleep_us(10000);
        }
        if (!zero1_cuda_aborts_returned()) {
            fprintf(stderr, "note: [rank %d] ncclCommAbort has not returned after %g s (it waits for work on the GPU "
                    "that does not end); ending the job without it\n", utils_rank(), ZERO1_CUDA_ABORT_WAIT_S);
            fflush(stderr);
        }
    }
    if (w->end_job) w->end_job();
}

typedef struct {
    cudaStream_t stream;
    const Zero1CudaWatch* watch;
    const char* what;
    int step;
} Zero1CudaPending;

// An asynchronous NCCL error ends the job at once, naming it.
static inline void zero1_cuda_check_nccl_(const Zero1CudaPending* p) {
    const Zero1CudaWatch* w = p->watch;
    for (int i = 0; i < w->num_zero1_comms; i++) zero1_comm_progress(w->zero1_comms[i]);
    for (int i = 0; i < w->num_nccl_comms; i++) {
        ncclResult_t async_error = ncclSuccess;
        if (!w->nccl_comms[i] || ncclCommGetAsyncError(w->nccl_comms[i], &async_error) != ncclSuccess) continue;
        if (async_error == ncclSuccess || async_error == ncclInProgress) continue;
        char message[512];
        snprintf(message, sizeof(message), "%s at step %d: NCCL reported %s (a rank stopped or its network is gone); "
                 "aborting the job", p->what, p->step, ncclGetErrorString(async_error));
        zero1_cuda_ending_watch_ = w;
        watchdog_abort_job(message, zero1_cuda_end_job_);
    }
}

static inline int zero1_cuda_stream_done_(void* ctx) {
    const Zero1CudaPending* p = (const Zero1CudaPending*)ctx;
    zero1_cuda_check_nccl_(p);
    cudaError_t status = cudaStreamQuery(p->stream);
    // "Not ready" is an answer, yet the runtime also keeps it as the last error: clear it,
    // or the next launch check (cudaGetLastError) reports "device not ready".
    if (status == cudaErrorNotReady) {
        if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
        return 0;
    }
    cudaCheck(status);
    return 1;
}

static inline const char* zero1_cuda_describe_(void* ctx, char* buf, size_t n) {
    const Zero1CudaPending* p = (const Zero1CudaPending*)ctx;
    snprintf(buf, n, "%s at step %d", p->what, p->step);
    return buf;
}

// cudaStreamSynchronize(stream) under the watch: what = the work it waits for, for the
// message ("zero1: the GPU step (forward, backward, NCCL collectives)"); step 1-based.
static inline void zero1_cuda_sync_deadline(cudaStream_t stream, const Zero1CudaWatch* watch, const char* what,
                                            int step) {
    Zero1CudaPending p = {stream, watch, what, step};
    zero1_cuda_ending_watch_ = watch;
    watchdog_poll_until(zero1_cuda_stream_done_, &p, watch->timeout_s, zero1_cuda_describe_, zero1_cuda_end_job_);
}

#endif
