/*
 * cuda_cpu/internal.h: what the parts of the CPU execution layer share (runtime.cpp,
 * kernel.cpp, blas.cpp, nccl.cpp). Not for the project's sources: they see only the CUDA
 * toolkit's own headers plus cuda_cpu/cuda_cpu.h.
 *
 * The model in one paragraph: device memory is host memory carved out of one reserved
 * arena (so it can be told apart from host memory, guarded and protected); every device
 * operation (kernel, copy, fill, cuBLAS call, NCCL collective, event record or wait) is a
 * closure queued on a stream and run in stream order, on that stream's worker thread
 * (async, the default), on the calling thread before the call returns (eager), or only
 * once something waits for it (lazy). CUDA_CPU_EXEC=async|eager|lazy chooses.
 */
#ifndef CUDA_CPU_INTERNAL_H
#define CUDA_CPU_INTERNAL_H

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace cudacpu {

// ---- diagnostics ------------------------------------------------------------------
// One line "cuda_cpu: <message>" on stderr (what a failing call adds to its error code).
void diag(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// A fault found while device work ran (a kernel's broken barrier, a collective whose
// ranks disagree, an illegal address): prints "error: cuda_cpu: <message>" once and makes
// `err` the context's sticky error, as a GPU fault does: every later runtime call that
// synchronizes (and cudaGetLastError) returns it.
void device_fault(cudaError_t err, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// The sticky error, cudaSuccess while there is none.
cudaError_t sticky_error();
// A runtime call's result: a failure (cudaErrorNotReady included, as the real runtime
// does) becomes the calling thread's last error (cudaGetLastError / cudaPeekAtLastError).
cudaError_t result(cudaError_t err);
// Environment settings: CUDA_CPU_<name> as an integer, or def when unset; or as one of
// choices (its index; 0 when unset; anything else ends the program with a message).
long env_long(const char* name, long def);
int env_choice(const char* name, const char* const* choices, int count);
// CUDA_CPU_EXEC: how device work runs (see the top of this file).
enum ExecMode { EXEC_ASYNC, EXEC_EAGER, EXEC_LAZY };
ExecMode exec_mode();

// ---- memory -------------------------------------------------------------------------
enum MemKind { MEM_HOST = 0, MEM_DEVICE = 1, MEM_PINNED = 2 };
struct MemRange {
    MemKind kind;  // MEM_HOST: not from the layer (pageable host memory, or garbage)
    char* base;    // start of the allocation holding the pointer (NULL for MEM_HOST)
    size_t size;   // its size in bytes as asked for
    int device;    // the device it was allocated on (device memory)
    bool freed;    // the pointer is in an allocation that was freed
};
// What p points into.
MemRange lookup(const void* p);
// [p, p + bytes) must lie inside one live device allocation (or a pinned host one, where
// allow_pinned: kernels and collectives may address pinned memory, as with UVA). On
// failure prints a diag naming `what` and the allocation, and returns false. bytes may be
// 0 (then p may equal the allocation's end).
bool check_device_range(const void* p, size_t bytes, const char* what, bool allow_pinned);

// A device allocation as memcheck names it (tools.cpp): device_allocation_near (runtime.cpp).
struct DeviceAllocationInfo {
    const char* base;
    size_t size;
    const void* made_at;  // cudaMalloc's caller
    bool freed;
};
bool device_allocation_near(const void* p, DeviceAllocationInfo* out);

// Device memory is host memory; in protect mode (CUDA_CPU_PROTECT=1) only device
// operations may touch it. Layer code that must read or write it outside an operation
// (on the host thread) holds one of these for the duration.
struct DeviceAccess {
    DeviceAccess();
    ~DeviceAccess();
    DeviceAccess(const DeviceAccess&) = delete;
    DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// ---- streams ------------------------------------------------------------------------
// Queues fn on stream s (0, cudaStreamLegacy: the legacy default stream, with its
// implicit ordering against blocking streams; cudaStreamPerThread is treated as legacy).
// fn runs once, in stream order, with device memory accessible; it may block (a
// collective waiting for its peers) and may call device_fault. label names the
// operation in diagnostics ("kernel layernorm_forward_kernel", "ncclAllReduce").
// Returns cudaErrorInvalidResourceHandle for a destroyed or unknown stream, the sticky
// error if there is one, else cudaSuccess.
cudaError_t enqueue(cudaStream_t s, const char* label, std::function<void()> fn);
// The stream whose operation the calling thread is running now (NULL when not inside one).
cudaStream_t current_stream();
// A thread of the layer's own that runs device work (a stream's worker, a helper running a
// launch's blocks): device memory always accessible, and a signal stack for the SIGSEGV
// handler (a fault inside a kernel, a fiber's stack overflow).
void device_thread_setup();
// Whether h names a stream that can take work (the default streams always can).
bool stream_alive(cudaStream_t h);

// ---- devices ------------------------------------------------------------------------
// The device the calling host thread has selected (cudaSetDevice), 0 by default.
int current_device();
// The UUID the emulated device reports: distinct per process (each rank its own GPU), or
// the same in every process with CUDA_CPU_SHARED_GPU=1 (ranks sharing one GPU).
void device_uuid(int device, unsigned char out[16]);

// ---- device memory as the driver counts it (device_memory.cpp) ---------------------------
// CUDA_CPU_GPU=H100: the emulated GPU is an H100 (else an H200).
bool gpu_is_h100();
// totalGlobalMem: CUDA_CPU_MEMORY_MIB, else the GPU's.
size_t device_memory_total();
// What the device's GPU holds, over every process that shares it (the context included).
size_t device_memory_used(int device);
// false when the GPU has no room: for the context (charged on first use), an allocation of
// size bytes (the 2 MiB granularity applied), or bytes a library takes (cuBLAS, NCCL).
bool device_context(int device);
bool device_memory_alloc(int device, size_t size);
void device_memory_free(int device, size_t size);
bool device_memory_charge(int device, size_t bytes);
void device_memory_uncharge(int device, size_t bytes);
// The charges' sizes: the context, cuBLAS's default workspace per handle, NCCL's buffers
// per communicator of nranks.
size_t context_bytes();
size_t cublas_workspace_bytes();
size_t nccl_buffer_bytes(int nranks);

// ---- seeded choices ---------------------------------------------------------------------
// One step of splitmix64 (the golden-ratio increment, then its finalizer): the layer's
// random orders and answers hash their inputs and CUDA_CPU_SEED through it.
static inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// ---- bf16, exactly ----------------------------------------------------------------------
static inline float bf16_bits_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
// Round to nearest even; NaN stays NaN (quiet), as __float2bfloat16_rn.
static inline uint16_t float_to_bf16_bits(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

}  // namespace cudacpu

#endif
