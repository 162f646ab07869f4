/*
 * Speed of the CPU execution layer for CUDA (make -C cuda_cpu bench; the project's make
 * bench runs it; not a test): device threads per second for three kinds of kernel, each
 * timed over a few launches after a warm-up, and each kernel's time per thread against the
 * elementwise loop in plain C on the host, per element (the cost of emulating the GPU's
 * threads, as a ratio measured in this one run; blocks run on the block workers the layer
 * chooses, CUDA_CPU_BLOCK_WORKERS).
 *   elementwise  y = a x + b, one element per thread, no waits (blocks of 256)
 *   barriers     16 rounds of write shared / __syncthreads / read a neighbour (blocks of 256)
 *   shuffles     8 warp sums of 5 __shfl_xor_sync each (blocks of 256)
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

__global__ void elementwise(float* y, const float* x, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

__global__ void barriers(float* y, const float* x, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int r = 0; r < 16; r++) {
        s[threadIdx.x] = v;
        __syncthreads();
        v += s[(threadIdx.x + 1) % blockDim.x];
        __syncthreads();
    }
    if (i < n) y[i] = v;
}

__global__ void shuffles(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f, acc = 0.0f;
    for (int r = 0; r < 8; r++) {
        float w = v + r;
        for (int off = 16; off > 0; off >>= 1) w += __shfl_xor_sync(0xffffffffu, w, off);
        acc += w;
    }
    if (i < n) y[i] = acc;
}

// Seconds per launch of the kernel `which` over n threads (median of `reps`).
static double time_kernel(int which, float* y, const float* x, int n, int reps) {
    double best[16];
    for (int r = 0; r <= reps; r++) {
        double t0 = now_s();
        if (which == 0) elementwise<<<(n + 255) / 256, 256>>>(y, x, 2.0f, 1.0f, n);
        else if (which == 1) barriers<<<(n + 255) / 256, 256>>>(y, x, n);
        else shuffles<<<(n + 255) / 256, 256>>>(y, x, n);
        cudaDeviceSynchronize();
        if (r > 0) best[r - 1] = now_s() - t0;  // launch 0 warms up
    }
    for (int i = 0; i < reps; i++)
        for (int j = i + 1; j < reps; j++)
            if (best[j] < best[i]) { double t = best[i]; best[i] = best[j]; best[j] = t; }
    return best[reps / 2];
}

int main(int argc, char** argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1 << 21, reps = 5;
    float *x, *y;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&y, n * sizeof(float));
    cudaMemset(x, 0, n * sizeof(float));
    const char* names[] = {"elementwise", "barriers (32 per thread)", "shuffles (40 per thread)"};
    double per_thread[3], seconds[3];
    int threads[3];
    for (int k = 0; k < 3; k++) {
        threads[k] = k == 0 ? n : n / 8;  // the waiting kernels do far more per thread
        seconds[k] = time_kernel(k, y, x, threads[k], reps);
        per_thread[k] = seconds[k] / threads[k];
    }
    // The same elementwise work as a plain host loop, side by side.
    float* hx = (float*)calloc(n, sizeof(float));
    float* hy = (float*)calloc(n, sizeof(float));
    double t_host[20];  // the fastest of 20 (a loop of a quarter millisecond: any interruption shows)
    for (int r = 0; r < 20; r++) {
        double t0 = now_s();
        for (int i = 0; i < n; i++) hy[i] = 2.0f * hx[i] + 1.0f;
        __asm__ __volatile__("" : : "r"(hy) : "memory");
        t_host[r] = now_s() - t0;
    }
    double host = t_host[0];
    for (int r = 1; r < 20; r++) host = t_host[r] < host ? t_host[r] : host;
    for (int k = 0; k < 3; k++) {
        printf("  %-26s %12.0f threads/s  (%d threads, median of %d launches), %8.1f x the host loop's time per element\n",
               names[k], threads[k] / seconds[k], threads[k], reps, per_thread[k] * n / host);
    }
    printf("  barrier cost %.0f ns per thread and __syncthreads, shuffle %.0f ns per lane and __shfl\n",
           (per_thread[1] - per_thread[0]) / 32 * 1e9, (per_thread[2] - per_thread[0]) / 40 * 1e9);
    free(hx);
    free(hy);
    return 0;
}
