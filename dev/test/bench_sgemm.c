/*
 * OpenBLAS sgemm speed on the GPT-2 124M MLP's shape (make bench runs it; not a test):
 * out[512, 3072] = inp[512, 768] @ W[3072, 768]^T, the call matmul_forward makes for the
 * fc layer at B*T = 512. It goes through run/blas_cores.h like the trainers, so without
 * OPENBLAS_CORETYPE it measures the kernels a user of the trainers gets.
 *
 *   ./bench_sgemm [SECONDS]     prints: sgemm_gflops <GFLOP/s> core <OpenBLAS core name>
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "run/blas_cores.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char** argv) {
    blas_pick_kernels(argv);
    double budget = argc > 1 ? atof(argv[1]) : 1.0;
    const int M = 512, N = 3072, K = 768;
    float* a = (float*)malloc(sizeof(float) * M * K);
    float* w = (float*)malloc(sizeof(float) * N * K);
    float* out = (float*)malloc(sizeof(float) * M * N);
    if (!a || !w || !out) fatal("out of memory");
    for (int i = 0; i < M * K; i++) a[i] = (float)(i % 17) / 17.0f - 0.5f;
    for (int i = 0; i < N * K; i++) w[i] = (float)(i % 13) / 13.0f - 0.5f;
    // One untimed call: OpenBLAS allocates its buffers (and threads) on the first.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, w, K, 0.0f, out, N);
    int calls = 0;
    double t0 = now_s(), t = t0;
    while (calls < 3 || t - t0 < budget) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, w, K, 0.0f, out, N);
        calls++;
        t = now_s();
    }
    printf("sgemm_gflops %.1f core %s\n", 2.0 * M * N * K * calls / (t - t0) / 1e9, openblas_get_corename());
    free(a);
    free(w);
    free(out);
    return 0;
}
