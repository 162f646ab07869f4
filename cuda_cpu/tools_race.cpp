/*
 * cuda_cpu/tools_race.cpp: the sanitizer (CUDA_CPU_CHECK=race), from the accesses
 * tools.cpp sees. Two rules, by shadow memory (one cell per 2 bytes, so that threads that
 * write neighbouring bf16 values do not share a cell):
 *
 *   shared memory, within a block: a cell written by one thread and read or written by
 *     another in the same barrier interval (between two __syncthreads) is a hazard, RAW,
 *     WAR or WAW, unless both threads are in one warp and a warp collective (__syncwarp,
 *     a shuffle, a vote) of that warp completed between the two accesses: the definition
 *     of compute-sanitizer's racecheck. Atomics are left out, as in global memory. Each cell keeps its last writer and up to two
 *     readers (the first, and the latest other one) with the interval and the warp's
 *     collective count at the access.
 *   global memory, across the blocks of one launch: a cell written by one block and read
 *     or written by another is a race (no order exists between blocks); atomics are left
 *     out. Each cell keeps its last writer and its first reader (and whether another block
 *     read it too), tagged with the launch.
 *
 * Order does not matter: every pair of conflicting accesses is found whichever runs first,
 * so the thread and block orders that hide a race on the layer's results do not hide it here.
 */
#include <sys/mman.h>

#include <cinttypes>
#include <cstdio>
#include <mutex>

#include "cuda_cpu.h"  // the qualifiers before the toolkit's headers (internal.h)
#include "internal.h"
#include "tools.h"

namespace cudacpu {
namespace tools {

// Who accessed a cell: the instruction (return address, 47 bits) and the thread (16 bits).
static inline uint64_t who(uintptr_t pc, int thread) { return (uint64_t)pc << 16 | (uint64_t)(uint16_t)thread; }
static inline uintptr_t who_pc(uint64_t w) { return (uintptr_t)(w >> 16); }
static inline int who_thread(uint64_t w) { return (int)(w & 0xffff); }

struct SharedAccessor {
    uint32_t interval, warp_meets;  // the barrier interval, and the warp's collectives so far
    uint64_t who;
};
struct SharedCell {
    SharedAccessor w, r1, r2;
};

struct GlobalAccessor {
    uint32_t launch, block;  // block: bit 31 set = read by other blocks too
    uint64_t who;
};
struct GlobalCell {
    GlobalAccessor w, r;
};
static const uint32_t kOtherBlocks = 0x80000000u;

struct RaceState {
    std::vector<SharedCell> shared;
    uint32_t interval = 0;
    uint32_t warp_meets[32] = {};
};

RaceState* race_new() { return new RaceState(); }

// ---- the global shadow: one cell per 2 bytes of the device arena, mapped on first use ----------
// The arena's address space is 4 TiB; the shadow covers the first kCovered bytes of it
// (allocations are carved from its start, never reused): 16 bytes of shadow address space
// per byte, touched only where kernels touch device memory.
static const size_t kCovered = (size_t)256 << 30;
static GlobalCell* global_shadow;
static uintptr_t global_lo;
static std::once_flag global_once;

static GlobalCell* global_cells(Worker* w) {
    std::call_once(global_once, [w] {
        size_t bytes = kCovered / 2 * sizeof(GlobalCell);
        void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "error: cuda_cpu: CUDA_CPU_CHECK=race cannot map its shadow memory\n");
            exit(1);
        }
        global_lo = w->arena_lo;
        global_shadow = (GlobalCell*)m;
    });
    return global_shadow;
}

}  // namespace tools

// Freed device memory: its cells are stale anyway (launch tags); give back their pages.
void race_forget_range(const void* base, size_t bytes) {
    using namespace tools;
    if (!global_shadow) return;
    size_t off = (uintptr_t)base - global_lo;
    if (off >= kCovered) return;
    uintptr_t lo = (uintptr_t)(global_shadow + off / 2), hi = (uintptr_t)(global_shadow + (off + bytes) / 2);
    lo = (lo + 4095) & ~(uintptr_t)4095;
    hi &= ~(uintptr_t)4095;
    if (hi > lo) madvise((void*)lo, hi - lo, MADV_DONTNEED);
}

namespace tools {

static const char* hazard_name(bool first_writes, bool second_writes) {
    return first_writes ? (second_writes ? "write after write" : "read after write") : "write after read";
}

// ---- shared memory ------------------------------------------------------------------------------
void race_block_begin(Worker* w) { w->race->interval++; }
void race_barrier(Worker* w) { w->race->interval++; }
void race_warp_met(Worker* w, int warp) { w->race->warp_meets[warp]++; }

// Whether an earlier access a (in this interval) is unordered with one by `thread` now.
static inline bool unordered(const RaceState* rs, const SharedAccessor& a, int thread) {
    if (a.interval != rs->interval || a.who == 0) return false;
    int other = who_thread(a.who);
    if (other == thread) return false;
    if (other >> 5 == thread >> 5 && a.warp_meets != rs->warp_meets[thread >> 5]) return false;
    return true;
}

static void shared_finding(Worker* w, uintptr_t pc, uintptr_t addr, unsigned size, bool writes, int thread,
                           const SharedAccessor& other, bool other_writes) {
    if (!finding_wanted(w, pc, who_pc(other.who))) return;
    int t2 = who_thread(other.who);
    bool same_warp = t2 >> 5 == thread >> 5;
    char msg[1024];
    snprintf(msg, sizeof(msg),
             "shared-memory hazard (%s): thread %d (warp %d) %s %u bytes of %s at %s; thread %d (warp %d) %s it at %s, "
             "with no __syncthreads%s between the two",
             hazard_name(other_writes, writes), thread, thread >> 5, writes ? "writes" : "reads", size,
             address_of(w, addr, SPACE_SHARED).c_str(), source_of(pc).c_str(), t2, t2 >> 5,
             other_writes ? "wrote" : "read", source_of(who_pc(other.who)).c_str(),
             same_warp ? " nor __syncwarp (or another collective of the warp)" : "");
    report_finding(w, msg);
}

static void shared_access(Worker* w, uintptr_t pc, uintptr_t addr, unsigned size, int kind, int thread) {
    RaceState* rs = w->race;
    size_t offset = 0;
    int i;
    for (i = 0; i < w->num_shared; i++) {
        if (addr >= w->shared[i].lo && addr < w->shared[i].hi) break;
    }
    if (i == w->num_shared) return;
    offset = w->shared[i].shadow + (addr - w->shared[i].lo);
    size_t first = offset / 2, last = (offset + size - 1) / 2;
    if (rs->shared.size() <= last) rs->shared.resize(std::max(last + 1, (w->shared_bytes + 1) / 2));
    SharedAccessor me{rs->interval, rs->warp_meets[thread >> 5], who(pc, thread)};
    bool writes = kind != KIND_LOAD;
    for (size_t c = first; c <= last; c++) {
        SharedCell& cell = rs->shared[c];
        if (unordered(rs, cell.w, thread)) {
            shared_finding(w, pc, addr, size, writes, thread, cell.w, true);
        } else if (writes && unordered(rs, cell.r1, thread)) {
            shared_finding(w, pc, addr, size, true, thread, cell.r1, false);
        } else if (writes && unordered(rs, cell.r2, thread)) {
            shared_finding(w, pc, addr, size, true, thread, cell.r2, false);
        }
        if (writes) {
            cell.w = me;
        } else if (cell.r1.interval != rs->interval || who_thread(cell.r1.who) == thread) {
            cell.r1 = me;
        } else {
            cell.r2 = me;
        }
    }
}

// ---- global memory -------------------------------------------------------------------------------
static void global_finding(Worker* w, uintptr_t pc, uintptr_t addr, unsigned size, bool writes, int thread,
                           const GlobalAccessor& other, bool other_writes) {
    if (!finding_wanted(w, pc, who_pc(other.who))) return;
    uint32_t other_block = other.block & ~kOtherBlocks;
    bool several = !other_writes && (other.block & kOtherBlocks);
    char msg[1280];
    snprintf(msg, sizeof(msg),
             "global-memory race between blocks (%s): block %s thread %d %s %u bytes at %s at %s; block %s thread %d "
             "%s it at %s%s, in the same launch and without atomics",
             hazard_name(other_writes, writes), block_name(w, w->block_linear).c_str(), thread,
             writes ? "writes" : "reads", size, address_of(w, addr, SPACE_GLOBAL).c_str(), source_of(pc).c_str(),
             block_name(w, other_block).c_str(), who_thread(other.who), other_writes ? "wrote" : "read",
             source_of(who_pc(other.who)).c_str(), several ? " (and other blocks read it too)" : "");
    report_finding(w, msg);
}

static void global_access(Worker* w, uintptr_t pc, uintptr_t addr, unsigned size, int kind, int thread) {
    GlobalCell* cells = global_cells(w);
    size_t offset = addr - global_lo;
    if (offset + size > kCovered) return;
    uint32_t launch = w->launch_id, block = (uint32_t)w->block_linear & ~kOtherBlocks;
    bool writes = kind == KIND_STORE;
    for (size_t c = offset / 2; c <= (offset + size - 1) / 2; c++) {
        GlobalCell& cell = cells[c];
        if (cell.w.launch == launch && cell.w.block != block) {
            global_finding(w, pc, addr, size, writes, thread, cell.w, true);
        } else if (writes && cell.r.launch == launch &&
                   ((cell.r.block & ~kOtherBlocks) != block || (cell.r.block & kOtherBlocks))) {
            global_finding(w, pc, addr, size, true, thread, cell.r, false);
        }
        if (writes) {
            cell.w = GlobalAccessor{launch, block, who(pc, thread)};
        } else if (cell.r.launch != launch) {
            cell.r = GlobalAccessor{launch, block, who(pc, thread)};
        } else if ((cell.r.block & ~kOtherBlocks) != block) {
            cell.r.block |= kOtherBlocks;
        }
    }
}

void race_access(Worker* w, uintptr_t pc, uintptr_t addr, unsigned size, int space, int kind, int thread) {
    if (size == 0 || kind == KIND_ATOMIC) return;  // atomics never race with one another
    if (space == SPACE_SHARED) shared_access(w, pc, addr, size, kind, thread);
    else if (space == SPACE_GLOBAL) global_access(w, pc, addr, size, kind, thread);
}

}  // namespace tools
}  // namespace cudacpu
