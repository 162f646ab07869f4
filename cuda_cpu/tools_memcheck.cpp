/*
 * cuda_cpu/tools_memcheck.cpp: CUDA_CPU_CHECK=memcheck, from the accesses tools.cpp
 * sees, with compute-sanitizer's memcheck's kinds of error:
 *
 *   in a kernel, checked before the access happens (x86 would perform it silently):
 *     misaligned: an access of 2, 4, 8 or 16 bytes at an address that is not a multiple
 *       of its size, in any memory space (a GPU's loads, stores and atomics need natural
 *       alignment); the kernel ends with cudaErrorMisalignedAddress, as on a GPU;
 *     out of bounds: device memory (the layer's arena) outside every live allocation's
 *       [base, base + size), size as asked of cudaMalloc (the layer's rounding to 256
 *       bytes is out of bounds too); the kernel ends with cudaErrorIllegalAddress;
 *   in host code (no kernel running on the thread): any access to device memory, i.e.
 *     cudaMalloc'd memory (pinned host memory is host memory; the layer has no managed
 *     memory): one error line naming the instruction and the allocation, then abort(),
 *     where a GPU's process takes a segmentation fault;
 *   at the MPI boundary (mpi_check.c's wrappers, linked into a tools build with MPI): a
 *     device buffer handed to an MPI call, reported and ended the same way.
 *
 * Host code is seen where it is instrumented: every .cu file and, in a CUDA_CPU_TOOLS=1
 * build, the .c files cuda_cpu/nvcc compiles (zero1/'s, and llmc/'s headers in them).
 * The layer's own runtime, cuBLAS and NCCL are not instrumented: their copies and
 * reductions are the device's work, not host accesses. Neither is its whole-warp work
 * inside a kernel (WMMA), which checks its own pointers.
 */
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "cuda_cpu.h"  // the qualifiers before the toolkit's headers (internal.h)
#include "internal.h"
#include "tools.h"

namespace cudacpu {
void kernel_memcheck_fault(cudaError_t err, const char* message);  // kernel.cpp

namespace tools {

static const char* kind_verb(int kind) { return kind == KIND_LOAD ? "load" : kind == KIND_STORE ? "store" : "atomic"; }

std::string device_address(uintptr_t a, unsigned size) {
    DeviceAllocationInfo d;
    if (!device_allocation_near((const void*)a, &d)) return "device memory outside any allocation";
    long long off = (long long)(a - (uintptr_t)d.base), n = (long long)d.size;
    char buf[512];
    if (off < 0) snprintf(buf, sizeof(buf), "%lld bytes before a device allocation of %lld bytes", -off, n);
    else if (off >= n) snprintf(buf, sizeof(buf), "%lld bytes past the end of a device allocation of %lld bytes", off - n, n);
    else if (off + size > n)
        snprintf(buf, sizeof(buf), "byte %lld of a device allocation of %lld bytes, running %lld bytes past its end", off,
                 n, off + size - n);
    else snprintf(buf, sizeof(buf), "byte %lld of a device allocation of %lld bytes", off, n);
    return std::string(buf) + (d.freed ? " that was freed" : "") + " (cudaMalloc'd at " +
           source_of((uintptr_t)d.made_at) + ")";
}

// Whether [a, a + size) lies in one live allocation; the worker keeps the last few it found.
static bool in_bounds(Worker* w, uintptr_t a, unsigned size) {
    for (int i = 0; i < kBoundsCached; i++) {
        if (a - w->bounds_lo[i] < w->bounds_len[i] && a + size - w->bounds_lo[i] <= w->bounds_len[i]) return true;
    }
    DeviceAllocationInfo d;
    if (!device_allocation_near((const void*)a, &d) || d.freed) return false;
    uintptr_t lo = (uintptr_t)d.base;
    if (a < lo || a + size > lo + d.size) return false;
    int slot = w->bounds_next++ % kBoundsCached;  // allocations are never reused: an entry stays true
    w->bounds_lo[slot] = lo;
    w->bounds_len[slot] = d.size;
    return true;
}

static void kernel_fault(Worker* w, cudaError_t err, const std::string& what, uintptr_t pc) {
    std::string msg = "memcheck: " + what + ", at " + source_of(pc);
    kernel_memcheck_fault(err, msg.c_str());  // does not return
}

void memcheck_access(Worker* w, uintptr_t pc, uintptr_t a, unsigned size, int kind, int space) {
    bool natural = size == 2 || size == 4 || size == 8 || size == 16;
    if (natural && (a & (size - 1))) {
        char what[160];
        snprintf(what, sizeof(what), "misaligned %u-byte %s (address mod %u = %u) at ", size, kind_verb(kind), size,
                 (unsigned)(a & (size - 1)));
        std::string where = space == SPACE_GLOBAL ? device_address(a, size)
                            : space == SPACE_SHARED ? address_of(w, a, SPACE_SHARED)
                            : space == SPACE_LOCAL ? "the thread's local memory"
                                                   : "host memory";
        kernel_fault(w, cudaErrorMisalignedAddress, what + where, pc);
    }
    if (space == SPACE_GLOBAL && size && !in_bounds(w, a, size)) {
        char what[96];
        snprintf(what, sizeof(what), "%u-byte %s out of bounds: ", size, kind_verb(kind));
        kernel_fault(w, cudaErrorIllegalAddress, what + device_address(a, size), pc);
    }
}

void memcheck_host_access(uintptr_t pc, uintptr_t a, unsigned size, int kind) {
    std::string where = device_address(a, size), code = source_of(pc);
    fprintf(stderr, "error: cuda_cpu: memcheck: host code %s %u bytes of device memory, %s, at %s (on a GPU device "
            "memory is not host-addressable: this access crashes the process)\n",
            kind == KIND_LOAD ? "reads" : "writes", size, where.c_str(), code.c_str());
    fflush(stderr);
    abort();
}

}  // namespace tools
void device_arena(uintptr_t* lo, size_t* len);  // runtime.cpp
}  // namespace cudacpu

// mpi_check.c's wrappers: a device buffer handed to MPI, which reads and writes it on the host.
extern "C" void cudacpu_memcheck_mpi_buffer(const char* call, const char* arg, const void* buf, long long bytes,
                                            const void* caller) {
    using namespace cudacpu;
    uintptr_t lo;
    size_t len;
    if (!tools_memcheck()) return;
    device_arena(&lo, &len);
    if ((uintptr_t)buf - lo >= len) return;
    unsigned span = bytes <= 0 ? 1 : bytes > (long long)UINT32_MAX ? UINT32_MAX : (unsigned)bytes;
    std::string where = tools::device_address((uintptr_t)buf, span);
    std::string code = tools::source_of((uintptr_t)caller);
    fprintf(stderr, "error: cuda_cpu: memcheck: %s's %s (%lld bytes) is device memory, %s, passed at %s (MPI reads "
            "and writes its buffers on the host: on a GPU, unless the MPI is CUDA-aware, this crashes the process)\n",
            call, arg, bytes, where.c_str(), code.c_str());
    fflush(stderr);
    abort();
}
