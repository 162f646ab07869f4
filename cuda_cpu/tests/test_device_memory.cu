/*
 * The emulated GPU's memory as its driver counts it (cuda_cpu/device_memory.cpp) against
 * figures worked out by hand: make -C cuda_cpu tests.
 *   test_device_memory        every case, each in a child process with its own settings
 *   test_device_memory CASE   one case alone (prints PASS/FAIL lines on stderr)
 * The figures (docs/cuda_cpu.md, "Device memory"): an H200's totalGlobalMem is 143,771 MiB,
 * an H100's 81,559 MiB; the context takes 400 MiB at its first use; cudaMalloc from 2 MiB
 * up takes its size rounded up to 2 MiB, smaller ones are packed at 256 bytes into 2 MiB
 * chunks; a cuBLAS handle's default workspace is 32 MiB, or CUBLAS_WORKSPACE_CONFIG's sum
 * (":SIZE_KiB:COUNT" pairs); processes of one job that share a GPU share its count, and a
 * process that ended holds nothing. Prints TAP (tests/tap.h).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_cpu/tests/layer_test.h"

static const size_t MiB = (size_t)1 << 20;
static int failures = 0;

// In a case's process: one PASS or FAIL line on stderr, which the parent turns into TAP.
static void report(int pass, const char* what) {
    fprintf(stderr, "%s %s\n", pass ? "PASS" : "FAIL", what);
    failures += !pass;
}

static size_t free_now(void) {
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    return free_b;
}

// H200 defaults: the cap, the context, the granularity, cuBLAS's workspace.
static void case_counts(void) {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    report(p.totalGlobalMem == 143771 * MiB && total == 143771 * MiB, "H200: totalGlobalMem = cudaMemGetInfo's total = 143771 MiB");
    report(free_b == total - 400 * MiB, "the context takes 400 MiB");
    void *a, *b, *c, *d, *e;
    cudaMalloc(&a, 1);
    report(free_now() == free_b - 2 * MiB, "cudaMalloc(1): one 2 MiB chunk for small allocations");
    cudaMalloc(&b, 1);
    cudaMalloc(&c, 2 * MiB - 512);
    report(free_now() == free_b - 2 * MiB, "cudaMalloc(1) and (2 MiB - 512) more: packed in the same chunk (256 + 256 + 2 MiB - 512)");
    cudaMalloc(&d, 1);
    report(free_now() == free_b - 4 * MiB, "one more byte: a second chunk");
    cudaFree(c);
    report(free_now() == free_b - 2 * MiB, "cudaFree(2 MiB - 512): 768 bytes left, one chunk");
    cudaMalloc(&e, 2 * MiB + 1);
    report(free_now() == free_b - 6 * MiB, "cudaMalloc(2 MiB + 1) takes 4 MiB");
    cudaFree(e);
    report(free_now() == free_b - 2 * MiB, "... and cudaFree gives them back");
    cublasHandle_t h;
    cublasCreate(&h);
    report(free_now() == free_b - 34 * MiB, "cublasCreate: its 32 MiB default workspace");
    cublasDestroy(h);
    report(free_now() == free_b - 2 * MiB, "cublasDestroy gives it back");
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
    report(free_now() == free_b, "all freed: the context alone");
}

// CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8: 2 x 4 MiB + 8 x 16 KiB = 8.125 MiB, 10 MiB in 2 MiB units.
static void case_workspace_config(void) {
    size_t before = free_now();
    cublasHandle_t h;
    cublasCreate(&h);
    report(before - free_now() == 10 * MiB, "CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8: the handle takes 10 MiB");
    cublasDestroy(h);
}

// CUDA_CPU_GPU=H100: its 81,559 MiB bound every allocation (the layer once capped at the H200's).
static void case_h100(void) {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    report(p.totalGlobalMem == 81559 * MiB && total == 81559 * MiB, "H100: totalGlobalMem = cudaMemGetInfo's total = 81559 MiB");
    void* p_big = NULL;
    cudaError_t err = cudaMalloc(&p_big, free_b + 1);
    report(err == cudaErrorMemoryAllocation && p_big == NULL, "H100: cudaMalloc of one byte more than is free: cudaErrorMemoryAllocation");
    (void)cudaGetLastError();
}

// CUDA_CPU_MEMORY_MIB=404: 4 MiB beside the context; full, a byte more is refused.
static void case_full(void) {
    report(free_now() == 4 * MiB, "CUDA_CPU_MEMORY_MIB=404: 4 MiB free beside the context");
    void *a, *b;
    report(cudaMalloc(&a, 4 * MiB) == cudaSuccess && free_now() == 0, "cudaMalloc(4 MiB) takes them all");
    report(cudaMalloc(&b, 1) == cudaErrorMemoryAllocation, "then cudaMalloc(1) needs a chunk: cudaErrorMemoryAllocation");
    (void)cudaGetLastError();
    cudaFree(a);
    report(cudaMalloc(&b, 1) == cudaSuccess, "after cudaFree it fits");
}

// CUDA_CPU_SHARED_GPU=1: a peer of this job sees this process's 400 + 100 MiB, then ends
// holding 50 MiB without its exit handlers (as a killed rank); a process of another job
// (another PMIX_NAMESPACE) has a GPU of its own.
static void case_shared(const char* self) {
    void* mine;
    cudaMalloc(&mine, 100 * MiB);
    size_t total = 143771 * MiB;
    report(free_now() == total - 500 * MiB, "shared: this process holds 400 + 100 MiB");
    char err[4096];
    int rc = run_case(self, "shared_peer", NULL, err, sizeof(err));
    fputs(err, stderr);
    report(rc == 0, "shared: the peer ran");
    report(free_now() == total - 500 * MiB, "shared: the peer ended; what it held is free again");
    setenv("PMIX_NAMESPACE", "another-job", 1);  // for the child: this process's GPU is open already
    rc = run_case(self, "shared_peer", NULL, err, sizeof(err));
    fputs(err, stderr);
    report(rc == 0, "another job's process ran");
    cudaFree(mine);
}

static int case_shared_peer(void) {
    size_t total = 143771 * MiB;
    const char* ns = getenv("PMIX_NAMESPACE");
    if (ns && strcmp(ns, "another-job") == 0) {
        report(free_now() == total - 400 * MiB, "another job: a GPU of its own (its context alone)");
        return 0;
    }
    report(free_now() == total - 900 * MiB, "shared peer: 400 MiB of its own and the other process's 500 MiB taken");
    void* p;
    cudaMalloc(&p, 50 * MiB);
    report(free_now() == total - 950 * MiB, "shared peer: its 50 MiB counted");
    fflush(stderr);
    _exit(0);  // no exit handlers: its slot is freed by the others, who find it gone
}

int main(int argc, char** argv) {
    if (argc > 1) {
        if (strcmp(argv[1], "counts") == 0) case_counts();
        else if (strcmp(argv[1], "workspace_config") == 0) case_workspace_config();
        else if (strcmp(argv[1], "h100") == 0) case_h100();
        else if (strcmp(argv[1], "full") == 0) case_full();
        else if (strcmp(argv[1], "shared") == 0) case_shared(argv[0]);
        else if (strcmp(argv[1], "shared_peer") == 0) return case_shared_peer();
        else return 2;
        return failures ? 1 : 0;
    }
    // The cases' settings alone: none of the caller's.
    const char* settings[] = {"CUDA_CPU_GPU", "CUDA_CPU_MEMORY_MIB", "CUDA_CPU_CONTEXT_MIB", "CUDA_CPU_SHARED_GPU",
                              "CUDA_CPU_DEVICES", "CUBLAS_WORKSPACE_CONFIG"};
    for (const char* s : settings) unsetenv(s);
    char job[64];
    snprintf(job, sizeof(job), "test_device_memory.%d", (int)getpid());
    setenv("PMIX_NAMESPACE", job, 1);
    const struct {
        const char *name, *env;
    } cases[] = {{"counts", NULL},
                 {"workspace_config", "CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8"},
                 {"h100", "CUDA_CPU_GPU=H100"},
                 {"full", "CUDA_CPU_MEMORY_MIB=404"},
                 {"shared", "CUDA_CPU_SHARED_GPU=1"}};
    for (const auto& c : cases) {
        char err[8192];
        int rc = run_case(argv[0], c.name, c.env, err, sizeof(err));
        int lines = 0;
        for (char* line = strtok(err, "\n"); line; line = strtok(NULL, "\n")) {
            if (strncmp(line, "PASS ", 5) == 0) tap_ok(1, "%s: %s", c.name, line + 5), lines++;
            else if (strncmp(line, "FAIL ", 5) == 0) tap_ok(0, "%s: %s", c.name, line + 5), lines++;
            else printf("# %s: %s\n", c.name, line);
        }
        tap_ok(rc == 0 && lines > 0, "%s: the case ran (exit %d)", c.name, rc);
    }
    return done_testing();
}
