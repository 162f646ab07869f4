/*
 * The CPU execution layer's memcheck (CUDA_CPU_CHECK=memcheck, cuda_cpu/tools_memcheck.cpp)
 * against faults worked out by hand: make -C cuda_cpu tests (always built
 * with the tools, with memcheck_host.c compiled by gcc as zero1/'s C sources are).
 *
 *   test_memcheck        every check: each case runs as a child process, with memcheck and
 *                        (where the layer's own checks would miss it) without
 *   test_memcheck CASE   one case alone
 * The rules (compute-sanitizer's memcheck): an N-byte access (N = 2, 4, 8, 16) at an address
 * that is not a multiple of N is misaligned (cudaErrorMisalignedAddress); a device access
 * outside [base, base + size) of every live cudaMalloc'd allocation is out of bounds
 * (cudaErrorIllegalAddress); host code touching cudaMalloc'd memory is an error that ends
 * the process (abort: exit 134), pinned host memory being host memory. cudaMalloc returns
 * 256-byte aligned addresses. Prints TAP (tests/tap.h).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_cpu/tests/layer_test.h"

extern "C" float memcheck_host_sum(const float* p, int n);  // memcheck_host.c

// ---- kernel cases -------------------------------------------------------------------------------
// Thread t copies in[t]: launched with 32 threads over 31 floats (124 bytes), thread 31 reads
// bytes 124..127, 0 bytes past the end (inside the layer's rounding to 256: no guard page).
static const int kPastEndLine = __LINE__ + 1;
__global__ void copy_threads(float* out, const float* in) { out[threadIdx.x] = in[threadIdx.x]; }
// Thread t writes out[t - 1]: thread 0 writes the 4 bytes before the allocation (the same page).
static const int kBeforeLine = __LINE__ + 1;
__global__ void store_shifted(float* out) { out[(int)threadIdx.x - 1] = 1.0f; }
// One thread reads N bytes at byte `offset` of in (a 256-byte aligned allocation).
static const int kVectorLine = __LINE__ + 2;
__global__ void load_float4_at(float* out, const char* in, int offset) {
    float4 v = *(const float4*)(in + offset);
    out[0] = v.x + v.y + v.z + v.w;
}
__global__ void load_double_at(float* out, const char* in, int offset) { out[0] = (float)*(const double*)(in + offset); }
__global__ void load_short_at(float* out, const char* in, int offset) { out[0] = (float)*(const short*)(in + offset); }
__global__ void store_float_at(char* out, int offset) { *(float*)(out + offset) = 2.0f; }
// A 16-byte aligned aggregate copied whole (g++ moves it with an aligned SSE load, which x86
// refuses at a misaligned address: a general-protection fault, with or without memcheck).
struct alignas(16) Quad {
    float v[4];
};
__global__ void copy_quad_at(float* out, const char* in, int offset) {
    Quad q = *(const Quad*)(in + offset);
    out[threadIdx.x] = q.v[threadIdx.x % 4];
}
// A 16-byte read 8 bytes into a __shared__ float4 array (16-byte aligned, 64 bytes).
__global__ void shared_float4_at(float* out, int offset) {
    __shared__ float4 s[4];
    s[threadIdx.x] = make_float4(1.0f, 2.0f, 3.0f, 4.0f);
    __syncthreads();
    float4 v = *(const float4*)((const char*)s + offset);
    if (threadIdx.x == 0) out[0] = v.x + v.y + v.z + v.w;
}
// Every size at an aligned address, the last bytes of an allocation, a 1-byte access at an
// odd address, atomics, and pinned host memory (device-accessible): no finding.
__global__ void all_valid(float* out, const char* in, const float* pinned, int* counter) {
    float4 a = *(const float4*)(in + 16);
    double b = *(const double*)(in + 8);
    float c = *(const float*)(in + 4);
    short d = *(const short*)(in + 2);
    char e = in[127];
    float last = ((const float*)in)[31];
    atomicAdd(counter, 1);
    out[threadIdx.x] = a.x + (float)b + c + d + e + last + pinned[threadIdx.x];
}

// ---- host cases ---------------------------------------------------------------------------------
static volatile float sink;
static const int kHostReadLine = __LINE__ + 1;
__attribute__((noinline)) static void host_reads(const float* p) { sink = p[2]; }
static const int kHostWriteLine = __LINE__ + 1;
__attribute__((noinline)) static void host_writes(float* p) { p[3] = 1.0f; }

static int run(const char* name) {
    float *out, *in, *pinned;
    int* counter;
    cudaMalloc(&out, 128);
    cudaMalloc(&in, 124);
    cudaMalloc(&counter, sizeof(int));
    cudaMallocHost(&pinned, 128);
    cudaMemset(out, 0, 128);
    cudaMemset(in, 0, 124);
    cudaMemset(counter, 0, sizeof(int));
    for (int i = 0; i < 32; i++) pinned[i] = (float)i;  // host code on host memory
    if (strcmp(name, "past_end") == 0) copy_threads<<<1, 32>>>(out, in);
    else if (strcmp(name, "before_start") == 0) store_shifted<<<1, 32>>>(out);
    else if (strcmp(name, "misaligned16") == 0) load_float4_at<<<1, 1>>>(out, (const char*)out, 4);
    else if (strcmp(name, "misaligned8") == 0) load_double_at<<<1, 1>>>(out, (const char*)out, 4);
    else if (strcmp(name, "misaligned4") == 0) store_float_at<<<1, 1>>>((char*)out, 2);
    else if (strcmp(name, "misaligned2") == 0) load_short_at<<<1, 1>>>(out, (const char*)out, 1);
    else if (strcmp(name, "shared_misaligned") == 0) shared_float4_at<<<1, 4>>>(out, 8);
    else if (strcmp(name, "quad_misaligned") == 0) copy_quad_at<<<1, 4>>>(out, (const char*)out, 4);
    else if (strcmp(name, "valid") == 0) all_valid<<<1, 32>>>(out, (const char*)out, pinned, counter);
    else if (strcmp(name, "host_read") == 0) host_reads(out);
    else if (strcmp(name, "host_write") == 0) host_writes(out);
    else if (strcmp(name, "host_read_c") == 0) sink = memcheck_host_sum(out, 4);
    else if (strcmp(name, "host_freed") == 0) {
        cudaFree(in);
        host_reads(in);
    } else if (strcmp(name, "host_valid") == 0) {
        // The runtime's copies and fills, pinned memory through the host and a kernel.
        float h[32];
        cudaMemcpy(out, pinned, 128, cudaMemcpyHostToDevice);
        cudaMemcpy(h, out, 128, cudaMemcpyDeviceToHost);
        cudaMemcpy(pinned, out, 128, cudaMemcpyDeviceToHost);
        copy_threads<<<1, 32>>>(out, pinned);
        cudaDeviceSynchronize();
        sink = h[5] + pinned[7] + memcheck_host_sum(pinned, 32);
    } else {
        fprintf(stderr, "unknown case %s\n", name);
        return 2;
    }
    cudaError_t sync = cudaDeviceSynchronize();
    fprintf(stderr, "sync=%s\n", cudaGetErrorName(sync));
    return sync == cudaSuccess ? 0 : 3;
}

// ---- the checks ---------------------------------------------------------------------------------
static const char* at_line(int line) {
    static char buf[8][64];
    static int next;
    char* b = buf[next++ % 8];
    snprintf(b, 64, "test_memcheck.cu:%d", line);
    return b;
}

int main(int argc, char** argv) {
    if (argc > 1) return run(argv[1]);
    const char* self = argv[0];
    const char* mc = "CUDA_CPU_CHECK=memcheck";
    const char* quiet[] = {"sync=cudaSuccess", NULL};

    const char* past[] = {"kernel copy_threads (launched at cuda_cpu/tests/test_memcheck.cu",
                          "block (0,0,0) thread (31,0,0): memcheck: 4-byte load out of bounds: 0 bytes past the end "
                          "of a device allocation of 124 bytes (cudaMalloc'd at",
                          at_line(kPastEndLine), "sync=cudaErrorIllegalAddress", NULL};
    expect(self, "past_end", mc, 3, past, "out of bounds: the 4 bytes just past a 124-byte allocation (thread 31)");
    expect(self, "past_end", NULL, 0, quiet, "  ... which the layer alone misses (inside its rounding to 256 bytes)");
    const char* before[] = {"thread (0,0,0): memcheck: 4-byte store out of bounds: 4 bytes before a device allocation "
                            "of 128 bytes",
                            at_line(kBeforeLine), "sync=cudaErrorIllegalAddress", NULL};
    expect(self, "before_start", mc, 3, before, "out of bounds: a store to the 4 bytes before an allocation (thread 0)");
    expect(self, "before_start", NULL, 0, quiet, "  ... which the layer alone misses (the page is mapped)");

    const char* m16[] = {"memcheck: misaligned 16-byte load (address mod 16 = 4) at byte 4 of a device allocation of "
                         "128 bytes",
                         at_line(kVectorLine), "sync=cudaErrorMisalignedAddress", NULL};
    expect(self, "misaligned16", mc, 3, m16, "misaligned: a 16-byte load at byte 4 of an allocation");
    expect(self, "misaligned16", NULL, 0, quiet, "  ... which x86 performs silently without memcheck");
    const char* m8[] = {"misaligned 8-byte load (address mod 8 = 4) at byte 4 of", "sync=cudaErrorMisalignedAddress",
                        NULL};
    expect(self, "misaligned8", mc, 3, m8, "misaligned: an 8-byte load at byte 4");
    const char* m4[] = {"misaligned 4-byte store (address mod 4 = 2) at byte 2 of", "sync=cudaErrorMisalignedAddress",
                        NULL};
    expect(self, "misaligned4", mc, 3, m4, "misaligned: a 4-byte store at byte 2");
    const char* m2[] = {"misaligned 2-byte load (address mod 2 = 1) at byte 1 of", "sync=cudaErrorMisalignedAddress",
                        NULL};
    expect(self, "misaligned2", mc, 3, m2, "misaligned: a 2-byte load at byte 1");
    const char* ms[] = {"misaligned 16-byte load (address mod 16 = 8) at __shared__ 's' (byte 8 of 64)",
                        "sync=cudaErrorMisalignedAddress", NULL};
    expect(self, "shared_misaligned", mc, 3, ms, "misaligned: a 16-byte load 8 bytes into a __shared__ float4 array");
    const char* gp[] = {"kernel copy_quad_at", "a general-protection fault (on x86 most likely an aligned 16-byte move",
                        "sync=cudaErrorIllegalAddress", NULL};
    expect(self, "quad_misaligned", NULL, 3, gp,
           "without memcheck, an aligned 16-byte copy at byte 4 is x86's general-protection fault, named so");
    const char* mq[] = {"kernel copy_quad_at", "misaligned 16-byte load (address mod 16 = 4)",
                        "sync=cudaErrorMisalignedAddress", NULL};
    expect(self, "quad_misaligned", mc, 3, mq, "  ... and memcheck's misaligned load, before x86 sees it");
    expect(self, "valid", mc, 0, quiet,
           "no finding: every size aligned, an allocation's last bytes, a byte at an odd address, pinned memory");

    const char* hr[] = {"error: cuda_cpu: memcheck: host code reads 4 bytes of device memory, byte 8 of a device "
                        "allocation of 128 bytes (cudaMalloc'd at",
                        at_line(kHostReadLine), "(host_reads)", NULL};
    expect(self, "host_read", mc, 134, hr, "host code reading device memory: the function and line, then abort");
    expect(self, "host_read", NULL, 0, quiet, "  ... which the layer alone lets through (no protection keys)");
    const char* hw[] = {"memcheck: host code writes 4 bytes of device memory, byte 12 of a device allocation of 128",
                        at_line(kHostWriteLine), "(host_writes)", NULL};
    expect(self, "host_write", mc, 134, hw, "host code writing device memory");
    const char* hc[] = {"memcheck: host code reads 4 bytes of device memory, byte 0 of a device allocation of 128",
                        "memcheck_host.c:11", "(memcheck_host_sum)", NULL};
    expect(self, "host_read_c", mc, 134, hc, "host C code (gcc) reading device memory: memcheck_host.c's line");
    const char* hf[] = {"host code reads 4 bytes of device memory, byte 8 of a device allocation of 124 bytes that was "
                        "freed",
                        NULL};
    expect(self, "host_freed", mc, 134, hf, "host code reading freed device memory");
    expect(self, "host_valid", mc, 0, quiet,
           "no finding: cudaMemcpy both ways, pinned memory from the host, from a kernel and from C code");

    expect(self, "past_end", "CUDA_CPU_CHECK=memcheck,race", 3, past, "CUDA_CPU_CHECK=memcheck,race: the same fault");
    expect(self, "misaligned16", "CUDA_CPU_CHECK=race,memcheck", 3, m16, "CUDA_CPU_CHECK=race,memcheck: the same fault");
    expect(self, "misaligned16", "CUDA_CPU_CHECK=race", 0, quiet, "CUDA_CPU_CHECK=race alone: no memcheck");
    const char* bad[] = {"error: cuda_cpu: CUDA_CPU_CHECK=racecheck: use off, race, memcheck or race,memcheck", NULL};
    expect(self, "valid", "CUDA_CPU_CHECK=racecheck", 1, bad, "an unknown CUDA_CPU_CHECK value: one error naming them");
    return done_testing();
}
