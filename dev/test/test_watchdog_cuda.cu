/*
 * zero1/watchdog_cuda.h on a GPU (make test_gpu runs it), printing TAP (dev/test/check.h;
 * without a GPU the plan "1..0 # SKIP ..."):
 *   1. a stream whose work finishes: zero1_cuda_sync_deadline returns, and the stream is idle;
 *   2. a stream that never finishes (a kernel spinning on a flag nobody sets, as an NCCL
 *      kernel spins on a peer that stopped), in a child process: past a 1 s deadline the
 *      child prints one `error:` line naming the wait and the step, and exits 1 within a
 *      few seconds although its kernel still spins;
 *   3. the same with a deadline of 0 (none) must still be waiting after 3 s (then killed);
 *   4. a one-rank zero1 NCCL communicator inside the hazard wrapper (as the GPU suite runs
 *      it), its collective queued behind a stream that never finishes: past the deadline
 *      the watch aborts it through the wrapper's abort(), which reaches ncclCommAbort. That
 *      returns, or blocks behind the kernel that never ends (a GPU may do either; the CPU
 *      layer plays the second with CUDA_CPU_NCCL_ABORT=block): returned, the job's end
 *      issues one more collective, which the aborted communicator refuses with its own
 *      error line; blocked, the watch says so after ZERO1_CUDA_ABORT_WAIT_S and the job
 *      ends without it, the collective not issued. Either way exit 1 within a few seconds.
 *      Control: the same with the wrapper left out of the watch (what a watch that picked
 *      communicators by the name "nccl" did with "hazard(nccl)"): the collective is taken,
 *      nothing was aborted.
 * An NCCL asynchronous error cannot be provoked on one GPU; it is not tested here.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mpi.h>

#include "dev/test/check.h"
#include "llmc/cuda_common.cuh"
#include "zero1/comm_nccl.h"
#include "zero1/testing/test_doubles.h"
#include "zero1/device_cuda.h"
#include "zero1/watchdog_cuda.h"

#define EXPECT(cond, ...) tap_ok((cond), __VA_ARGS__)

__global__ void spin_until_set(volatile int* flag) {
    while (*flag == 0) {
    }
}

// Busy for about `ms` milliseconds of the GPU's clock (cudaDevAttrClockRate, kHz).
__global__ void spin_for(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

__global__ void short_work(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}

// In a child (CUDA initialised after the fork): a kernel that never ends, then the watched
// sync with `timeout_s`. stderr goes to err_path.
static void child_stuck_sync(double timeout_s, const char* err_path) {
    if (!freopen(err_path, "w", stderr)) _exit(3);
    int* flag;
    cudaStream_t s;
    cudaCheck(cudaMalloc(&flag, sizeof(int)));
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // On the kernel's own stream: a plain cudaMemset runs on the legacy default stream, which
    // a non-blocking stream is not ordered with, and the kernel could read the flag first.
    cudaCheck(cudaMemsetAsync(flag, 0, sizeof(int), s));
    spin_until_set<<<1, 1, 0, s>>>(flag);
    cudaCheck(cudaGetLastError());
    Zero1CudaWatch watch = {timeout_s, NULL, 0, NULL, 0, NULL};
    zero1_cuda_sync_deadline(s, &watch, "zero1: the GPU step", 7);
    _exit(0);  // reached only if the sync returned: wrong
}

// The communicator the job's end probes, and a device buffer for the probe.
static Zero1Comm* probed_comm;
static float* probe_buf;

// The watch's end_job, after it aborted what it watches: one more collective through the
// wrapper. An aborted NCCL communicator ends the process with its own error line here. While
// an abort still runs (blocked) the communicator must not be used: nothing is issued.
static void collective_after_abort(void) {
    if (!zero1_cuda_aborts_returned()) {
        fprintf(stderr, "probe: not issued, an abort has not returned\n");
        fflush(stderr);
        return;
    }
    zero1_comm_all_reduce(probed_comm, probe_buf, 16, ZERO1_FP32, ZERO1_SUM, 0);
    fprintf(stderr, "probe: the collective was taken\n");
    fflush(stderr);  // the job's end leaves by _exit
}

// In a child: hazard(nccl) over one rank, an all-reduce queued behind a kernel that never
// ends and waited for (the compute stream waits on it, as in a step), then the watched sync
// with a 1 s deadline; the wrapper is in the watch when `watched`.
static void child_stuck_hazard_nccl(int watched, const char* err_path) {
    if (!freopen(err_path, "w", stderr)) _exit(3);
    MPI_Init(NULL, NULL);
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Zero1Device dev = zero1_device_cuda_create(s);
    Zero1Comm* c = zero1_comm_hazard_create(zero1_comm_nccl_create(&dev, -1), &dev, 1);
    int* flag;
    float* buf;
    cudaCheck(cudaMalloc(&flag, sizeof(int)));
    cudaCheck(cudaMalloc(&buf, 16 * sizeof(float)));
    cudaCheck(cudaMalloc(&probe_buf, 16 * sizeof(float)));
    cudaCheck(cudaMemsetAsync(flag, 0, sizeof(int), s));
    spin_until_set<<<1, 1, 0, s>>>(flag);
    cudaCheck(cudaGetLastError());
    zero1_comm_wait(c, zero1_comm_all_reduce(c, buf, 16, ZERO1_FP32, ZERO1_SUM, 0));
    probed_comm = c;
    Zero1CudaWatch watch = {1.0, &c, watched ? 1 : 0, NULL, 0, collective_after_abort};
    zero1_cuda_sync_deadline(s, &watch, "zero1: the GPU step", 3);
    _exit(0);  // reached only if the sync returned: wrong
}

// Runs child_stuck_sync (hazard < 0) or child_stuck_hazard_nccl(hazard) in a child; returns
// its wait status, -1 if still running after wait_s (it is then killed), and the seconds it took.
static int run_child(double timeout_s, int hazard, double wait_s, const char* err_path, double* secs) {
    double t0 = watchdog_monotonic_s();
    fflush(stdout);  // a child that exits through exit() must not print the parent's lines again
    pid_t pid = fork();
    if (pid == 0 && hazard >= 0) child_stuck_hazard_nccl(hazard, err_path);
    if (pid == 0) child_stuck_sync(timeout_s, err_path);
    int status = -1;
    while (watchdog_monotonic_s() - t0 < wait_s) {
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        status = -1;
        watchdog_sleep_us(50000);
    }
    *secs = watchdog_monotonic_s() - t0;
    if (status == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return status;
}

static void show_file(const char* path) {
    FILE* f = fopen(path, "r");
    char line[1024];
    while (f && fgets(line, sizeof(line), f)) printf("    | %s", line);
    if (f) fclose(f);
}

static int file_count(const char* path, const char* needle) {
    FILE* f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), f)) n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

int main(void) {
    // Ask for devices in a child first: the parent must not initialise CUDA before forking.
    pid_t probe = fork();
    if (probe == 0) {
        int count = 0;
        _exit(cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? 0 : 1);
    }
    int probe_status;
    waitpid(probe, &probe_status, 0);
    if (!WIFEXITED(probe_status) || WEXITSTATUS(probe_status) != 0) {
        tap_skip_all("test_watchdog_cuda: no CUDA device");
        return 0;
    }
    char err_path[] = "/tmp/test_watchdog_cuda.XXXXXX";
    int fd = mkstemp(err_path);
    if (fd < 0) fatal("cannot create a temporary file");
    close(fd);

    double secs;
    int status = run_child(1.0, -1, 30.0, err_path, &secs);
    int lines = file_count(err_path, "error: [rank 0] zero1: the GPU step at step 7 did not complete within 1 s");
    EXPECT(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 1 && secs < 10.0,
           "stuck stream, 1 s deadline: the process ended with exit 1 after %.1f s", secs);
    EXPECT(lines == 1 && file_count(err_path, "error:") == 1, "one error line naming the wait (%d found)", lines);

    status = run_child(0.0, -1, 3.0, err_path, &secs);
    EXPECT(status == -1, "stuck stream, no deadline: still waiting after %.1f s", secs);

    const char* late = "error: [rank 0] zero1: the GPU step at step 3 did not complete within 1 s";
    const char* refused = "zero1 nccl: all-reduce after the communicator was aborted";
    const char* blocked = "ncclCommAbort has not returned after";
    status = run_child(1.0, 1, 60.0, err_path, &secs);
    int returned = file_count(err_path, refused) == 1 && file_count(err_path, "probe:") == 0 &&
                   file_count(err_path, blocked) == 0;
    int stuck = file_count(err_path, blocked) == 1 && file_count(err_path, "probe: not issued") == 1 &&
                file_count(err_path, "probe:") == 1 && file_count(err_path, refused) == 0;
    EXPECT(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 1 && file_count(err_path, late) == 1 &&
               (returned || stuck) && secs < 1.0 + ZERO1_CUDA_ABORT_WAIT_S + 5.0,
           "hazard(nccl) stuck past the deadline: aborted through the wrapper, the abort %s (exit %d after %.1f s)",
           returned ? "returned (its communicator then refused the probe)"
                    : stuck ? "blocked (the job ended without it)" : "did neither",
           status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, secs);
    status = run_child(1.0, 0, 60.0, err_path, &secs);
    EXPECT(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 1 && file_count(err_path, late) == 1 &&
               file_count(err_path, refused) == 0 && file_count(err_path, "probe: the collective was taken") == 1,
           "control, the wrapper not watched: not aborted, the probe's collective was taken (exit %d after %.1f s)",
           status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, secs);
    if (tap_failed) show_file(err_path);
    unlink(err_path);

    // In this process: finished work returns at once.
    float* x;
    cudaStream_t s;
    cudaCheck(cudaMalloc(&x, 1024 * sizeof(float)));
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaCheck(cudaMemsetAsync(x, 0, 1024 * sizeof(float), s));
    short_work<<<4, 256, 0, s>>>(x, 1024);
    cudaCheck(cudaGetLastError());
    Zero1CudaWatch watch = {5.0, NULL, 0, NULL, 0, NULL};
    double t0 = watchdog_monotonic_s();
    zero1_cuda_sync_deadline(s, &watch, "zero1: the GPU step", 1);
    double took = watchdog_monotonic_s() - t0;
    float host[1024];
    cudaCheck(cudaMemcpy(host, x, sizeof(host), cudaMemcpyDeviceToHost));
    EXPECT(cudaStreamQuery(s) == cudaSuccess && host[1023] == 1.0f && took < 1.0,
           "finished work: the watched sync returned after %.4f s with the result in place", took);

    // Work that is still running when the sync starts: its polls see "not ready", which the
    // runtime also keeps as the last error; the sync must not leave that for the next launch check.
    int clock_khz = 0;
    cudaCheck(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    spin_for<<<1, 1, 0, s>>>((long long)clock_khz * 200);  // 200 ms
    cudaCheck(cudaGetLastError());
    zero1_cuda_sync_deadline(s, &watch, "zero1: the GPU step", 2);
    cudaError_t left = cudaGetLastError();
    EXPECT(left == cudaSuccess, "a sync that waited leaves no error behind for the next launch check (%s)",
           cudaGetErrorName(left));
    cudaCheck(cudaStreamDestroy(s));
    cudaCheck(cudaFree(x));
    return done_testing();
}
