/*
 * cuda_cpu/tools.h: what the layer's sanitizer and profiler share (tools.cpp,
 * tools_profile.cpp, tools_race.cpp) and the events kernel.cpp sends them. The user's
 * guide is docs/cuda_cpu.md ("Sanitizer and profiler").
 *
 * How accesses are seen: a build with CUDA_CPU_TOOLS=1 compiles every .cu translation
 * unit with g++'s -fsanitize=address instrumentation in its call form, which calls
 * __asan_load4(addr), __asan_store2(addr), __asan_loadN(addr, n) ... before each load and
 * store; tools.cpp defines those entry points (the ASan runtime is never linked), so each
 * access reaches the layer with its address, size and return address (the instruction).
 * g++ leaves out only accesses at constant offsets into the function's own variables
 * (registers, on a GPU) and to global or thread_local variables; __shared__ variables are
 * reached through an opaque pointer under the tools (rewrite.py, CUDA_CPU_SHARED_VIEW), so
 * that none of their accesses is left out, and atomics report themselves (cuda_cpu.h).
 * Inside a kernel an access is attributed to the running fiber (thread, warp, block) and
 * its address classified: device memory is global, a registered __shared__ range is
 * shared, the fibers' stacks are local (the thread's variables at run-time offsets, which
 * nvcc puts in local memory too); anything else (__constant__ data) is not counted.
 */
#ifndef CUDA_CPU_TOOLS_H
#define CUDA_CPU_TOOLS_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_cpu.h"

namespace cudacpu {

// ---- settings -----------------------------------------------------------------------
// CUDA_CPU_CHECK=race|memcheck|race,memcheck and CUDA_CPU_PROFILE=FILE, read once. Any of
// them in a binary built without CUDA_CPU_TOOLS=1 ends the program with a message saying how
// to build it.
bool tools_race();
bool tools_profile();
bool tools_memcheck();
bool tools_on();

// ---- events from kernel.cpp (only while tools_on()) --------------------------------------
// stacks: the worker's fiber stacks, `count` slots of `slot` bytes (a thread's frames lie at
// the same offsets in whichever slot it runs on).
void tools_launch_begin(const LaunchSite& site, dim3 grid, dim3 block, size_t shmem, const void* stacks, size_t slot,
                        int count);
// Before block `linear` (blockIdx) runs; *current is the running thread's linear index.
void tools_block_begin(uint64_t linear, uint3 block_idx, int threads, const int* current, void* dynamic_shared,
                       size_t shmem);
void tools_shared_declared(void* address, size_t bytes, const char* name);
// A warp collective of warp `warp` completed (all lanes met): their accesses up to here
// form warp-wide requests; whole-warp operations (WMMA, custom) order nothing between lanes.
void tools_warp_met(int warp, bool collective);
void tools_barrier();  // __syncthreads completed
// Around the layer's own work inside a kernel (a whole-warp operation's completion): its
// accesses are not the kernel's (the operation reports the hardware's: tools_modeled).
void tools_pause(bool pause);
// After the block: false with *fault set when the sanitizer found a hazard in it.
bool tools_block_end(std::string* fault);
void tools_launch_end();

// ---- shared between the tools' files -----------------------------------------------------
namespace tools {

enum Space : uint8_t { SPACE_GLOBAL, SPACE_SHARED, SPACE_LOCAL, NUM_SPACES };
enum Kind : uint8_t { KIND_LOAD, KIND_STORE, KIND_ATOMIC, NUM_KINDS };

// One access of one thread, as recorded for the profiler.
struct Access {
    uintptr_t pc;
    uintptr_t addr;
    uint16_t thread;
    uint16_t size;
    uint8_t space, kind;
    uint16_t request;  // modeled accesses (WMMA): which of the operation's requests
};

struct SharedRange {
    uintptr_t lo, hi;
    const char* name;
    size_t shadow;  // its first byte's index in the racecheck's shadow of shared memory
};

// Traffic of one space and kind: warp-wide requests, and the units the hardware moves
// (32-byte sectors for global, wavefronts for shared), with the ideal count for the bytes.
struct Traffic {
    uint64_t requests = 0, units = 0, ideal = 0, bytes = 0;
    void add(const Traffic& o) {
        requests += o.requests;
        units += o.units;
        ideal += o.ideal;
        bytes += o.bytes;
    }
};

// Per instruction (return address), for the table's worst source lines. Stack accesses: the
// bytes [lo, hi) of the thread's stack slot it touched, and whether at one offset always
// (a register on a GPU) or at several (an array indexed at run time: local memory there too,
// and so is every access to the bytes such an instruction touches: tools_profile.cpp).
struct PcTraffic {
    uint8_t space, kind;
    bool offsets_vary;
    int64_t first_offset = -1, lo = 0, hi = 0;
    Traffic t;
};

struct KernelStats {
    uint64_t launches = 0, blocks = 0, threads = 0, wmma_mma = 0;
    Traffic traffic[NUM_SPACES][NUM_KINDS];
    std::unordered_map<uintptr_t, PcTraffic> pcs;
    void add(const KernelStats& o);
};

struct RaceState;  // tools_race.cpp
static const int kBoundsCached = 8;  // memcheck: live allocations a worker remembers

// The tools' view of one worker thread (a stream's), valid while a block runs.
struct Worker {
    // the launch
    const char* kernel;
    const char* file;
    int line;
    dim3 grid, block_dim;
    uint32_t launch_id;
    uintptr_t arena_lo, arena_len, stack_lo, stack_len, stack_slot;
    // the block
    uint64_t block_linear;
    uint3 block_idx;
    int threads;
    const int* current;
    SharedRange shared[64];
    int num_shared;
    size_t shared_bytes;
    bool profiling, in_block;
    // the profiler: each warp's accesses since its lanes last met, and the launch's sums
    std::vector<Access> pending[32];
    KernelStats stats;
    // the sanitizer
    RaceState* race;
    std::string finding;  // the block's first, with the others printed as found
    int findings_printed;
    // memcheck: whether it is on, and allocations [lo, lo + len) found valid
    bool memcheck;
    uintptr_t bounds_lo[kBoundsCached], bounds_len[kBoundsCached];
    unsigned bounds_next;
};

// The calling thread's Worker while a block runs with the tools on, else NULL.
extern thread_local Worker* active;

// tools_profile.cpp
void profile_flush(Worker* w, int warp);
void profile_modeled(Worker* w, uintptr_t pc, const Access* a, int n);
void profile_launch_end(Worker* w);
void profile_write(const char* file);
// tools_race.cpp
RaceState* race_new();
void race_block_begin(Worker* w);
void race_access(Worker* w, uintptr_t pc, uintptr_t addr, unsigned size, int space, int kind, int thread);
void race_warp_met(Worker* w, int warp);
void race_barrier(Worker* w);
// tools_memcheck.cpp: memcheck_access returns only for a valid access (else the kernel
// ends); memcheck_host_access reports and aborts.
void memcheck_access(Worker* w, uintptr_t pc, uintptr_t addr, unsigned size, int kind, int space);
void memcheck_host_access(uintptr_t pc, uintptr_t addr, unsigned size, int kind);
// Where a device address lies, in words: "byte 8 of a device allocation of 64 bytes
// (cudaMalloc'd at file:line)", "4 bytes past the end of ...".
std::string device_address(uintptr_t addr, unsigned size);
// tools.cpp: where an instruction or an address is, in words.
std::string source_of(uintptr_t pc);
void source_prefetch(const std::vector<uintptr_t>& pcs);  // one addr2line run for many
std::string address_of(Worker* w, uintptr_t addr, int space);
std::string block_name(const Worker* w, uint64_t linear);
// A hazard found by the sanitizer, once per pair of instructions (finding_wanted says
// whether to describe it): the block's first becomes its fault, the next few are printed.
bool finding_wanted(Worker* w, uintptr_t pc_a, uintptr_t pc_b);
void report_finding(Worker* w, const std::string& message);

}  // namespace tools
}  // namespace cudacpu

#endif
