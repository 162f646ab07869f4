/*
 * Host C code for test_memcheck.cu: compiled by gcc (cuda_cpu/nvcc hands .c files to
 * the host compiler), instrumented in a CUDA_CPU_TOOLS=1 build like the .cu files, so that
 * CUDA_CPU_CHECK=memcheck sees its accesses too (zero1/'s C sources are built this way).
 */
#include <stddef.h>

// The sum of p[0..n), read on the host: a fault when p is device memory.
float memcheck_host_sum(const float* p, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += p[i];
    return s;
}
