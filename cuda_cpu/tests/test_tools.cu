/*
 * The CPU execution layer's sanitizer and profiler (cuda_cpu/tools.h) against numbers
 * worked out by hand: make -C cuda_cpu tests (always built with the tools).
 *
 *   test_tools           every check: the profiler's and sanitizer's cases run as child
 *                        processes (CUDA_CPU_PROFILE=FILE, CUDA_CPU_CHECK=race), their
 *                        output read back
 *   test_tools CASE      one child case alone
 * The model (docs/cuda_cpu.md, "Sanitizer and profiler"): a request is one warp-wide
 * instruction; global memory moves 32-byte sectors; shared memory has 32 banks of 4 bytes,
 * one wavefront serving one distinct word per bank, 8-byte accesses in 2 phases of 16
 * lanes and 16-byte ones in 4 of 8. Every profiled kernel runs one block of one warp, once,
 * so its counts are those of single requests. Prints TAP (tests/tap.h).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_cpu/tests/layer_test.h"

using namespace nvcuda;

// ---- profiler cases ---------------------------------------------------------------------------------
// 32 lanes x 4 bytes, consecutive, 256-byte aligned: 128 bytes = 4 sectors, as asked.
__global__ void global_consecutive(float* out, const float* in) { out[threadIdx.x] = in[threadIdx.x]; }
// Lane l reads float 64 l: every lane its own sector (32), where 128 bytes fit 4.
__global__ void global_scattered(float* out, const float* in) { out[threadIdx.x] = in[threadIdx.x * 64]; }
// 16 bytes per lane, consecutive: 512 bytes = 16 sectors.
__global__ void global_vector16(float4* out, const float4* in) { out[threadIdx.x] = in[threadIdx.x]; }
// The same instruction 4 times per lane: 4 requests of 4 sectors (the i-th of each lane together).
__global__ void global_loop(float* out, const float* in, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += in[i * 32 + threadIdx.x];
    out[threadIdx.x] = s;
}

// Shared memory: 1024 floats written by the warp (32 requests of 32 consecutive words: 1
// wavefront each), then one read: word l (1 wavefront), 2 l (two words per even bank: 2),
// 32 l (32 words in bank 0: 32), 0 (one word for all: a broadcast, 1).
template <int STRIDE>
__global__ void shared_stride(float* out) {
    __shared__ float s[1024];
    for (int i = threadIdx.x; i < 1024; i += 32) s[i] = (float)i;
    __syncwarp();
    out[threadIdx.x] = s[threadIdx.x * STRIDE];
}
// 8 bytes per lane: 2 phases of 16 lanes x 2 words, conflict-free: 2 wavefronts (ideal 2).
__global__ void shared_double(double* out) {
    __shared__ double s[32];
    s[threadIdx.x] = threadIdx.x;
    __syncwarp();
    out[threadIdx.x] = s[threadIdx.x];
}
// 16 bytes per lane: 4 phases of 8 lanes x 4 words: 4 wavefronts (ideal 4).
__global__ void shared_vector16(float4* out, const float4* in) {
    __shared__ float4 s[32];
    s[threadIdx.x] = in[threadIdx.x];
    __syncwarp();
    out[threadIdx.x] = s[threadIdx.x];
}

// An array indexed at run time (lane l reads element l % 8) lives in the thread's local
// memory: 8 stores of 4 bytes and one load of 4 per lane. The plain kernel above has none.
__global__ void local_array(float* out, const float* in, const int* idx) {
    float a[8];
    for (int i = 0; i < 8; i++) a[i] = in[i * 32 + threadIdx.x];
    out[threadIdx.x] = a[idx[threadIdx.x] & 7];
}

// WMMA from shared memory, bf16, ld = LD elements, A row-major and B col-major (both read
// as element pairs of 4 bytes at word (LD g + 2 t) / 2 for lane 4 g + t). LD = 16: banks
// 8 g + t, so g and g + 4 meet in every bank: 2 wavefronts per request, 4 requests per
// load; LD = 24 (16 + 8 of padding): banks 12 g + t, all 32 distinct: 1 per request.
// The accumulator's store to global memory, row-major, ld 16 floats: 4 requests, each 8
// rows x 8 bytes x 4 lanes = 8 full sectors. One m16n16k16 product: 8192 FLOPs.
template <int LD>
__global__ void wmma_tiles(float* out, const __nv_bfloat16* g) {
    __shared__ __align__(32) __nv_bfloat16 tile[16 * LD];
    for (int i = threadIdx.x; i < 16 * LD; i += 32) tile[i] = g[i];
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::load_matrix_sync(a, tile, LD);
    wmma::load_matrix_sync(b, tile, LD);
    wmma::fill_fragment(c, 0.0f);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
}

static int profile_case(void) {
    float *in, *out;
    int* idx;
    __nv_bfloat16* g;
    cudaMalloc(&in, 64 * 32 * sizeof(float));
    cudaMalloc(&out, 256 * sizeof(float));
    cudaMalloc(&idx, 32 * sizeof(int));
    cudaMalloc(&g, 16 * 24 * sizeof(__nv_bfloat16));
    cudaMemset(in, 0, 64 * 32 * sizeof(float));
    int lanes[32];
    for (int l = 0; l < 32; l++) lanes[l] = l;
    cudaMemcpy(idx, lanes, sizeof(lanes), cudaMemcpyHostToDevice);
    cudaMemset(g, 0, 16 * 24 * sizeof(__nv_bfloat16));
    global_consecutive<<<1, 32>>>(out, in);
    global_scattered<<<1, 32>>>(out, in);
    global_vector16<<<1, 32>>>((float4*)out, (const float4*)in);
    global_loop<<<1, 32>>>(out, in, 4);
    shared_stride<1><<<1, 32>>>(out);
    shared_stride<2><<<1, 32>>>(out);
    shared_stride<32><<<1, 32>>>(out);
    shared_stride<0><<<1, 32>>>(out);
    shared_double<<<1, 32>>>((double*)out);
    shared_vector16<<<1, 32>>>((float4*)out, (const float4*)in);
    local_array<<<1, 32>>>(out, in, idx);
    wmma_tiles<16><<<1, 32>>>(out, g);
    wmma_tiles<24><<<1, 32>>>(out, g);
    cudaError_t e = cudaDeviceSynchronize();
    fprintf(stderr, "sync=%s\n", cudaGetErrorName(e));
    return e == cudaSuccess ? 0 : 3;
}

// ---- sanitizer cases ----------------------------------------------------------------------------------
// The lines of the accesses each finding must name.
static const int kRawLines[2] = {__LINE__ + 3, __LINE__ + 4};
__global__ void shared_raw(float* out) {
    __shared__ float s[64];
    if (threadIdx.x == 0) s[0] = 1.0f;              // written by warp 0
    if (threadIdx.x == 40) out[0] = s[0];           // read by warp 1, no barrier between
}
// Each thread writes its word again after its neighbour read it in the same interval.
__global__ void shared_war(float* out) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
    s[threadIdx.x] = 0.0f;
}
__global__ void shared_waw(float* out) {
    __shared__ float s[64];
    if (threadIdx.x == 1 || threadIdx.x == 35) s[5] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[5];
}
// Lanes 0 and 1 of one warp: ordered by __syncwarp (with_sync), else a hazard.
__global__ void warp_handoff(float* out, int with_sync) {
    __shared__ float s[32];
    if (threadIdx.x == 0) s[0] = 1.0f;
    if (with_sync) __syncwarp();
    if (threadIdx.x == 1) out[0] = s[0];
}
// A correct block sum: barriers between every write and the reads of other threads.
__global__ void block_sum(float* out, const float* in) {
    __shared__ float s[64];
    s[threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    for (int half = 32; half > 0; half /= 2) {
        float v = threadIdx.x < half ? s[threadIdx.x] + s[threadIdx.x + half] : 0.0f;
        __syncthreads();
        if (threadIdx.x < half) s[threadIdx.x] = v;
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}
static const int kBlocksLines[2] = {__LINE__ + 2, __LINE__ + 3};
__global__ void blocks_share_a_word(float* out) {
    if (blockIdx.x == 0 && threadIdx.x == 3) out[7] = 1.0f;
    if (blockIdx.x == 1 && threadIdx.x == 5) out[8] = out[7];
}
__global__ void blocks_same_store(float* out) {
    if (threadIdx.x == 0) out[0] = (float)blockIdx.x;
}
// bf16 neighbours in one 4-byte word, each block its own: no race.
__global__ void blocks_bf16_neighbours(__nv_bfloat16* out) {
    if (threadIdx.x == 0) out[blockIdx.x] = __float2bfloat16((float)blockIdx.x);
}
__global__ void blocks_atomic(int* counter) { atomicAdd(counter, 1); }
// Every thread of two warps adds to one __shared__ word with atomicAdd, then thread 0 reads
// it after the barrier: no hazard (atomics do not race with one another).
__global__ void shared_atomic(int* out) {
    __shared__ int sum;
    if (threadIdx.x == 0) sum = 0;
    __syncthreads();
    atomicAdd(&sum, 1);
    __syncthreads();
    if (threadIdx.x == 0) out[0] = sum;
}

static int race_case(const char* name) {
    float *in, *out;
    cudaMalloc(&in, 64 * sizeof(float));
    cudaMalloc(&out, 1024 * sizeof(float));
    cudaMemset(in, 0, 64 * sizeof(float));
    if (strcmp(name, "shared_raw") == 0) shared_raw<<<1, 64>>>(out);
    else if (strcmp(name, "shared_war") == 0) shared_war<<<1, 64>>>(out);
    else if (strcmp(name, "shared_waw") == 0) shared_waw<<<1, 64>>>(out);
    else if (strcmp(name, "warp_synced") == 0) warp_handoff<<<1, 32>>>(out, 1);
    else if (strcmp(name, "warp_unsynced") == 0) warp_handoff<<<1, 32>>>(out, 0);
    else if (strcmp(name, "block_sum") == 0) block_sum<<<4, 64>>>(out, in);
    else if (strcmp(name, "blocks_share_a_word") == 0) blocks_share_a_word<<<2, 32>>>(out);
    else if (strcmp(name, "blocks_same_store") == 0) blocks_same_store<<<3, 32>>>(out);
    else if (strcmp(name, "blocks_bf16_neighbours") == 0) blocks_bf16_neighbours<<<4, 32>>>((__nv_bfloat16*)out);
    else if (strcmp(name, "blocks_atomic") == 0) blocks_atomic<<<4, 32>>>((int*)out);
    else if (strcmp(name, "shared_atomic") == 0) shared_atomic<<<1, 64>>>((int*)out);
    else {
        fprintf(stderr, "unknown case %s\n", name);
        return 2;
    }
    cudaError_t sync = cudaDeviceSynchronize();
    fprintf(stderr, "sync=%s\n", cudaGetErrorName(sync));
    return sync == cudaSuccess ? 0 : 3;
}

// ---- the checks -----------------------------------------------------------------------------------------
// The integer `key` of kernel `kernel`'s line in the profile (JSON Lines), -1 if absent.
static long long profile_value(const char* profile, const char* kernel, const char* key) {
    char want[256];
    snprintf(want, sizeof(want), "{\"kernel\": \"%s\",", kernel);
    const char* line = strstr(profile, want);
    if (!line) return -1;
    const char* end = strchr(line, '\n');
    snprintf(want, sizeof(want), "\"%s\": ", key);
    const char* at = strstr(line, want);
    if (!at || (end && at > end)) return -1;
    return atoll(at + strlen(want));
}

static void expect_counts(const char* profile, const char* kernel, const char* what, long long requests,
                          long long units, long long ideal, const char* text) {
    const char* unit = strncmp(what, "global", 6) == 0 ? "sectors" : "wavefronts";
    char key[128];
    snprintf(key, sizeof(key), "%s_requests", what);
    long long r = profile_value(profile, kernel, key);
    snprintf(key, sizeof(key), "%s_%s", what, unit);
    long long u = profile_value(profile, kernel, key);
    snprintf(key, sizeof(key), "%s_ideal_%s", what, unit);
    long long i = profile_value(profile, kernel, key);
    int ok = r == requests && u == units && i == ideal;
    char msg[512];
    snprintf(msg, sizeof(msg), "%s: %s requests %lld, %s %lld, ideal %lld (want %lld, %lld, %lld)", text, what, r, unit,
             u, i, requests, units, ideal);
    check(ok, msg);
}

static void test_profiler(const char* self) {
    char path[] = "/tmp/test_tools_profile.XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    char env[256], err[65536];
    snprintf(env, sizeof(env), "CUDA_CPU_PROFILE=%s", path);
    int code = run_case(self, "profile", env, err, sizeof(err));
    check(code == 0 && strstr(err, "cuda_cpu profile") != NULL, "profiler: the program runs; the table is on stderr");
    static char profile[1 << 20];
    FILE* f = fopen(path, "r");
    size_t got = f ? fread(profile, 1, sizeof(profile) - 1, f) : 0;
    profile[got] = '\0';
    if (f) fclose(f);
    unlink(path);
    // Every key the documentation promises, as an integer, in every line.
    static const char* const keys[] = {
        "launches", "global_load_requests", "global_load_sectors", "global_load_ideal_sectors",
        "global_store_requests", "global_store_sectors", "global_store_ideal_sectors", "shared_load_requests",
        "shared_load_wavefronts", "shared_load_ideal_wavefronts", "shared_store_requests", "shared_store_wavefronts",
        "shared_store_ideal_wavefronts", "local_load_bytes", "local_store_bytes", "wmma_flops"};
    int all = 1;
    for (const char* k : keys) all &= profile_value(profile, "global_consecutive", k) >= 0;
    check(all && profile_value(profile, "global_consecutive", "launches") == 1,
          "profiler: a JSON line per kernel with every documented key");

    expect_counts(profile, "global_consecutive", "global_load", 1, 4, 4, "32 consecutive floats");
    expect_counts(profile, "global_consecutive", "global_store", 1, 4, 4, "32 consecutive floats");
    expect_counts(profile, "global_scattered", "global_load", 1, 32, 4, "a scattered read: one sector per lane");
    expect_counts(profile, "global_vector16", "global_load", 1, 16, 16, "16 bytes per lane, 512 consecutive bytes");
    expect_counts(profile, "global_loop", "global_load", 4, 16, 16, "one load 4 times per lane: 4 requests");
    expect_counts(profile, "shared_stride<1>", "shared_load", 1, 1, 1, "a warp reading 32 consecutive floats");
    expect_counts(profile, "shared_stride<1>", "shared_store", 32, 32, 32, "32 rows of 32 consecutive floats");
    expect_counts(profile, "shared_stride<2>", "shared_load", 1, 2, 1, "a stride-2 float read: 2-way conflict");
    expect_counts(profile, "shared_stride<32>", "shared_load", 1, 32, 1, "a stride-32 float read: 32-way conflict");
    expect_counts(profile, "shared_stride<0>", "shared_load", 1, 1, 1, "a broadcast read");
    expect_counts(profile, "shared_double", "shared_load", 1, 2, 2, "8 bytes per lane: 2 phases");
    expect_counts(profile, "shared_vector16", "shared_load", 1, 4, 4, "16 bytes per lane, 512 consecutive bytes");
    long long lb = profile_value(profile, "local_array", "local_load_bytes");
    long long sb = profile_value(profile, "local_array", "local_store_bytes");
    check(lb == 32 * 4 && sb == 32 * 8 * 4 && profile_value(profile, "global_consecutive", "local_load_bytes") == 0,
          "local memory: a run-time-indexed array of 8 floats (8 stores, 1 load per lane); none in a plain kernel");
    expect_counts(profile, "wmma_tiles<16>", "shared_load", 8, 16, 8, "WMMA loads, ld 16: 2-way conflicts");
    expect_counts(profile, "wmma_tiles<24>", "shared_load", 8, 8, 8, "WMMA loads, ld 24 (padded): conflict-free");
    expect_counts(profile, "wmma_tiles<16>", "global_store", 4, 32, 32, "WMMA accumulator store, row-major");
    check(profile_value(profile, "wmma_tiles<16>", "wmma_flops") == 8192 &&
              profile_value(profile, "wmma_tiles<16>", "local_store_bytes") == 0,
          "WMMA: one product is 8192 FLOPs; fragments are registers, not local memory");
}

static void expect_race(const char* self, const char* name, int want_exit, const char* const* needles,
                        const char* what) {
    char err[16384];
    int code = run_case(self, name, "CUDA_CPU_CHECK=race", err, sizeof(err));
    int ok = code == want_exit;
    for (int i = 0; needles[i]; i++) ok &= strstr(err, needles[i]) != NULL;
    check(ok, what);
    if (!ok) printf("    exit %d, stderr:\n%s\n", code, err);
}

static void test_sanitizer(const char* self) {
    char line_w[64], line_r[64];
    snprintf(line_w, sizeof(line_w), "test_tools.cu:%d", kRawLines[0]);
    snprintf(line_r, sizeof(line_r), "test_tools.cu:%d", kRawLines[1]);
    const char* raw[] = {"kernel shared_raw (launched at cuda_cpu/tests/test_tools.cu", "(read after write)",
                         "thread 40 (warp 1) reads 4 bytes of __shared__ 's' (byte 0 of 256)", "thread 0 (warp 0) wrote",
                         line_w, line_r, "sync=cudaErrorLaunchFailure", NULL};
    expect_race(self, "shared_raw", 3, raw, "racecheck: a shared write and another warp's read without a barrier (RAW)");
    const char* war[] = {"(write after read)", "sync=cudaErrorLaunchFailure", NULL};
    expect_race(self, "shared_war", 3, war, "racecheck: a write over a word another thread read since the barrier (WAR)");
    const char* waw[] = {"(write after write)", "byte 20 of 256", NULL};
    expect_race(self, "shared_waw", 3, waw, "racecheck: two threads writing one word between barriers (WAW)");
    const char* quiet[] = {"sync=cudaSuccess", NULL};
    expect_race(self, "warp_synced", 0, quiet, "racecheck: lanes of one warp ordered by __syncwarp: no finding");
    const char* unsynced[] = {"(read after write)", "nor __syncwarp", NULL};
    expect_race(self, "warp_unsynced", 3, unsynced, "racecheck: lanes of one warp without __syncwarp: a hazard");
    expect_race(self, "block_sum", 0, quiet, "racecheck: a correct block reduction: no finding");
    char gl_w[64], gl_r[64];
    snprintf(gl_w, sizeof(gl_w), "test_tools.cu:%d", kBlocksLines[0]);
    snprintf(gl_r, sizeof(gl_r), "test_tools.cu:%d", kBlocksLines[1]);
    const char* blocks[] = {"global-memory race between blocks (read after write)", "block (1,0,0) thread 5 reads",
                            "block (0,0,0) thread 3 wrote", "byte 28 of a device allocation of 4096 bytes (cudaMalloc'd at",
                            gl_w, gl_r, NULL};
    expect_race(self, "blocks_share_a_word", 3, blocks, "racecheck: one block reads what another wrote (global)");
    const char* same[] = {"(write after write)", NULL};
    expect_race(self, "blocks_same_store", 3, same, "racecheck: blocks storing to one word (global WAW)");
    expect_race(self, "blocks_bf16_neighbours", 0, quiet,
                "racecheck: blocks writing neighbouring bf16 values of one word: no finding");
    expect_race(self, "blocks_atomic", 0, quiet, "racecheck: blocks adding to one word with atomicAdd: no finding");
    expect_race(self, "shared_atomic", 0, quiet,
                "racecheck: a block's threads adding to one __shared__ word with atomicAdd: no finding");
}

int main(int argc, char** argv) {
    if (argc > 1) return strcmp(argv[1], "profile") == 0 ? profile_case() : race_case(argv[1]);
    test_profiler(argv[0]);
    test_sanitizer(argv[0]);
    return done_testing();
}
