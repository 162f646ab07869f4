/*
 * The CPU execution layer's own tests (kernels, launches, memory, streams, events), as
 * CUDA source compiled like the project's: make -C cuda_cpu tests.
 *
 *   test_layer           every check; the cases that must end in a fault (a fault is
 *                        sticky, as on a GPU) or need settings of their own (parallel
 *                        blocks) run as child processes, their stderr checked
 *   test_layer CASE      one such case alone
 * Expected values are worked out by hand in the comments (the CUDA documentation's
 * definitions of each intrinsic), never taken from the layer itself. Prints TAP
 * (tests/tap.h); exits 1 on any failure.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <mma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <type_traits>
#include <vector>

#include "cuda_cpu/tests/launch_resources.cuh"
#include "cuda_cpu/tests/layer_test.h"
#include "cuda_cpu/tests/two_workers.cuh"

// ---- kernels under test ---------------------------------------------------------------------
// Each lane gets the value of lane (lane ^ 1), (lane + 3) if < 32 else its own, (lane - 2) if
// >= 0 else its own, lane 5 (shfl), and the ballot of odd lanes.
__global__ void shuffles(int* out) {
    int lane = threadIdx.x;
    out[lane] = __shfl_xor_sync(0xffffffffu, lane * 10, 1);
    out[32 + lane] = __shfl_down_sync(0xffffffffu, lane * 10, 3);
    out[64 + lane] = __shfl_up_sync(0xffffffffu, lane * 10, 2);
    out[96 + lane] = __shfl_sync(0xffffffffu, lane * 10, 5);
    out[128 + lane] = (int)__ballot_sync(0xffffffffu, lane & 1);
    out[160 + lane] = __shfl_xor_sync(0xffffffffu, lane * 10, 4, 8);  // width 8: segments of 8
    out[192 + lane] = __any_sync(0xffffffffu, lane == 31) + 2 * __all_sync(0xffffffffu, lane < 32);
}

// Sum over a block through shared memory, with (or without) the barrier between the writes
// and the reads.
__global__ void block_sum(float* out, const float* in, int with_barrier) {
    __shared__ float partial[256];
    partial[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
    if (with_barrier) __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < (int)blockDim.x; i++) s += partial[i];
        out[blockIdx.x] = s;
    }
}

__global__ void count_barrier(int* out) { out[0] = __syncthreads_count(threadIdx.x % 3 == 0); }

// Thread i of block b writes b * 1000 + i (dim3 blocks and grids, all three axes).
__global__ void coordinates(int* out) {
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

__global__ void copy_kernel(float* dst, const float* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

__global__ void dynamic_shared_kernel(int* out, int n) {
    extern __shared__ int buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int i = 0; i < n; i++) s += buf[i];
        out[0] = s;
    }
}

__global__ void big_static_shared(int* out) {
    __shared__ int big[13000];  // 52,000 bytes > 48 KiB
    big[threadIdx.x] = 1;
    out[0] = big[0];
}

__global__ void spin_ms(int ms) {
    long long start = clock64();
    while (clock64() - start < (long long)ms * 1980000) {
    }
}

// Fault cases.
__global__ void divergent_barrier(float* out) {
    if (threadIdx.x >= 32) return;  // warp 1 leaves, warp 0 waits forever on a GPU
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ void early_return_before_shuffle(float* out) {
    float v = threadIdx.x;
    if (threadIdx.x == 7) return;
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

__global__ void write_past_end(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 0.0f;  // off by one
}

// WMMA (the layer's cuda_cpu/include/mma.h): each warp of the block computes its own
// 16x16 tile D = scale * (A B + C), A and B of type T in the fragments' layouts, C loaded
// and D stored in the memory layouts given (row-major when c_row / d_row). Warp w's tiles
// start 16 leading dimensions further on (w * 16 * ld), in either layout. With double_a,
// every element of A's fragment is doubled through float before the product (elementwise
// work on x[], which CUDA allows whatever the mapping).
template <typename T, typename LA, typename LB>
__global__ void wmma_product(float* d, const T* a, const T* b, const float* c, int lda, int ldb, int ldc, int ldd,
                             int c_row, int d_row, float scale, int double_a) {
    using namespace nvcuda;
    int w = threadIdx.x / 32;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(fa, a + w * 16 * lda, lda);
    wmma::load_matrix_sync(fb, b + w * 16 * ldb, ldb);
    wmma::load_matrix_sync(acc, c + w * 16 * ldc, ldc, c_row ? wmma::mem_row_major : wmma::mem_col_major);
    if (double_a) {
        for (int i = 0; i < fa.num_elements; i++) fa.x[i] = (T)((float)fa.x[i] * 2.0f);
    }
    wmma::mma_sync(acc, fa, fb, acc);
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= scale;
    wmma::store_matrix_sync(d + w * 16 * ldd, acc, ldd, d_row ? wmma::mem_row_major : wmma::mem_col_major);
}

// D = A B from a zero-filled accumulator (fill_fragment), bf16 row-major operands, ld 16.
// bad: 1 lane 5 passes another ldm, 2 lane 7 returns first, 3 the pointer is 16 bytes
// off the 32-byte alignment; a block of 48 threads has a last warp of 16 lanes.
__global__ void wmma_misuse(float* d, const __nv_bfloat16* a, int bad) {
    using namespace nvcuda;
    int lane = threadIdx.x % 32;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    if (bad == 2 && lane == 7) return;
    wmma::load_matrix_sync(fa, a + (bad == 3 ? 8 : 0), bad == 1 && lane == 5 ? 24 : 16);
    wmma::load_matrix_sync(fb, a, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// Parallel blocks (CUDA_CPU_BLOCK_WORKERS; meet_all: two_workers.cuh). Each block of one thread fills its __shared__ array and meets the others: out[b] = 1 if
// they met + 2 if its shared array and blockIdx are still its own after (each worker has its
// own). Then it adds 1, `adds` times, to an integer and a float counter (exact below 2^24).
__global__ void blocks_meet(int* arrived, int* out, long long cycles, int adds, unsigned long long* count,
                            float* fcount) {
    __shared__ int mine[64];
    for (int i = 0; i < 64; i++) mine[i] = (int)blockIdx.x * 100 + i;
    unsigned b = blockIdx.x;
    int met = meet_all(arrived, cycles);
    int intact = blockIdx.x == b;
    for (int i = 0; i < 64; i++) intact &= mine[i] == (int)b * 100 + i;
    out[b] = met + 2 * intact;
    for (int i = 0; i < adds; i++) {
        atomicAdd(count, 1ull);
        atomicAdd(fcount, 1.0f);
    }
}

// Both blocks meet (thread 0 of each), block 1 then waits `cycles` more, and in both the
// second warp returns before a __syncthreads the first waits in: block 1 faults last.
__global__ void meet_then_divergent_barrier(int* arrived, float* out, long long cycles) {
    if (threadIdx.x == 0) meet_all(arrived, CUDA_CPU_TEST_MINUTE);
    long long start = clock64();
    while (blockIdx.x == 1 && threadIdx.x == 0 && clock64() - start < cycles) {
    }
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}

// Both blocks meet, then each writes one element past the end of `small`.
__global__ void meet_then_write_past_end(int* arrived, float* small, int n) {
    meet_all(arrived, CUDA_CPU_TEST_MINUTE);
    small[n + blockIdx.x * 16] = 1.0f;
}

// ---- helpers ------------------------------------------------------------------------------------
static int* device_ints(int n) {
    int* d;
    cudaMalloc(&d, n * sizeof(int));
    cudaMemset(d, 0, n * sizeof(int));
    return d;
}

// Eager execution finishes every operation before its call returns: nothing is ever pending.
static int eager(void) {
    const char* e = getenv("CUDA_CPU_EXEC");
    return e && strcmp(e, "eager") == 0;
}
static void check_async(int ok, const char* what) {
    if (eager()) tap_skip("CUDA_CPU_EXEC=eager: nothing is ever pending", "%s", what);
    else check(ok, what);
}

static void fetch(void* host, const void* dev, size_t bytes) { cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost); }

// ---- fault cases (child processes) ----------------------------------------------------------------
static int fault_case(const char* name) {
    float* out;
    cudaMalloc(&out, 1024 * sizeof(float));
    if (strcmp(name, "divergent_barrier") == 0) divergent_barrier<<<2, 64>>>(out);
    else if (strcmp(name, "early_return") == 0) early_return_before_shuffle<<<1, 32>>>(out);
    else if (strcmp(name, "write_past_end") == 0) {
        float* small;
        cudaMalloc(&small, 256 * sizeof(float));  // 1024 bytes: ends at the guard page
        write_past_end<<<3, 128>>>(small, 256);
    } else if (strcmp(name, "static_shared") == 0) {
        big_static_shared<<<1, 32>>>((int*)out);
    } else if (strncmp(name, "wmma_", 5) == 0) {
        __nv_bfloat16* a;
        cudaMalloc(&a, 512 * sizeof(__nv_bfloat16));
        cudaMemset(a, 0, 512 * sizeof(__nv_bfloat16));
        int bad = strcmp(name, "wmma_ldm") == 0 ? 1 : strcmp(name, "wmma_early_return") == 0 ? 2
                  : strcmp(name, "wmma_misaligned") == 0 ? 3 : 0;
        wmma_misuse<<<1, strcmp(name, "wmma_partial_warp") == 0 ? 48 : 32>>>(out, a, bad);
    } else if (strcmp(name, "host_touch") == 0) {  // CUDA_CPU_PROTECT=1
        cudaDeviceSynchronize();
        printf("read %f\n", out[0]);
        return 0;
    } else {
        fprintf(stderr, "unknown case %s\n", name);
        return 2;
    }
    cudaError_t launch = cudaGetLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    fprintf(stderr, "launch=%s sync=%s after=%s\n", cudaGetErrorName(launch), cudaGetErrorName(sync),
            cudaGetErrorName(cudaMemset(out, 0, 4)));
    return sync == cudaSuccess ? 0 : 3;
}

static void expect_fault(const char* self, const char* name, const char* env, int want_exit, const char* needle,
                         const char* what) {
    char err[4096];
    int code = run_case(self, name, env, err, sizeof(err));
    int ok = code == want_exit && strstr(err, needle) != NULL;
    check(ok, what);
    if (!ok) printf("    exit %d, stderr:\n%s\n", code, err);
}

// ---- parallel blocks (child processes: each sets its own CUDA_CPU_ORDER and
// CUDA_CPU_BLOCK_WORKERS, which the layer reads at the first launch) -----------------------------
static const long long kCyclesPerSecond = CUDA_CPU_TEST_MINUTE / 60;

static void set_env(const char* name, const char* value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

// blocks_meet<<<2, 1>>> under the case's settings: exits with out[0] + 4 * out[1], or 1 when
// an atomic add was lost (each block adds 2^20 times once they met).
static int meet_case(const char* name) {
    const char *order = "forward", *workers = NULL;
    double seconds = 0.3;  // where the blocks must run one after another: block 0's wait is short
    if (strcmp(name, "meet_two_workers") == 0) workers = "2", seconds = 60;
    else if (strcmp(name, "meet_one_worker") == 0) workers = "1";
    else if (strcmp(name, "meet_reverse") == 0) order = "reverse", workers = "2";
    else if (strcmp(name, "meet_random") == 0) order = "random", workers = "2";
    else if (strcmp(name, "meet_default") == 0) seconds = 60;
    else if (strcmp(name, "meet_one_core") == 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        sched_setaffinity(0, sizeof(one), &one);
    } else if (strcmp(name, "meet_ranks") == 0) {
        setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1024", 1);
    }
    set_env("CUDA_CPU_ORDER", order);
    set_env("CUDA_CPU_BLOCK_WORKERS", workers);
    if (strcmp(name, "meet_ranks") != 0) unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    unsetenv("MPI_LOCALNRANKS");
    int *arrived = device_ints(1), *out = device_ints(2), h[2];
    unsigned long long *count, hc = 0;
    float *fcount, hf = 0;
    cudaMalloc(&count, sizeof(*count));
    cudaMalloc(&fcount, sizeof(*fcount));
    cudaMemset(count, 0, sizeof(*count));
    cudaMemset(fcount, 0, sizeof(*fcount));
    blocks_meet<<<2, 1>>>(arrived, out, (long long)(seconds * kCyclesPerSecond), 1 << 20, count, fcount);
    fetch(h, out, sizeof(h));
    fetch(&hc, count, sizeof(hc));
    fetch(&hf, fcount, sizeof(hf));
    if (hc != 2u << 20 || hf != (float)(2 << 20)) return 1;
    return h[0] + 4 * h[1];
}

// The cases that end in a fault, with two block workers in forward order.
static int parallel_fault_case(const char* name) {
    set_env("CUDA_CPU_ORDER", "forward");
    set_env("CUDA_CPU_BLOCK_WORKERS", "2");
    float* out;
    cudaMalloc(&out, 64 * 64 * sizeof(float));
    if (strcmp(name, "first_fault_in_order") == 0) {
        meet_then_divergent_barrier<<<2, 64>>>(device_ints(1), out, kCyclesPerSecond / 10);
    } else {  // fault_in_both_workers
        float* small;
        cudaMalloc(&small, 256 * sizeof(float));  // 1024 bytes: ends at the guard page
        meet_then_write_past_end<<<2, 1>>>(device_ints(1), small, 256);
    }
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
}

static int count_of(const char* text, const char* needle) {
    int n = 0;
    for (const char* p = strstr(text, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void test_parallel_blocks(const char* self) {
    char err[4096];
    // out[0] + 4 * out[1]: 15 both blocks met, each with its shared memory and blockIdx intact
    // (3 + 4 * 3); with one worker block 0 waits alone (2) and block 1 finds it arrived (3).
    int code = run_case(self, "meet_two_workers", NULL, err, sizeof(err));
    check(code == 15, "CUDA_CPU_BLOCK_WORKERS=2: two blocks in flight at once, each with its own __shared__ and "
          "blockIdx; their 2 x 2^20 atomicAdds (integer and float) all counted");
    if (code != 15) printf("    exit %d: %s\n", code, err);
    check(run_case(self, "meet_one_worker", NULL, err, sizeof(err)) == 2 + 4 * 3,
          "CUDA_CPU_BLOCK_WORKERS=1: one block after another");
    check(run_case(self, "meet_reverse", NULL, err, sizeof(err)) == 3 + 4 * 2,
          "CUDA_CPU_ORDER=reverse: one block after another (block 1 first) whatever the workers");
    code = run_case(self, "meet_random", NULL, err, sizeof(err));
    check(code == 2 + 4 * 3 || code == 3 + 4 * 2, "CUDA_CPU_ORDER=random: one block after another whatever the workers");
    check(run_case(self, "meet_one_core", NULL, err, sizeof(err)) == 2 + 4 * 3,
          "by default, a process bound to one core: one block after another");
    cpu_set_t mask;
    sched_getaffinity(0, sizeof(mask), &mask);
    long cores = CPU_COUNT(&mask), online = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < online) {
        snprintf(err, sizeof(err), "this one is bound to %ld of %ld cores", cores, online);
        tap_skip(err, "the defaults of an unbound process");
    } else {
        check(run_case(self, "meet_ranks", NULL, err, sizeof(err)) == 2 + 4 * 3,
              "by default, 1024 ranks on this host (OMPI_COMM_WORLD_LOCAL_SIZE) share the cores: one block after another");
        if (cores < 2) tap_skip("one core", "blocks in parallel by default");
        else check(run_case(self, "meet_default", NULL, err, sizeof(err)) == 15,
                   "by default, an unbound process with 2 or more cores: blocks in parallel");
    }
    code = run_case(self, "first_fault_in_order", NULL, err, sizeof(err));
    check(code == 3 && strstr(err, "kernel meet_then_divergent_barrier (launched at ") &&
              strstr(err, "block (0,0,0): __syncthreads reached by threads 0-31, but threads 32-63 returned") &&
              count_of(err, "error: cuda_cpu:") == 1,
          "two blocks in flight fault, block 1 last: one error, naming block 0 (the first in order)");
    if (code != 3) printf("    exit %d: %s\n", code, err);
    code = run_case(self, "fault_in_both_workers", NULL, err, sizeof(err));
    check(code == 3 && strstr(err, "block (0,0,0) thread (0,0,0): address") &&
              strstr(err, "is 0 bytes past the end of an allocation of 1024 bytes") && count_of(err, "error: cuda_cpu:") == 1,
          "a memory fault in each of two workers at once: one error, naming block 0; the process goes on");
    if (code != 3) printf("    exit %d: %s\n", code, err);
}

// ---- checks --------------------------------------------------------------------------------------
static void test_shuffles(void) {
    int* d = device_ints(224);
    shuffles<<<1, 32>>>(d);
    int h[224];
    fetch(h, d, sizeof(h));
    int ok = 1;
    for (int l = 0; l < 32; l++) {
        ok &= h[l] == (l ^ 1) * 10;
        ok &= h[32 + l] == (l + 3 < 32 ? l + 3 : l) * 10;
        ok &= h[64 + l] == (l - 2 >= 0 ? l - 2 : l) * 10;
        ok &= h[96 + l] == 50;
        ok &= (unsigned)h[128 + l] == 0xaaaaaaaau;  // odd lanes: bits 1, 3, 5, ...
        ok &= h[160 + l] == (l ^ 4) * 10;           // l ^ 4 stays within l's segment of 8
        ok &= h[192 + l] == 3;                      // any (lane 31) + 2 * all (every lane < 32)
    }
    check(ok, "warp collectives: xor, down, up, idx, ballot, width 8, any/all give the documented lanes' values");
    cudaFree(d);
}

static void test_barriers(void) {
    const int blocks = 4, threads = 256;
    float h[blocks * threads], sums[blocks], *in, *out;
    for (int i = 0; i < blocks * threads; i++) h[i] = (float)(i % 7);
    cudaMalloc(&in, sizeof(h));
    cudaMalloc(&out, sizeof(sums));
    cudaMemcpy(in, h, sizeof(h), cudaMemcpyHostToDevice);
    block_sum<<<blocks, threads>>>(out, in, 1);
    fetch(sums, out, sizeof(sums));
    int ok = 1;
    for (int b = 0; b < blocks; b++) {
        float want = 0.0f;
        for (int i = 0; i < threads; i++) want += (float)((b * threads + i) % 7);
        ok &= sums[b] == want;
    }
    check(ok, "__syncthreads: a block sum through shared memory is exact");
    // Without the barrier, thread 0 reads partial[] before the others wrote it (in forward
    // order they have not run yet; in reverse order thread 0 runs last, so the race hides).
    block_sum<<<blocks, threads>>>(out, in, 0);
    fetch(sums, out, sizeof(sums));
    const char* order = getenv("CUDA_CPU_ORDER");
    if (order && strcmp(order, "reverse") == 0) {
        tap_skip("reverse order runs thread 0 last, where the race does not show", "the missing-barrier check");
    } else {
        check(isnan(sums[0]), "a missing __syncthreads shows: the reads see shared memory's poison (NaN)");
    }
    int* c = device_ints(1);
    count_barrier<<<1, 96>>>(c);
    int count;
    fetch(&count, c, sizeof(int));
    check(count == 32, "__syncthreads_count: 32 of 96 threads have threadIdx.x % 3 == 0");
    cudaFree(in);
    cudaFree(out);
    cudaFree(c);
}

static void test_coordinates(void) {
    dim3 grid(3, 2, 2), block(4, 2, 3);  // 12 blocks of 24 threads
    int n = 12 * 24, *d = device_ints(n), h[12 * 24];
    coordinates<<<grid, block>>>(d);
    fetch(h, d, sizeof(h));
    int ok = 1;
    for (int b = 0; b < 12; b++) {
        for (int t = 0; t < 24; t++) ok &= h[b * 24 + t] == b * 1000 + t;
    }
    check(ok, "threadIdx/blockIdx/blockDim/gridDim over three axes");
    cudaFree(d);
}

static void test_launch_checks(void) {
    float* d;
    cudaMalloc(&d, 64);
    (void)cudaGetLastError();
    copy_kernel<<<1, 1025>>>(d, d, 1);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads per block: cudaErrorInvalidConfiguration");
    copy_kernel<<<dim3(1, 65536), 32>>>(d, d, 1);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y = 65536: cudaErrorInvalidConfiguration");
    check(cudaGetLastError() == cudaSuccess, "cudaGetLastError resets the error");
    int* s = device_ints(1);
    dynamic_shared_kernel<<<1, 64, 60000>>>(s, 15000);
    check(cudaGetLastError() == cudaErrorInvalidValue, "60000 bytes of dynamic shared memory without the attribute: refused");
    cudaFuncSetAttribute((const void*)dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 60000);
    dynamic_shared_kernel<<<1, 64, 60000>>>(s, 15000);
    int sum = 0;
    check(cudaGetLastError() == cudaSuccess, "with cudaFuncSetAttribute: accepted");
    fetch(&sum, s, sizeof(int));
    check(sum == 15000 * 14999 / 2, "dynamic shared memory holds what the block wrote (sum 0..14999)");
    float host[16];
    copy_kernel<<<1, 16>>>(host, d, 16);
    check(cudaGetLastError() == cudaErrorInvalidValue, "a pageable host pointer as a kernel argument: refused at launch");
    cudaFree(d);
    cudaFree(s);
}

static void test_memory(void) {
    float* d;
    cudaMalloc(&d, 10 * sizeof(float));
    float h[10];
    fetch(h, d, sizeof(h));
    check(isnan(h[0]) && isnan(h[9]), "fresh device memory reads as NaN (0xff bytes)");
    float src[11] = {0};
    check(cudaMemcpy(d, src, sizeof(src), cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "a copy of 44 bytes into a 40-byte allocation: cudaErrorInvalidValue");
    check(cudaMemcpy(d, src, 40, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
          "DeviceToHost with the directions swapped: cudaErrorInvalidValue");
    (void)cudaGetLastError();
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    void* big;
    cudaMalloc(&big, 1 << 30);
    size_t free_after, total_after;
    cudaMemGetInfo(&free_after, &total_after);
    check(total == total_after && free_b - free_after == (1u << 30), "cudaMemGetInfo: a 1 GiB allocation takes 1 GiB");
    cudaFree(big);
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    check(p.multiProcessorCount == 132 && p.major == 9 && p.maxThreadsPerBlock == 1024 && strstr(p.name, "NVIDIA H"),
          "device properties: an H100/H200 (132 SMs, sm_90, 1024 threads per block)");
    cudaFree(d);
}

static void test_streams(void) {
    // Pageable source: staged at the call, so changing it right after does not matter.
    float *d, *pinned, h[4] = {1, 2, 3, 4};
    cudaMalloc(&d, sizeof(h));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMemcpyAsync(d, h, sizeof(h), cudaMemcpyHostToDevice, s);
    h[0] = 100;
    cudaMallocHost((void**)&pinned, sizeof(h));
    cudaMemcpyAsync(pinned, d, sizeof(h), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    check(pinned[0] == 1 && pinned[3] == 4, "cudaMemcpyAsync from pageable memory copies what it held at the call");
    // Stream order: a copy from a pinned buffer queued before a copy into the same buffer
    // reads what the buffer held before (this once failed: a destination poisoned early).
    float *d2;
    cudaMalloc(&d2, sizeof(h));
    pinned[0] = 11.0f;
    cudaMemcpyAsync(d2, pinned, sizeof(float), cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(pinned, d, sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaMemcpyAsync(pinned + 1, d2, sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    check(pinned[0] == 1 && pinned[1] == 11.0f, "pinned copies in and out of one buffer keep stream order");
    cudaFree(d2);
    // An event on a long kernel: a query says not ready, and that is the last error.
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    spin_ms<<<1, 1, 0, s>>>(300);
    cudaEventRecord(e, s);
    (void)cudaGetLastError();
    cudaError_t q = cudaEventQuery(e);
    check_async(q == cudaErrorNotReady && cudaGetLastError() == cudaErrorNotReady,
          "cudaEventQuery on unfinished work: cudaErrorNotReady, also left as the last error (documented)");
    check(cudaEventSynchronize(e) == cudaSuccess && cudaEventQuery(e) == cudaSuccess, "after cudaEventSynchronize: done");
    cudaEvent_t never;
    cudaEventCreate(&never);
    check(cudaEventQuery(never) == cudaSuccess, "an event never recorded is complete");
    // Another stream waits for the event; the pinned destination keeps what it held until
    // the copy has run (an earlier operation in the stream may still read it).
    cudaStream_t s2;
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    spin_ms<<<1, 1, 0, s>>>(200);
    cudaEventRecord(e, s);
    cudaStreamWaitEvent(s2, e, 0);
    pinned[0] = -7.0f;
    cudaMemcpyAsync(pinned, d, sizeof(h), cudaMemcpyDeviceToHost, s2);
    check_async(pinned[0] == -7.0f, "a pinned destination keeps its contents until its copy has run");
    check_async(cudaStreamQuery(s2) == cudaErrorNotReady, "the waiting stream is not done while the event is pending");
    cudaStreamSynchronize(s2);
    check(pinned[1] == 2 && cudaStreamQuery(s) == cudaSuccess, "cudaStreamWaitEvent: the copy ran after the event");
    (void)cudaGetLastError();
    // Timing events.
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    cudaEventRecord(t0, s);
    spin_ms<<<1, 1, 0, s>>>(50);
    cudaEventRecord(t1, s);
    cudaEventSynchronize(t1);
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    check(ms >= 45 && ms < 5000, "cudaEventElapsedTime around a 50 ms kernel");
    check(cudaEventElapsedTime(&ms, e, e) == cudaErrorInvalidResourceHandle,
          "cudaEventElapsedTime of an event made with cudaEventDisableTiming: refused");
    (void)cudaGetLastError();
    cudaStreamDestroy(s2);
    check(cudaMemsetAsync(d, 0, 4, s2) == cudaErrorInvalidResourceHandle, "a destroyed stream cannot take work");
    (void)cudaGetLastError();
    // Legacy default stream and a blocking stream: implicitly ordered.
    cudaStream_t blocking;
    cudaStreamCreate(&blocking);
    spin_ms<<<1, 1, 0, blocking>>>(100);
    cudaMemsetAsync(d, 0, sizeof(h), 0);  // waits for the blocking stream's kernel
    cudaStreamSynchronize(0);
    check(cudaStreamQuery(blocking) == cudaSuccess, "the legacy default stream waits for a blocking stream's earlier work");
    (void)cudaGetLastError();
    cudaFreeHost(pinned);
    cudaFree(d);
}

// ---- WMMA ----------------------------------------------------------------------------------------
// The Guide's definition: D = A B + C for the 16x16 tiles; A element (r, k) of a row-major
// fragment's memory at a[r * lda + k], of a col-major one at a[k * lda + r] (B, C, D
// likewise). Checked two ways: against the double product, within the k additions' bound
// gam(17) of the terms' magnitudes (what any order of fp32 sums meets), and exactly against
// the layer's documented order (fp32 sums of the exact products, c first, k ascending).
static float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
static float to_f(__half x) { return __half2float(x); }
template <typename T>
static T from_f(float x);
template <>
__nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__half from_f<__half>(float x) { return __float2half(x); }

template <typename T, typename LA, typename LB>
static void check_wmma(const char* type, int c_row, int d_row, float scale, int double_a) {
    using namespace nvcuda;
    const int warps = 2, lda = 24, ldb = 40, ldc = 20, ldd = 36;  // ld > 16, multiples of 16 bytes
    const bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
    size_t na = warps * 16 * lda, nb = warps * 16 * ldb, nc = warps * 16 * ldc, nd = warps * 16 * ldd;
    std::vector<T> ha(na, from_f<T>(NAN)), hb(nb, from_f<T>(NAN));  // padding: NaN, so reading it shows
    std::vector<float> hc(nc, NAN), hd(nd);
    unsigned seed = 12345;
    auto next = [&]() { seed = seed * 1103515245u + 12345u; return (int)((seed >> 16) % 61) - 30; };
    auto ai = [&](int w, int r, int k) { return w * 16 * lda + (a_row ? r * lda + k : k * lda + r); };
    auto bi = [&](int w, int k, int n) { return w * 16 * ldb + (b_row ? k * ldb + n : n * ldb + k); };
    auto ci = [&](int w, int r, int n, int ld, int row) { return w * 16 * ld + (row ? r * ld + n : n * ld + r); };
    for (int w = 0; w < warps; w++) {
        for (int r = 0; r < 16; r++) {
            for (int k = 0; k < 16; k++) {
                ha[ai(w, r, k)] = from_f<T>(next() / 8.0f);  // multiples of 1/8 in [-3.75, 3.75]: exact in T
                hb[bi(w, r, k)] = from_f<T>(next() / 16.0f + 1.0f / 1024);  // sums that round in fp32
                hc[ci(w, r, k, ldc, c_row)] = next() * 1.1f;
            }
        }
    }
    T *da, *db;
    float *dc, *dd;
    cudaMalloc(&da, na * sizeof(T));
    cudaMalloc(&db, nb * sizeof(T));
    cudaMalloc(&dc, nc * sizeof(float));
    cudaMalloc(&dd, nd * sizeof(float));
    cudaMemcpy(da, ha.data(), na * sizeof(T), cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb.data(), nb * sizeof(T), cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc.data(), nc * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemset(dd, 0xff, nd * sizeof(float));
    wmma_product<T, LA, LB><<<1, 32 * warps>>>(dd, da, db, dc, lda, ldb, ldc, ldd, c_row, d_row, scale, double_a);
    cudaError_t e = cudaDeviceSynchronize();
    fetch(hd.data(), dd, nd * sizeof(float));
    int in_bound = e == cudaSuccess, exact = in_bound, untouched = 1;
    std::vector<int> written(nd, 0);
    for (int w = 0; w < warps; w++) {
        for (int r = 0; r < 16; r++) {
            for (int n = 0; n < 16; n++) {
                double sum = hc[ci(w, r, n, ldc, c_row)], mass = fabs(sum);
                float ordered = hc[ci(w, r, n, ldc, c_row)];
                for (int k = 0; k < 16; k++) {
                    double p = (double_a ? 2.0 : 1.0) * to_f(ha[ai(w, r, k)]) * to_f(hb[bi(w, k, n)]);
                    sum += p, mass += fabs(p);
                    ordered = ordered + (float)p;
                }
                size_t at = ci(w, r, n, ldd, d_row);
                written[at] = 1;
                double got = hd[at], bound = 17 * 0x1p-24 / (1 - 17 * 0x1p-24) * mass * scale;
                in_bound &= fabs(got - scale * sum) <= bound;
                exact &= got == ordered * scale;
            }
        }
    }
    for (size_t i = 0; i < nd; i++) untouched &= written[i] || isnan(hd[i]);  // padding of D kept
    char what[256];
    snprintf(what, sizeof(what), "wmma %s A %s B %s, C loaded %s, D stored %s%s%s: D = A B + C within gam(17)", type,
             a_row ? "row" : "col", b_row ? "row" : "col", c_row ? "mem_row_major" : "mem_col_major",
             d_row ? "mem_row_major" : "mem_col_major", scale != 1.0f ? ", x[] scaled" : "",
             double_a ? ", A's x[] doubled" : "");
    check(in_bound, what);
    check(exact, "  ... and equal to the documented order (fp32 sums of exact products, c first, k = 0..15)");
    check(untouched, "  ... and store_matrix_sync left the elements between D's rows/columns alone");
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dd);
}

static void test_wmma(void) {
    using namespace nvcuda;
    check_wmma<__nv_bfloat16, wmma::row_major, wmma::col_major>("bf16", 1, 1, 1.0f, 0);
    check_wmma<__nv_bfloat16, wmma::col_major, wmma::row_major>("bf16", 0, 0, 0.5f, 0);
    check_wmma<__nv_bfloat16, wmma::row_major, wmma::row_major>("bf16", 1, 0, 1.0f, 1);
    check_wmma<__nv_bfloat16, wmma::col_major, wmma::col_major>("bf16", 0, 1, 1.0f, 0);
    check_wmma<__half, wmma::row_major, wmma::col_major>("half", 0, 1, 1.0f, 0);
    check_wmma<__half, wmma::col_major, wmma::row_major>("half", 1, 0, 2.0f, 1);
}

int main(int argc, char** argv) {
    if (argc > 1 && strncmp(argv[1], "meet_", 5) == 0) return meet_case(argv[1]);
    if (argc > 1 && (strcmp(argv[1], "first_fault_in_order") == 0 || strcmp(argv[1], "fault_in_both_workers") == 0))
        return parallel_fault_case(argv[1]);
    if (argc > 1 && strcmp(argv[1], "bad_workers") == 0) {
        setenv("CUDA_CPU_BLOCK_WORKERS", "0", 1);
        copy_kernel<<<1, 1>>>(NULL, NULL, 0);
        return 0;
    }
    if (argc > 1 && strncmp(argv[1], "launch_", 7) == 0) return launch_resources_case(argv[1]);
    if (argc > 1) return fault_case(argv[1]);
    test_shuffles();
    test_barriers();
    test_coordinates();
    test_launch_checks();
    test_launch_resources(argv[0]);
    test_memory();
    test_streams();
    test_wmma();
    test_parallel_blocks(argv[0]);
    expect_fault(argv[0], "bad_workers", NULL, 1, "error: cuda_cpu: CUDA_CPU_BLOCK_WORKERS=0: use 1 to 256",
                 "CUDA_CPU_BLOCK_WORKERS=0: an error at the first launch");
    expect_fault(argv[0], "divergent_barrier", NULL, 3,
                 "kernel divergent_barrier (launched at cuda_cpu/tests/test_layer.cu",
                 "a __syncthreads some threads return before: a fault naming the kernel (no hang)");
    expect_fault(argv[0], "divergent_barrier", NULL, 3, "threads 0-31, but threads 32-63 returned",
                 "  ... naming the block's threads on each side");
    expect_fault(argv[0], "early_return", NULL, 3, "lane 7 (thread 7) returned before the __shfl_xor_sync",
                 "a lane that returns before a shuffle its warp-mates wait in: a fault naming it");
    expect_fault(argv[0], "write_past_end", NULL, 3, "0 bytes past the end of an allocation of 1024 bytes",
                 "an off-by-one write faults at the guard page: cudaErrorIllegalAddress naming the allocation");
    expect_fault(argv[0], "write_past_end", NULL, 3, "after=cudaErrorIllegalAddress", "  ... and the error is sticky");
    expect_fault(argv[0], "static_shared", NULL, 3, "exceeds the 48 KiB", "static __shared__ over 48 KiB: a fault");
    expect_fault(argv[0], "wmma_ldm", NULL, 3, "wmma::load_matrix_sync: the lanes disagree",
                 "wmma: lanes passing different ldm values: a fault naming the call");
    expect_fault(argv[0], "wmma_early_return", NULL, 3, "lane 7 (thread 7) returned before the wmma::load_matrix_sync",
                 "wmma: a lane that returned before a warp matrix call: a fault naming it");
    expect_fault(argv[0], "wmma_misaligned", NULL, 3, "is not 256-bit (32-byte) aligned",
                 "wmma: a pointer off the 256-bit alignment: a fault");
    expect_fault(argv[0], "wmma_partial_warp", NULL, 3, "names lane 16 of warp 1, which does not exist",
                 "wmma: a warp of 16 lanes (block of 48 threads): a fault");
    // CUDA_CPU_PROTECT=1 rests on memory protection keys (x86 PKU, enabled by the kernel);
    // without them the mode refuses to start, so there is nothing to check.
    int pkey = pkey_alloc(0, 0);
    if (pkey < 0) {
        char why[160];
        snprintf(why, sizeof(why), "this CPU or kernel has no memory protection keys (%s)", strerror(errno));
        tap_skip(why, "CUDA_CPU_PROTECT=1");
    } else {
        pkey_free(pkey);
        expect_fault(argv[0], "host_touch", "CUDA_CPU_PROTECT=1", 139, "host code touched device memory",
                     "CUDA_CPU_PROTECT=1: host code reading device memory crashes, as on a GPU");
    }
    return done_testing();
}
