/*
 * The host/library boundary (docs/cuda_cpu.md, "The hardware's freedoms"): memcheck at the
 * MPI boundary (cuda_cpu/mpi_check.c) and the two pageable-copy switches, on probes whose
 * answers follow from the documents, not from the layer:
 *   - MPI reads and writes its buffers on the host (the MPI standard; an MPI that is not
 *     CUDA-aware): under CUDA_CPU_CHECK=memcheck a device buffer handed to MPI_Allreduce or
 *     MPI_Iallreduce ends the process (abort: exit 134) naming the call, the argument, the
 *     allocation and the caller's line; host and pinned buffers pass, and without memcheck
 *     the device buffer goes through (the leniency the check removes);
 *   - CUDA Runtime API, "API synchronization behavior": a copy between device and pageable
 *     memory "might be synchronous", and the driver "may synchronize with the stream" to
 *     stage pageable memory. Default: cudaMemcpyAsync to pageable memory returns when the copy
 *     has landed, and one from pageable memory stages its source without waiting.
 *     CUDA_CPU_PAGEABLE_D2H=async: it returns before the copy lands (the destination keeps its
 *     value until the stream reaches the copy; the blocking cudaMemcpy still returns when done).
 *     CUDA_CPU_PAGEABLE_H2D=stream: it returns only after the stream's earlier work.
 * The stream is held by a host function (cudaLaunchHostFunc) that waits for a flag: what a
 * copy queued behind it did before returning is then certain, not a race.
 *
 *   test_boundary        every check: each case is a child process with its settings
 *   test_boundary CASE   one case alone (MPI as a singleton, without mpirun)
 * Prints TAP (tests/tap.h).
 */
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "cuda_cpu/tests/layer_test.h"

__global__ void set_value(float* p, float v) { p[threadIdx.x] = v; }

// ---- MPI cases ----------------------------------------------------------------------------------
// volatile: not a tail call, so that the caller's line is this function's.
static const int kAllreduceLine = __LINE__ + 2;
__attribute__((noinline)) static int allreduce(const float* send, float* recv, int n) {
    volatile int rc = MPI_Allreduce(send, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return rc;
}
static const int kIallreduceLine = __LINE__ + 3;
__attribute__((noinline)) static int iallreduce_in_place(float* buf, int n) {
    MPI_Request r;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    return rc == MPI_SUCCESS ? MPI_Wait(&r, MPI_STATUS_IGNORE) : rc;
}

static int mpi_case(const char* name) {
    MPI_Init(NULL, NULL);
    float *d, *pinned, host[16];
    cudaMalloc(&d, 64);
    cudaMallocHost(&pinned, 64);
    set_value<<<1, 16>>>(d, 3.0f);
    cudaDeviceSynchronize();
    for (int i = 0; i < 16; i++) host[i] = pinned[i] = (float)i;
    int rc = 0;
    if (strcmp(name, "mpi_device_send") == 0) rc = allreduce(d, host, 16);
    else if (strcmp(name, "mpi_device_in_place") == 0) rc = iallreduce_in_place(d + 4, 12);
    else if (strcmp(name, "mpi_host") == 0) {
        // One rank: a sum over one rank is each value itself.
        float out[16];
        rc = allreduce(host, out, 16) || allreduce(pinned, pinned, 0) || iallreduce_in_place(pinned, 16);
        for (int i = 0; i < 16; i++) rc |= out[i] != (float)i || pinned[i] != (float)i;
    } else {
        fprintf(stderr, "unknown case %s\n", name);
        return 2;
    }
    fprintf(stderr, "mpi rc=%d\n", rc);
    MPI_Finalize();
    return rc == 0 ? 0 : 3;
}

// ---- pageable copies ----------------------------------------------------------------------------
// The stream's blocker: waits until released (or 10 s, so that a wrong answer cannot hang).
static std::atomic<int> released{0}, blocker_done{0};
static void CUDART_CB blocker(void*) {
    for (int i = 0; i < 10000 && !released.load(); i++) usleep(1000);
    blocker_done = 1;
}

static int copy_case(const char* name) {
    cudaStream_t s;
    cudaStreamCreate(&s);
    float* d;
    cudaMalloc(&d, sizeof(float));
    set_value<<<1, 1, 0, s>>>(d, 42.0f);
    cudaStreamSynchronize(s);
    float h = 7.0f, pinned_src = 0;
    int ok = 1;
    cudaLaunchHostFunc(s, blocker, NULL);
    // NAME_released: another thread releases the blocker after 50 ms (a copy that waits for it).
    std::thread releaser;
    if (strstr(name, "_released")) releaser = std::thread([] { usleep(50000); released = 1; });
    if (strncmp(name, "d2h", 3) == 0) {
        cudaMemcpyAsync(&h, d, sizeof(float), cudaMemcpyDeviceToHost, s);
        fprintf(stderr, "at return: %g, blocker done %d\n", h, blocker_done.load());
        released = 1;
        if (releaser.joinable()) releaser.join();
        cudaStreamSynchronize(s);
        fprintf(stderr, "after the sync: %g\n", h);
        float again = 0;
        cudaMemcpy(&again, d, sizeof(float), cudaMemcpyDeviceToHost);  // the blocking call, either way
        ok = h == 42.0f && again == 42.0f;
    } else if (strncmp(name, "h2d", 3) == 0) {
        cudaMemcpyAsync(d, &h, sizeof(float), cudaMemcpyHostToDevice, s);
        fprintf(stderr, "at return: blocker done %d\n", blocker_done.load());
        h = 8.0f;  // staged at the call: the device gets 7
        released = 1;
        if (releaser.joinable()) releaser.join();
        cudaMemcpyAsync(&pinned_src, d, sizeof(float), cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        fprintf(stderr, "on the device: %g\n", pinned_src);
        ok = pinned_src == 7.0f;
    } else {
        fprintf(stderr, "unknown case %s\n", name);
        return 2;
    }
    cudaError_t e = cudaDeviceSynchronize();
    fprintf(stderr, "sync=%s\n", cudaGetErrorName(e));
    return ok && e == cudaSuccess ? 0 : 3;
}

// ---- the checks ---------------------------------------------------------------------------------
static const char* at_line(int line) {
    static char buf[4][64];
    static int next;
    char* b = buf[next++ % 4];
    snprintf(b, 64, "test_boundary.cu:%d (", line);
    return b;
}

int main(int argc, char** argv) {
    if (argc > 1) return strncmp(argv[1], "mpi_", 4) == 0 ? mpi_case(argv[1]) : copy_case(argv[1]);
    const char* self = argv[0];
    const char* mc = "CUDA_CPU_CHECK=memcheck";
    // Open MPI's singleton refuses root without this (the suite's mpirun passes --allow-run-as-root).
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);

    const char* send[] = {"error: cuda_cpu: memcheck: MPI_Allreduce's sendbuf (64 bytes) is device memory, byte 0 of "
                          "a device allocation of 64 bytes (cudaMalloc'd at",
                          at_line(kAllreduceLine), "(allreduce)", NULL};
    expect(self, "mpi_device_send", mc, 134, send,
           "memcheck: a device sendbuf to MPI_Allreduce: the call, the argument, the allocation, the line; abort");
    const char* clean[] = {"mpi rc=0", NULL};
    expect(self, "mpi_device_send", NULL, 0, clean, "  ... which the layer alone lets through (MPI reads it on the host)");
    const char* in_place[] = {"memcheck: MPI_Iallreduce's recvbuf (48 bytes) is device memory, byte 16 of a device "
                              "allocation of 64 bytes",
                              at_line(kIallreduceLine), NULL};
    expect(self, "mpi_device_in_place", mc, 134, in_place,
           "memcheck: a device recvbuf 16 bytes into an allocation, MPI_IN_PLACE (not a buffer) beside it");
    expect(self, "mpi_host", mc, 0, clean, "memcheck: host and pinned buffers pass, and sum as one rank's values");

    // The pageable copies, with streams run by their workers (async) and only when waited for (lazy).
    const char* execs[] = {"async", "lazy"};
    for (const char* exec : execs) {
        setenv("CUDA_CPU_EXEC", exec, 1);
        char what[160];
        const char* d2h_sync[] = {"at return: 42, blocker done 1", "after the sync: 42", "sync=cudaSuccess", NULL};
        snprintf(what, sizeof(what), "exec=%s: default: cudaMemcpyAsync to pageable memory returns once it landed", exec);
        expect(self, "d2h_released", "CUDA_CPU_PAGEABLE_D2H=sync", 0, d2h_sync, what);
        const char* d2h_async[] = {"at return: 7, blocker done 0", "after the sync: 42", "sync=cudaSuccess", NULL};
        snprintf(what, sizeof(what),
                 "exec=%s: PAGEABLE_D2H=async: it returns before the copy lands, which lands at the stream's turn", exec);
        expect(self, "d2h", "CUDA_CPU_PAGEABLE_D2H=async", 0, d2h_async, what);
        const char* h2d_staged[] = {"at return: blocker done 0", "on the device: 7", "sync=cudaSuccess", NULL};
        snprintf(what, sizeof(what), "exec=%s: default: a pageable H2D copy is staged without waiting for its stream",
                 exec);
        expect(self, "h2d", NULL, 0, h2d_staged, what);
        const char* h2d_stream[] = {"at return: blocker done 1", "on the device: 7", "sync=cudaSuccess", NULL};
        snprintf(what, sizeof(what), "exec=%s: PAGEABLE_H2D=stream: it returns after the stream's earlier work", exec);
        expect(self, "h2d_released", "CUDA_CPU_PAGEABLE_H2D=stream", 0, h2d_stream, what);
    }
    const char* bad[] = {"error: cuda_cpu: CUDA_CPU_PAGEABLE_D2H=later: use one of sync async", NULL};
    expect(self, "d2h", "CUDA_CPU_PAGEABLE_D2H=later", 1, bad, "an unknown CUDA_CPU_PAGEABLE_D2H value: refused");
    return done_testing();
}
