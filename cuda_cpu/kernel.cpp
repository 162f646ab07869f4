/*
 * cuda_cpu/kernel.cpp: kernel launches on the CPU execution layer.
 *
 * A launch is checked as an H100/H200 checks it (block <= 1024 threads and 1024 x 1024 x
 * 64; grid x < 2^31, y and z <= 65535; the kernel's __launch_bounds__ and shared memory:
 * kernel_attributes.cpp; every pointer argument NULL, device or pinned memory), then
 * queued on its stream. When it runs, its blocks are dealt to workers: the
 * stream's worker thread and, in forward order, helper threads on the cores the process
 * leaves idle (CUDA_CPU_BLOCK_WORKERS). A worker runs one block at a time, and a block's
 * threads are fibers on that worker: each runs until it finishes or reaches __syncthreads
 * or a warp collective, then the next runs. Once every fiber is finished or waiting, the
 * waits that can complete do: a warp collective when every lane its mask names is waiting
 * in the same collective with the same mask, __syncthreads when every thread of the block
 * waits there. Anything else (a lane that returned before a collective its warp-mates wait
 * in, a barrier that some threads left the kernel without reaching, lanes that disagree on
 * the mask) is a fault naming the kernel, the block and the lanes: never a hang. The
 * layer's own whole-warp operations (warp_custom: the WMMA functions of
 * cuda_cpu/include/mma.h) wait the same way with a full mask; the last lane to arrive
 * runs the operation for the whole warp.
 *
 * Orders (CUDA_CPU_ORDER): forward (thread 0 first; block 0 first, the workers taking the
 * blocks in increasing order), reverse, or random (reshuffled every round, seeded by
 * CUDA_CPU_SEED); reverse and random run the blocks one after another on the stream's
 * worker, so that an order that exposes a bug exposes it on every run. Code that is
 * correct on a GPU gives the same result in every order; a missing barrier shows in at
 * least one of them. When blocks fault, the first in the order is reported, as if they ran
 * one after another. __shared__ memory is poisoned (0xff bytes, a NaN in every float
 * format) at the start of every block, so a read before the block wrote it shows as well.
 */
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xmmintrin.h>

#include "cuda_cpu.h"
#include "internal.h"
#include "kernel_attributes.h"
#include "tools.h"

namespace cudacpu {

thread_local ThreadCoords coords;
// CUDA_CPU_CHECK / CUDA_CPU_PROFILE (cuda_cpu/tools.h): the launches tell the tools
// where blocks start and where threads meet. The tools keep one worker's view: with them
// the blocks run one after another.
static std::atomic<bool> with_tools{false};

// ---- fibers ---------------------------------------------------------------------------
// Saves the callee-saved registers on the current stack, stores the stack pointer in *save
// and continues on the stack `next` (as saved by an earlier switch, or laid out by
// fiber_prepare). The floating-point control state (MXCSR, x87 control word) is not
// switched: every fiber of a worker shares it, and device code never changes it.
extern "C" void cudacpu_switch_context(void** save, void* next);
#if defined(__x86_64__)
asm(R"(
.text
.globl cudacpu_switch_context
.type cudacpu_switch_context,@function
cudacpu_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size cudacpu_switch_context, .-cudacpu_switch_context
.section .note.GNU-stack,"",@progbits
.text
)");
#else
#error "cuda_cpu: fibers are written for x86-64 only"
#endif

static const size_t kStackBytes = 128 << 10;
static const size_t kPage = 4096;
// A stack's slot: a guard page, the stack, and a page in which its top starts at one of 64
// cache-line offsets ("colours"). Tops a fixed 132 KiB apart share a few cache sets, and
// with 256 threads waiting in a barrier every switch missed the cache. Under the tools every
// top is at its slot's end: they take a thread's stack offsets to be the same in any slot.
static const size_t kSlotBytes = kPage + kStackBytes + kPage;
static const int kMaxThreads = 1024;
static const int kStacks = kMaxThreads + 1;  // every thread suspended, plus the runner starting the next

enum FiberState : uint8_t { NOT_STARTED, RUNNABLE, AT_BARRIER, AT_WARP, DONE };

struct alignas(64) Fiber {  // one cache line each
    void* sp;
    // The collective it waits in (its value, argument and result: BlockRun's lane_*).
    WarpOp op;
    unsigned mask;
    int width;
    const char* custom_name;  // WARP_CUSTOM: the operation's name and what completes it
    WarpComplete complete;
};

struct Launch {
    LaunchSite site;
    dim3 grid, block;
    size_t shmem;
    void (*run)(void*);
    std::shared_ptr<void> payload;
    KernelAttributes* attributes;  // its registration (kernel_attributes.cpp)
};

// A launch's blocks as the workers running it take them, `chunk` positions at a time (one
// atomic add for several small blocks): position p of the order is block p (forward),
// blocks - 1 - p (reverse) or order[p] (random). A block that faults stops the positions
// after it from being taken; the first fault in the order is the one reported.
struct BlockDeal {
    const Launch* launch;
    uint64_t blocks, seed, chunk = 1;
    bool reverse;
    std::vector<int> order;
    std::atomic<uint64_t> next{0}, stop{UINT64_MAX};
    std::mutex fault_mu;
    uint64_t fault_position = UINT64_MAX;
    cudaError_t fault_error = cudaSuccess;
    std::string fault_message;
};

// What a worker is running now: one block of one launch.
struct BlockRun {
    BlockDeal* deal;
    const Launch* launch;
    uint64_t position;                // in the deal's order
    uint64_t chunk_next, chunk_end;  // the positions this worker took and has not begun
    uint64_t taken;                   // blocks this worker took of the launch
    uint3 block;
    uint64_t block_seed;
    Fiber* fibers;
    FiberState state[kMaxThreads];
    int count;
    int current;
    void* scheduler_sp;
    int barrier_votes, barrier_result;  // __syncthreads_count: threads with a true predicate
    // Counts kept as fibers change state, so that a wait completes the moment its last
    // participant arrives (and that one goes on without a switch).
    int done, at_barrier, at_warps;
    int at_warp[kMaxThreads / 32];
    // Each thread's value and argument in the collective it waits in, and what it gets back:
    // side by side, so that completing a warp's collective reads a few cache lines, not 32.
    uint64_t lane_value[kMaxThreads], lane_result[kMaxThreads];
    int lane_arg[kMaxThreads];
    // Per warp, the collective its first waiting lane is in; `mixed` once a lane waits in
    // another, or with a mask that does not name it (then the last lane checks them all).
    struct WarpKey {
        WarpOp op;
        unsigned mask;
        int width;
        WarpComplete complete;
        bool mixed;
    } warp_key[kMaxThreads / 32];
    // Threads start on runners: a runner fiber runs one thread after another (in the start
    // order) on its stack until one of them blocks; that one keeps the stack, and a new
    // runner starts the rest. So a thread that never waits costs a call, not a switch; and
    // when no thread of a block waited, the runner goes on with the worker's next block.
    std::vector<int> start_order;  // empty in forward order (thread k starts k-th)
    int next_start;
    int free_stacks[kStacks], num_free, fresh_stacks;  // given back, and never used yet
    int new_runner_stack;  // the stack the runner being started runs on
    // Rounds after the first: the threads that can go on run in the round's order, each
    // switching straight to the next (round 0: the runners start the threads).
    uint64_t round;
    int cursor;
    std::vector<int> round_order;  // random order: this round's
    bool launch_done;              // no block left for this worker, or one faulted
    std::vector<uint3> tids;       // each thread's threadIdx (the same for every block)
    std::vector<std::pair<void*, size_t>> shared;  // static __shared__ seen this block
    size_t shared_bytes;
    std::string fault;  // set when the block cannot go on
};

struct WorkerState {
    char* stacks = nullptr;  // kStacks slots of kSlotBytes
    Fiber fibers[kMaxThreads];
    BlockRun run;
    std::vector<char> dynamic_shared;
    BlockRun* block = nullptr;     // &run while a block runs
    sigjmp_buf* escape = nullptr;  // where a fault inside a kernel continues
    char escape_message[1536];
    cudaError_t escape_error = cudaErrorIllegalAddress;  // the sticky error an escape leaves
};
static thread_local WorkerState* worker;

static WorkerState* worker_state() {
    if (worker) return worker;
    WorkerState* w = new WorkerState();
    void* m = mmap(nullptr, kSlotBytes * kStacks, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "error: cuda_cpu: cannot map fiber stacks\n");
        abort();
    }
    w->stacks = (char*)m;
    for (int i = 0; i < kStacks; i++) mprotect(w->stacks + i * kSlotBytes, kPage, PROT_NONE);
    w->run.fibers = w->fibers;
    worker = w;
    return w;
}

bool address_in_fiber_guard(const void* p) {
    WorkerState* w = worker;
    if (!w) return false;
    size_t off = (size_t)((const char*)p - w->stacks);
    return (const char*)p >= w->stacks && off < kSlotBytes * kStacks && off % kSlotBytes < kPage;
}

static void fiber_main();

// Lays out stack i afresh so that switching to it enters fiber_main.
static void* fiber_prepare(int i) {
    WorkerState* w = worker;
    size_t colour = with_tools ? 0 : (size_t)(i * 5 % 64) * 64;
    char* top = w->stacks + (size_t)(i + 1) * kSlotBytes - colour;
    uint64_t* sp = (uint64_t*)top;
    *--sp = 0;                           // fiber_main's return address: it never returns
    *--sp = (uint64_t)(void*)&fiber_main;  // where the switch's `ret` goes
    for (int r = 0; r < 6; r++) *--sp = 0;  // rbp rbx r12 r13 r14 r15
    return sp;
}

static BlockRun* running_block(const char* what) {
    WorkerState* w = worker;
    if (!w || !w->block) {
        fprintf(stderr, "error: cuda_cpu: %s called outside a kernel\n", what);
        abort();
    }
    return w->block;
}

// The next fiber of this round's order that can run (b->current and threadIdx set to it);
// false when none is left.
static inline __attribute__((always_inline)) bool next_runnable(BlockRun* b) {
    while (b->cursor < b->count) {
        int k = b->cursor++;
        int i = b->round_order.empty() ? k : b->round_order[k];
        if (b->state[i] == RUNNABLE) {
            b->current = i;
            coords.thread_idx = b->tids[i];
            if (b->cursor < b->count) {  // the likely next one: its saved registers and frames into the cache
                const char* sp = (const char*)b->fibers[b->round_order.empty() ? b->cursor : b->round_order[b->cursor]].sp;
                __builtin_prefetch(sp);
                __builtin_prefetch(sp + 64);
                __builtin_prefetch(sp + 128);
            }
            return true;
        }
    }
    return false;
}

// The running fiber stops (it waits, or its runner has nothing left to start; its stack
// pointer goes to *save): the worker goes on with what the scheduler would run next, without
// passing through it: in round 0 a new runner for the threads not yet started, in a later
// round the next fiber that can run; the scheduler when neither is left.
static inline __attribute__((always_inline)) void leave_fiber(BlockRun* b, void** save) {
    if (!b->launch_done && b->round == 0 && b->next_start < b->count) {
        b->new_runner_stack = b->num_free ? b->free_stacks[--b->num_free] : b->fresh_stacks++;
        cudacpu_switch_context(save, fiber_prepare(b->new_runner_stack));
    } else if (b->round > 0 && next_runnable(b)) {
        cudacpu_switch_context(save, b->fibers[b->current].sp);
    } else {
        cudacpu_switch_context(save, b->scheduler_sp);
    }
}

static bool finish_block(BlockRun* b);

static void fiber_main() {
    BlockRun* b = worker->block;
    int stack = b->new_runner_stack;
    for (;;) {
        void* payload = b->launch->payload.get();
        void (*run)(void*) = b->launch->run;
        const int* order = b->start_order.empty() ? nullptr : b->start_order.data();  // this block's
        bool flat = b->launch->block.y == 1 && b->launch->block.z == 1;              // threadIdx (i, 0, 0)
        while (b->next_start < b->count) {
            int k = b->next_start++;
            int i = order ? order[k] : k;
            b->current = i;
            if (flat) coords.thread_idx.x = i;
            else coords.thread_idx = b->tids[i];
            b->state[i] = RUNNABLE;
            run(payload);
            b->state[i] = DONE;  // the thread started here, whatever waits it made on the way
            b->done++;
        }
        // Every thread of the block ran to its end in round 0: this runner takes the next block.
        if (b->round != 0 || b->done != b->count || with_tools) break;
        if (!finish_block(b)) {
            b->launch_done = true;
            break;
        }
    }
    b->free_stacks[b->num_free++] = stack;  // nothing left to start: the stack is free again
    void* idle_sp;
    leave_fiber(b, &idle_sp);
}

// The lanes a mask names (a popcount that needs no CPU instruction of its own).
static inline int lanes_in(unsigned m) {
    m = m - ((m >> 1) & 0x55555555u);
    m = (m & 0x33333333u) + ((m >> 2) & 0x33333333u);
    return (int)((((m + (m >> 4)) & 0x0f0f0f0fu) * 0x01010101u) >> 24);
}

// ---- what a waiting fiber is doing, for messages ------------------------------------
static const char* op_name(WarpOp op) {
    switch (op) {
        case WARP_SYNC: return "__syncwarp";
        case WARP_SHFL: return "__shfl_sync";
        case WARP_SHFL_UP: return "__shfl_up_sync";
        case WARP_SHFL_DOWN: return "__shfl_down_sync";
        case WARP_SHFL_XOR: return "__shfl_xor_sync";
        case WARP_BALLOT: return "__ballot_sync";
        case WARP_ANY: return "__any_sync";
        case WARP_ALL: return "__all_sync";
        case WARP_CUSTOM: return "a whole-warp operation";
    }
    return "?";
}
static const char* op_name(const Fiber& f) { return f.op == WARP_CUSTOM ? f.custom_name : op_name(f.op); }

// "0-31,64" for the threads (linear indices) where pick(i) holds.
template <typename Pick>
static std::string thread_list(const BlockRun* b, Pick pick) {
    std::string s;
    for (int i = 0; i < b->count;) {
        if (!pick(i)) {
            i++;
            continue;
        }
        int j = i;
        while (j + 1 < b->count && pick(j + 1)) j++;
        char part[32];
        snprintf(part, sizeof(part), i == j ? "%d" : "%d-%d", i, j);
        if (!s.empty()) s += ",";
        s += part;
        i = j + 1;
    }
    return s.empty() ? "none" : s;
}

static void block_fault(BlockRun* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void block_fault(BlockRun* b, const char* fmt, ...) {
    if (!b->fault.empty()) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    b->fault = msg;
}

// ---- resolving waits -------------------------------------------------------------------
// Lane l of warp w is fiber w*32 + l; lanes past the block's end do not exist.
// f: the collective, as every lane of the mask waits in it (the same op, mask and width).
static uint64_t collective_result(const BlockRun* b, const Fiber& f, int warp_base, int lane, unsigned mask,
                                  bool* bad_source, int* source) {
    int width = f.width, seg = lane & ~(width - 1), src = lane, arg = b->lane_arg[warp_base + lane];
    switch (f.op) {
        case WARP_SYNC:
        case WARP_CUSTOM: return 0;
        case WARP_BALLOT:
        case WARP_ANY:
        case WARP_ALL: {
            unsigned bits = 0;
            for (int l = 0; l < 32; l++) {
                if ((mask >> l & 1) && b->lane_value[warp_base + l]) bits |= 1u << l;
            }
            if (f.op == WARP_BALLOT) return bits;
            if (f.op == WARP_ANY) return bits != 0;
            return bits == mask;
        }
        case WARP_SHFL: src = seg + (arg & (width - 1)); break;
        case WARP_SHFL_UP: src = lane - arg < seg ? lane : lane - arg; break;
        case WARP_SHFL_DOWN: src = lane + arg >= seg + width ? lane : lane + arg; break;
        case WARP_SHFL_XOR: src = lane ^ arg; if ((src & ~(width - 1)) > seg) src = lane; break;
    }
    if (src < 0 || src >= 32 || !(mask >> src & 1)) {
        *bad_source = true;
        *source = src;
        return 0;
    }
    return b->lane_value[warp_base + src];
}

static bool complete_group(BlockRun* b, int warp_base, const Fiber& f);

// Completes the collective fiber i waits in if every lane of its mask has arrived: 1 done,
// 0 not yet, -1 a fault (recorded in b->fault).
static int resolve_group(BlockRun* b, int i) {
    {
        Fiber& f = b->fibers[i];
        int warp_base = i & ~31, lane = i & 31;
        unsigned mask = f.mask;
        if (!(mask >> lane & 1)) {
            block_fault(b, "lane %d (thread %d) calls %s with mask 0x%08x, which does not name it", lane, i,
                        op_name(f), mask);
            return -1;
        }
        bool ready = true;
        for (int l = 0; l < 32 && ready; l++) {
            if (!(mask >> l & 1)) continue;
            int t = warp_base + l;
            if (t >= b->count) {
                block_fault(b, "%s with mask 0x%08x names lane %d of warp %d, which does not exist (block of %d threads)",
                            op_name(f), mask, l, warp_base / 32, b->count);
                return -1;
            }
            const Fiber& g = b->fibers[t];
            FiberState gs = b->state[t];
            if (gs == DONE) {
                block_fault(b, "lane %d (thread %d) returned before the %s that lanes %s of its warp wait in", l, t,
                            op_name(f), thread_list(b, [&](int k) {
                                return k / 32 == warp_base / 32 && b->state[k] == AT_WARP;
                            }).c_str());
                return -1;
            }
            if (gs == AT_BARRIER) {
                block_fault(b, "lane %d (thread %d) waits in __syncthreads while lane %d waits in %s (mask 0x%08x)", l, t,
                            lane, op_name(f), mask);
                return -1;
            }
            if (gs == RUNNABLE || gs == NOT_STARTED) ready = false;  // still on its way
            else if (g.op != f.op || g.mask != mask || g.width != f.width || g.complete != f.complete) {
                block_fault(b, "lanes of warp %d disagree: lane %d is in %s (mask 0x%08x), lane %d in %s (mask 0x%08x)",
                            warp_base / 32, lane, op_name(f), mask, l, op_name(g), g.mask);
                return -1;
            }
        }
        if (!ready) return 0;
        return complete_group(b, warp_base, f) ? 1 : -1;
    }
}

// Every lane of f's mask waits in the same collective as f: each gets its result and goes
// on (false: a fault, recorded in b->fault).
static bool complete_group(BlockRun* b, int warp_base, const Fiber& f) {
    {
        unsigned mask = f.mask;
        if (f.op == WARP_CUSTOM) {
            void* lanes[32];
            for (int l = 0; l < 32; l++) lanes[l] = (void*)(uintptr_t)b->lane_value[warp_base + l];
            if (with_tools) tools_pause(true);
            const char* err = f.complete(lanes);
            if (with_tools) tools_pause(false);
            if (err) {
                block_fault(b, "warp %d: %s: %s", warp_base / 32, f.custom_name, err);
                return false;
            }
        }
        for (int l = 0; l < 32; l++) {
            if (!(mask >> l & 1)) continue;
            bool bad = false;
            int src = 0;
            uint64_t r = collective_result(b, f, warp_base, l, mask, &bad, &src);
            if (bad) {
                block_fault(b, "lane %d (thread %d) in %s reads lane %d, which is not in the mask 0x%08x", l, warp_base + l,
                            op_name(f), src, mask);
                return false;
            }
            b->lane_result[warp_base + l] = r;
        }
        if (with_tools) tools_warp_met(warp_base / 32, f.op != WARP_CUSTOM);
        for (int l = 0; l < 32; l++) {
            if (mask >> l & 1) b->state[warp_base + l] = RUNNABLE;
        }
        b->at_warp[warp_base / 32] -= lanes_in(mask);
        b->at_warps -= lanes_in(mask);
        return true;
    }
}

// Completes the collectives whose lanes have all arrived; false when none could.
static bool resolve_warps(BlockRun* b) {
    bool progress = false;
    for (int i = 0; i < b->count && b->fault.empty(); i++) {
        if (b->state[i] != AT_WARP) continue;
        int r = resolve_group(b, i);
        if (r < 0) return false;
        progress |= r > 0;
    }
    return progress;
}

// Every thread of the block waits in __syncthreads: they all go on.
static void complete_barrier(BlockRun* b) {
    b->barrier_result = b->barrier_votes;
    b->barrier_votes = 0;
    if (with_tools) tools_barrier();
    memset(b->state, RUNNABLE, b->count);
    b->at_barrier = 0;
}

static bool resolve_barrier(BlockRun* b) {
    int waiting = 0, done = 0;
    for (int i = 0; i < b->count; i++) {
        waiting += b->state[i] == AT_BARRIER;
        done += b->state[i] == DONE;
    }
    if (waiting == 0) return false;
    if (done > 0) {
        block_fault(b, "__syncthreads reached by threads %s, but threads %s returned without reaching it",
                    thread_list(b, [&](int k) { return b->state[k] == AT_BARRIER; }).c_str(),
                    thread_list(b, [&](int k) { return b->state[k] == DONE; }).c_str());
        return false;
    }
    if (waiting != b->count) return false;
    complete_barrier(b);
    return true;
}

// ---- orders ------------------------------------------------------------------------------
enum Order { ORDER_FORWARD, ORDER_REVERSE, ORDER_RANDOM };
static Order order_setting() {
    static const char* const names[] = {"forward", "reverse", "random"};
    static Order order = (Order)env_choice("ORDER", names, 3);
    return order;
}

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// order[0..n) in the setting's order; seed makes a random order reproducible.
static void make_order(std::vector<int>& order, int n, uint64_t seed) {
    order.resize(n);
    Order o = order_setting();
    for (int i = 0; i < n; i++) order[i] = o == ORDER_REVERSE ? n - 1 - i : i;
    if (o != ORDER_RANDOM) return;
    uint64_t s = mix(seed ^ (uint64_t)env_long("SEED", 1));
    for (int i = n - 1; i > 0; i--) {
        s = mix(s);
        int j = (int)(s % (uint64_t)(i + 1));
        std::swap(order[i], order[j]);
    }
}


// ---- running blocks --------------------------------------------------------------------------
static uint64_t launch_counter;

// The rounds after round 0, until the block's threads have all finished or it faults.
static void run_rounds(BlockRun* b) {
    for (uint64_t round = 1;; round++) {
        if (b->done == b->count || !b->fault.empty()) return;
        // Released during the round (a wait its last participant completed): just go on.
        bool progress = b->done + b->at_barrier + b->at_warps < b->count;
        if (!progress && b->at_warps) progress = resolve_warps(b);
        if (!b->fault.empty()) return;
        if (!progress && b->at_barrier) progress = resolve_barrier(b);
        if (!b->fault.empty()) return;
        if (!progress) {
            block_fault(b, "no thread can go on: threads %s wait in __syncthreads, %s in warp collectives, %s returned",
                        thread_list(b, [&](int k) { return b->state[k] == AT_BARRIER; }).c_str(),
                        thread_list(b, [&](int k) { return b->state[k] == AT_WARP; }).c_str(),
                        thread_list(b, [&](int k) { return b->state[k] == DONE; }).c_str());
            return;
        }
        b->round = round;
        Order o = order_setting();
        if (o == ORDER_FORWARD) b->round_order.clear();
        else if (o == ORDER_REVERSE) make_order(b->round_order, b->count, 0);
        else make_order(b->round_order, b->count, b->block_seed * 1000003u + round);
        b->cursor = 0;
        if (next_runnable(b)) cudacpu_switch_context(&b->scheduler_sp, b->fibers[b->current].sp);
    }
}

// Takes the deal's next block for this worker and sets it up; false when none is left.
static bool begin_block(BlockRun* b) {
    BlockDeal* d = b->deal;
    if (b->chunk_next == b->chunk_end) {
        b->chunk_next = d->next.fetch_add(d->chunk, std::memory_order_relaxed);
        b->chunk_end = b->chunk_next + d->chunk;
    }
    uint64_t p = b->chunk_next++;
    if (p >= d->blocks || p >= d->stop.load(std::memory_order_relaxed)) return false;
    uint64_t id = !d->order.empty() ? (uint64_t)d->order[p] : d->reverse ? d->blocks - 1 - p : p;
    const Launch* L = b->launch;
    b->position = p;
    b->taken++;
    b->block = make_uint3((unsigned)(id % L->grid.x), (unsigned)(id / L->grid.x % L->grid.y),
                          (unsigned)(id / ((uint64_t)L->grid.x * L->grid.y)));
    b->block_seed = d->seed * 7919u + id;
    coords.block_idx = b->block;
    memset(b->state, NOT_STARTED, b->count);
    b->done = b->at_barrier = b->at_warps = b->barrier_votes = 0;
    memset(b->at_warp, 0, sizeof(b->at_warp));
    b->round = 0;
    b->next_start = 0;
    if (order_setting() == ORDER_FORWARD) b->start_order.clear();
    else make_order(b->start_order, b->count, b->block_seed * 1000003u);
    b->shared.clear();
    b->shared_bytes = 0;
    b->fault.clear();
    if (L->shmem) memset(worker->dynamic_shared.data(), 0xff, L->shmem);
    if (with_tools) tools_block_begin(id, b->block, b->count, &b->current, worker->dynamic_shared.data(), L->shmem);
    return true;
}

// A fault of the block at `position` in the deal's order: the first in the order is kept,
// and no block after it is taken any more.
static void record_fault(BlockDeal* d, uint64_t position, cudaError_t err, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void record_fault(BlockDeal* d, uint64_t position, cudaError_t err, const char* fmt, ...) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> g(d->fault_mu);
    if (position >= d->fault_position) return;
    d->fault_position = position;
    d->fault_error = err;
    d->fault_message = msg;
    d->stop.store(position, std::memory_order_relaxed);
}

// The block has ended (every thread finished, or a fault): its fault is recorded, or the
// worker's next block begins. False when the worker has no block left to run.
static bool finish_block(BlockRun* b) {
    std::string finding;
    if (with_tools && !tools_block_end(&finding) && b->fault.empty()) b->fault = finding;
    if (!b->fault.empty()) {
        const LaunchSite& s = b->launch->site;
        record_fault(b->deal, b->position, cudaErrorLaunchFailure, "kernel %s (launched at %s:%d) block (%u,%u,%u): %s",
                     s.kernel, s.file, s.line, b->block.x, b->block.y, b->block.z, b->fault.c_str());
        return false;
    }
    return begin_block(b);
}

// Runs blocks of the worker's current one on until the deal has none left for it or one faults.
static void schedule(BlockRun* b) {
    for (;;) {
        while (!b->launch_done && b->next_start < b->count) {  // round 0: runners start the threads
            b->new_runner_stack = b->num_free ? b->free_stacks[--b->num_free] : b->fresh_stacks++;
            cudacpu_switch_context(&b->scheduler_sp, fiber_prepare(b->new_runner_stack));
        }
        if (b->launch_done) return;
        run_rounds(b);
        if (!finish_block(b)) return;
    }
}

// While a kernel of a --use_fast_math translation unit runs under GPU numerics (cuda_cpu.h's
// CUDA_CPU_FTZ): SSE's flush-to-zero and denormals-are-zero, nvcc's -ftz=true (for doubles
// too, which a GPU does not flush).
struct FlushDenormals {
    unsigned saved;
    bool on;
    explicit FlushDenormals(bool ftz) : saved(_mm_getcsr()), on(ftz) {
        if (on) _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
    }
    ~FlushDenormals() {
        if (on) _mm_setcsr(saved);
    }
};

// This thread's share of the deal: blocks taken one at a time until none is left. Returns
// how many it took.
static uint64_t run_blocks(BlockDeal* d) {
    FlushDenormals flush(d->launch->site.ftz);  // MXCSR is each thread's own
    WorkerState* w = worker_state();
    BlockRun* b = &w->run;
    const Launch* L = d->launch;
    b->deal = d;
    b->launch = L;
    b->count = (int)(L->block.x * L->block.y * L->block.z);
    b->tids.resize(b->count);
    for (int i = 0; i < b->count; i++) {
        b->tids[i] = make_uint3(i % L->block.x, (i / L->block.x) % L->block.y, i / (L->block.x * L->block.y));
    }
    b->num_free = b->fresh_stacks = 0;
    b->chunk_next = b->chunk_end = 0;
    b->taken = 0;
    b->launch_done = false;
    if (w->dynamic_shared.size() < L->shmem) w->dynamic_shared.resize(L->shmem);
    coords.block_dim = L->block;
    coords.grid_dim = L->grid;
    coords.thread_idx = make_uint3(0, 0, 0);
    sigjmp_buf escape;
    if (sigsetjmp(escape, 1) != 0) {  // a memory fault inside the kernel (see kernel_fault_escape)
        w->block = nullptr;
        w->escape = nullptr;
        cudaError_t err = w->escape_error;
        w->escape_error = cudaErrorIllegalAddress;
        record_fault(d, b->position, err, "kernel %s (launched at %s:%d) block (%u,%u,%u) thread (%u,%u,%u): %s",
                     L->site.kernel, L->site.file, L->site.line, b->block.x, b->block.y, b->block.z, coords.thread_idx.x,
                     coords.thread_idx.y, coords.thread_idx.z, w->escape_message);
        return b->taken;
    }
    w->escape = &escape;
    w->block = b;
    if (begin_block(b)) schedule(b);
    w->block = nullptr;
    w->escape = nullptr;
    return b->taken;
}

// ---- parallel blocks ---------------------------------------------------------------------------
// How many threads run a launch's blocks: CUDA_CPU_BLOCK_WORKERS, else the cores of the
// process's CPU mask, shared with the other ranks on this host where the mask is the whole
// machine's (ranks the launcher did not bind to cores of their own).
static int block_workers() {
    static const int workers = [] {
        const char* v = getenv("CUDA_CPU_BLOCK_WORKERS");
        if (v && *v) {
            long set = env_long("BLOCK_WORKERS", 0);
            if (set < 1 || set > 256) {
                fprintf(stderr, "error: cuda_cpu: CUDA_CPU_BLOCK_WORKERS=%ld: use 1 to 256\n", set);
                exit(1);
            }
            return (int)set;
        }
        cpu_set_t mask;
        long cores = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : 1;
        if (cores >= sysconf(_SC_NPROCESSORS_ONLN)) {
            for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
                long ranks = getenv(v) ? atol(getenv(v)) : 0;
                if (ranks > 1) {
                    cores /= ranks;
                    break;
                }
            }
        }
        return (int)std::max(1L, std::min(cores, 256L));
    }();
    return workers;
}

// Helper threads, started as launches want them, that take blocks beside the stream's
// worker; one launch at a time has them (another stream's runs alone meanwhile).
struct BlockPool {
    std::mutex mu;
    std::condition_variable wake, left;
    BlockDeal* deal = nullptr;
    uint64_t generation = 0;
    int wanted = 0, joined = 0, started = 0;
};
static BlockPool* pool = new BlockPool();  // never destroyed: helpers wait on it at exit

static void helper_main() {
    device_thread_setup();
    std::unique_lock<std::mutex> lk(pool->mu);
    uint64_t seen = 0;
    for (;;) {
        pool->wake.wait(lk, [&] { return pool->deal && pool->generation != seen; });
        seen = pool->generation;
        if (pool->joined >= pool->wanted) continue;
        BlockDeal* d = pool->deal;
        pool->joined++;
        lk.unlock();
        run_blocks(d);
        lk.lock();
        if (--pool->joined == 0) pool->left.notify_all();
    }
}

// Offers d's blocks to `helpers` helper threads; false when another launch has them.
static bool pool_open(BlockDeal* d, int helpers) {
    std::lock_guard<std::mutex> g(pool->mu);
    if (pool->deal) return false;
    for (; pool->started < helpers; pool->started++) std::thread(helper_main).detach();
    pool->deal = d;
    pool->generation++;
    pool->wanted = helpers;
    pool->wake.notify_all();
    return true;
}

// No helper joins any more; returns once those that joined have finished their blocks.
static void pool_close() {
    std::unique_lock<std::mutex> lk(pool->mu);
    pool->deal = nullptr;
    pool->left.wait(lk, [] { return pool->joined == 0; });
}

// ---- when helpers pay --------------------------------------------------------------------------
// Offering a launch to the helpers costs a wake-up (microseconds), and a helper that the
// machine's other work preempts in the middle of a block holds the launch up until it runs
// again. So a launch site whose blocks took, the last time, less than kHelpedSeconds in all
// runs alone; and when a launch waited long for its helpers (longer than kStallSeconds and
// than a quarter of its own time), they sit out a while (10 ms, doubling up to 1 s).
static const double kHelpedSeconds = 100e-6, kStallSeconds = 200e-6;
struct HelpRecord {
    std::mutex mu;
    std::unordered_map<uint64_t, double> block_seconds;  // by launch site
    double quiet_until = 0, quiet_for = 0.01;
};
static HelpRecord* help = new HelpRecord();  // never destroyed: stream workers may use it at exit

static double now_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static uint64_t site_key(const Launch* L) { return (uint64_t)(uintptr_t)L->site.file * 31 + (uint64_t)L->site.line; }

static bool help_pays(const Launch* L, uint64_t blocks, double now) {
    std::lock_guard<std::mutex> g(help->mu);
    if (now < help->quiet_until) return false;
    auto it = help->block_seconds.find(site_key(L));
    return it == help->block_seconds.end() || it->second * (double)blocks >= kHelpedSeconds;
}

// own: the blocks the launch's own worker ran, in own_seconds; waited: then for the helpers.
static void help_learn(const Launch* L, uint64_t own, double own_seconds, bool helped, double waited) {
    std::lock_guard<std::mutex> g(help->mu);
    if (own) help->block_seconds[site_key(L)] = own_seconds / (double)own;
    if (!helped) return;
    if (waited > kStallSeconds && waited > own_seconds / 4) {
        help->quiet_until = now_seconds() + help->quiet_for;
        help->quiet_for = std::min(help->quiet_for * 2, 1.0);
    } else {
        help->quiet_for = std::max(help->quiet_for / 2, 0.01);
    }
}

static void run_kernel(const Launch* L) {
    with_tools = tools_on();
    BlockDeal d;
    d.launch = L;
    d.seed = __atomic_add_fetch(&launch_counter, 1, __ATOMIC_RELAXED);
    d.blocks = (uint64_t)L->grid.x * L->grid.y * L->grid.z;
    Order o = order_setting();
    d.reverse = o == ORDER_REVERSE;
    if (o == ORDER_RANDOM && d.blocks <= (1u << 22)) make_order(d.order, (int)d.blocks, d.seed);
    WorkerState* w = worker_state();
    if (with_tools) tools_launch_begin(L->site, L->grid, L->block, L->shmem, w->stacks, kSlotBytes, kStacks);
    int helpers = with_tools || o != ORDER_FORWARD ? 0 : (int)std::min<uint64_t>(block_workers() - 1, d.blocks - 1);
    double start = now_seconds();
    bool shared = helpers > 0 && help_pays(L, d.blocks, start);
    // A few chunks per worker: the blocks still spread over the workers as they finish.
    if (shared) d.chunk = std::max<uint64_t>(1, std::min<uint64_t>(8, d.blocks / (8 * (helpers + 1))));
    shared = shared && pool_open(&d, helpers);
    uint64_t own = run_blocks(&d);
    double own_end = now_seconds();
    if (shared) pool_close();
    if (helpers > 0) help_learn(L, own, own_end - start, shared, now_seconds() - own_end);
    if (with_tools) tools_launch_end();
    if (d.fault_error != cudaSuccess) device_fault(d.fault_error, "%s", d.fault_message.c_str());
}

// Called by the SIGSEGV handler (runtime.cpp): inside a kernel on this thread, the fault
// ends the kernel with `message` (sticky cudaErrorIllegalAddress) instead of the process.
void kernel_fault_escape(const char* message) {
    WorkerState* w = worker;
    if (!w || !w->escape) return;
    snprintf(w->escape_message, sizeof(w->escape_message), "%s", message);
    siglongjmp(*w->escape, 1);
}

// memcheck's faults (tools.cpp): the access has not happened; the kernel ends with `err`.
void kernel_memcheck_fault(cudaError_t err, const char* message) {
    WorkerState* w = worker;
    if (!w || !w->escape) return;
    w->escape_error = err;
    kernel_fault_escape(message);
}

bool in_kernel() { return worker && worker->block; }

// ---- device-side entry points ---------------------------------------------------------------
// The last thread to arrive completes the barrier and goes on; the others wait.
static int arrive_at_barrier(int predicate) {
    BlockRun* b = running_block("__syncthreads");
    b->state[b->current] = AT_BARRIER;
    b->barrier_votes += predicate != 0;
    if (++b->at_barrier == b->count) complete_barrier(b);
    else leave_fiber(b, &b->fibers[b->current].sp);
    return b->barrier_result;
}

void block_barrier() { arrive_at_barrier(0); }
int block_barrier_count(int predicate) { return arrive_at_barrier(predicate); }

// Whether every lane named in the current fiber's mask waits in the same collective.
static bool warp_complete(const BlockRun* b, int warp_base, const Fiber& f) {
    for (int l = 0; l < 32; l++) {
        if (!(f.mask >> l & 1)) continue;
        if (warp_base + l >= b->count) return false;
        const Fiber& g = b->fibers[warp_base + l];
        if (b->state[warp_base + l] != AT_WARP || g.op != f.op || g.mask != f.mask || g.width != f.width || g.complete != f.complete)
            return false;
    }
    return true;
}

static inline __attribute__((always_inline)) uint64_t warp_wait(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* custom_name,
                          WarpComplete complete) {
    BlockRun* b = worker && worker->block ? worker->block : running_block(custom_name ? custom_name : op_name(op));
    Fiber& f = b->fibers[b->current];
    f.custom_name = custom_name;
    f.complete = complete;
    if (width < 1 || width > 32 || (width & (width - 1))) {
        block_fault(b, "%s with width %d (must be a power of 2 up to 32)", op_name(op), width);
        width = 32;
    }
    b->state[b->current] = AT_WARP;
    f.op = op;
    f.mask = mask;
    b->lane_value[b->current] = value;
    b->lane_arg[b->current] = arg;
    f.width = width;
    int warp_base = b->current & ~31;
    int arrived = ++b->at_warp[warp_base / 32];
    b->at_warps++;
    bool named = mask >> (b->current & 31) & 1;
    BlockRun::WarpKey& key = b->warp_key[warp_base / 32];
    if (arrived == 1) key = BlockRun::WarpKey{op, mask, width, complete, !named};
    else if (key.op != op || key.mask != mask || key.width != width || key.complete != complete || !named) key.mixed = true;
    // The last lane to arrive completes the collective for all and goes on; any other
    // outcome (a lane missing or disagreeing) is sorted out between rounds (resolve_warps).
    if (arrived == lanes_in(mask) && named) {
        bool completed = !key.mixed ? complete_group(b, warp_base, f)
                                    : warp_complete(b, warp_base, f) && resolve_group(b, b->current) > 0;
        if (completed && b->state[b->current] == RUNNABLE) return b->lane_result[b->current];
    }
    leave_fiber(b, &f.sp);
    return b->lane_result[b->current];
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
    return warp_wait(op, mask, value, arg, width, nullptr, nullptr);
}

void warp_custom(const char* name, WarpComplete complete, void* lane_data) {
    warp_wait(WARP_CUSTOM, 0xffffffffu, (uint64_t)(uintptr_t)lane_data, 0, 32, name, complete);
}

// The lanes of this warp that have not returned.
unsigned active_mask() {
    BlockRun* b = running_block("__activemask");
    int base = b->current & ~31;
    unsigned m = 0;
    for (int l = 0; l < 32 && base + l < b->count; l++) {
        if (b->state[base + l] != DONE) m |= 1u << l;
    }
    return m;
}

void shared_declared(void* address, size_t bytes, const char* name) {
    BlockRun* b = running_block("__shared__");
    for (auto& s : b->shared) {
        if (s.first == address) return;
    }
    b->shared.push_back({address, bytes});
    b->shared_bytes += bytes;
    if (with_tools) tools_shared_declared(address, bytes, name);
    memset(address, 0xff, bytes);
    char why[320];
    if (!block_shared_fits(b->launch->attributes, b->shared_bytes, b->launch->shmem, why, sizeof(why)))
        block_fault(b, "%s (with '%s')", why, name);
}

void* dynamic_shared() {
    running_block("extern __shared__");
    return worker->dynamic_shared.data();
}

long long clock_cycles() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    // The emulated SM clock: 1.98 GHz (H100/H200 boost).
    return (long long)((ts.tv_sec * 1000000000.0 + ts.tv_nsec) * 1.98);
}

// ---- launches ------------------------------------------------------------------------------
void launch(const LaunchSite& site, const void* func, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
            void (*run)(void*), std::shared_ptr<void> payload, const PointerArg* pointers, int num_pointers) {
    const char* k = site.kernel;
    block_workers();  // its setting checked at the first launch, on the calling thread
    if (sticky_error() != cudaSuccess) {
        result(sticky_error());
        return;
    }
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64) {
        diag("kernel %s (%s:%d): block (%u,%u,%u) = %llu threads; a block has 1 to 1024 threads, at most "
             "1024 x 1024 x 64", k, site.file, site.line, block.x, block.y, block.z, (unsigned long long)threads);
        result(cudaErrorInvalidConfiguration);
        return;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        diag("kernel %s (%s:%d): grid (%u,%u,%u); x is 1 to 2^31-1, y and z 1 to 65535", k, site.file, site.line, grid.x,
             grid.y, grid.z);
        result(cudaErrorInvalidConfiguration);
        return;
    }
    KernelAttributes* attributes = kernel_attributes(func);
    if (cudaError_t e = launch_resources(site, attributes, threads, shmem)) {
        result(e);
        return;
    }
    for (int i = 0; i < num_pointers; i++) {
        const void* p = pointers[i].value;
        if (!p) continue;
        MemRange r = lookup(p);
        const char* why = r.freed ? "in freed device memory"
                          : r.kind == MEM_HOST ? "not device memory (a host pointer: a GPU cannot dereference it)"
                                               : nullptr;
        if (why) {
            diag("kernel %s (%s:%d): argument %d is %p, %s", k, site.file, site.line, pointers[i].index + 1, p, why);
            result(cudaErrorInvalidValue);
            return;
        }
    }
    Launch* L = new Launch{site, grid, block, shmem, run, std::move(payload), attributes};
    std::shared_ptr<Launch> owned(L);
    result(enqueue(stream, site.kernel, [owned]() { run_kernel(owned.get()); }));
}

}  // namespace cudacpu
