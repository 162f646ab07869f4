/*
 * dev/cuda_cpu/kernel.cpp: kernel launches on the CPU execution layer.
 *
 * A launch is checked as an H100/H200 checks it (block <= 1024 threads and 1024 x 1024 x
 * 64; grid x < 2^31, y and z <= 65535; dynamic shared memory above 48 KiB only after
 * cudaFuncSetAttribute, never above 227 KiB; every pointer argument NULL, device or pinned
 * memory), then queued on its stream. When it runs, the blocks run one after another on
 * the stream's worker thread, and a block's threads are fibers on that thread: each
 * runs until it finishes or reaches __syncthreads or a warp collective, then the next
 * runs. Once every fiber is finished or waiting, the waits that can complete do: a warp
 * collective when every lane its mask names is waiting in the same collective with the
 * same mask, __syncthreads when every thread of the block waits there. Anything else
 * (a lane that returned before a collective its warp-mates wait in, a barrier that some
 * threads left the kernel without reaching, lanes that disagree on the mask) is a fault
 * naming the kernel, the block and the lanes: never a hang. The layer's own whole-warp
 * operations (warp_custom: the WMMA functions of dev/cuda_cpu/include/mma.h) wait the same
 * way with a full mask; the last lane to arrive runs the operation for the whole warp.
 *
 * Orders (CUDA_CPU_ORDER): forward (thread 0 first, block 0 first), reverse, or random
 * (reshuffled every round, seeded by CUDA_CPU_SEED). Code that is correct on a GPU gives
 * the same result in every order; a missing barrier shows in at least one of them.
 * __shared__ memory is poisoned (0xff bytes, a NaN in every float format) at the start
 * of every block, so a read before the block wrote it shows as well.
 */
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xmmintrin.h>

#include "dev/cuda_cpu/cuda_cpu.h"
#include "dev/cuda_cpu/internal.h"
#include "dev/cuda_cpu/tools.h"

namespace cudacpu {

thread_local ThreadCoords coords;
// CUDA_CPU_CHECK / CUDA_CPU_PROFILE (dev/cuda_cpu/tools.h): the launches tell the tools
// where blocks start and where threads meet.
static bool with_tools;

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
#error "dev/cuda_cpu: fibers are written for x86-64 only"
#endif

static const size_t kStackBytes = 128 << 10;
static const size_t kPage = 4096;
static const int kMaxThreads = 1024;
static const int kStacks = kMaxThreads + 1;  // every thread suspended, plus the runner starting the next

enum FiberState { NOT_STARTED, RUNNABLE, AT_BARRIER, AT_WARP, DONE };

struct Fiber {
    void* sp;
    FiberState state;
    uint3 tid;
    // The collective it waits in, and what it gets back.
    WarpOp op;
    unsigned mask;
    uint64_t value;
    int arg, width;
    uint64_t result;
    const char* custom_name;  // WARP_CUSTOM: the operation's name and what completes it
    WarpComplete complete;
};

struct Launch {
    LaunchSite site;
    dim3 grid, block;
    size_t shmem;
    void (*run)(void*);
    std::shared_ptr<void> payload;
};

// What the worker thread is running now: one block of one launch.
struct BlockRun {
    const Launch* launch;
    uint3 block;
    Fiber* fibers;
    int count;
    int current;
    void* scheduler_sp;
    int barrier_result;
    // Counts kept as fibers change state, so that a wait completes the moment its last
    // participant arrives (and that one goes on without a switch).
    int done, at_barrier, at_warps;
    int at_warp[kMaxThreads / 32];
    // Threads start on runners: a runner fiber runs one thread after another (in the start
    // order) on its stack until one of them blocks; that one keeps the stack, and a new
    // runner starts the rest. So a thread that never waits costs a call, not a switch.
    std::vector<int> start_order;  // empty in forward order (thread k starts k-th)
    int next_start;
    int free_stacks[kStacks], num_free, fresh_stacks;  // given back, and never used yet
    int new_runner_stack;  // the stack the runner being started runs on
    const uint3* tids;     // each thread's threadIdx (the same for every block)
    std::vector<std::pair<void*, size_t>> shared;  // static __shared__ seen this block
    size_t shared_bytes;
    std::string fault;  // set when the block cannot go on
};

struct WorkerState {
    char* stacks = nullptr;  // kStacks stacks, each with a guard page below it
    Fiber fibers[kMaxThreads];
    std::vector<char> dynamic_shared;
    BlockRun* block = nullptr;
    sigjmp_buf* escape = nullptr;  // where a fault inside a kernel continues
    char escape_message[1536];
    cudaError_t escape_error = cudaErrorIllegalAddress;  // the sticky error an escape leaves
};
static thread_local WorkerState* worker;

static WorkerState* worker_state() {
    if (worker) return worker;
    WorkerState* w = new WorkerState();
    size_t slot = kStackBytes + kPage;
    void* m = mmap(nullptr, slot * kStacks, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "error: cuda_cpu: cannot map fiber stacks\n");
        abort();
    }
    w->stacks = (char*)m;
    for (int i = 0; i < kStacks; i++) mprotect(w->stacks + i * slot, kPage, PROT_NONE);
    worker = w;
    return w;
}

bool address_in_fiber_guard(const void* p) {
    WorkerState* w = worker;
    if (!w) return false;
    size_t off = (size_t)((const char*)p - w->stacks), slot = kStackBytes + kPage;
    return (const char*)p >= w->stacks && off < slot * kStacks && off % slot < kPage;
}

static void fiber_main();

// Lays out stack i afresh so that switching to it enters fiber_main.
static void* fiber_prepare(int i) {
    WorkerState* w = worker;
    char* top = w->stacks + (size_t)(i + 1) * (kStackBytes + kPage);
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

// The fiber gives the worker back to the block's scheduler.
static void yield_to_scheduler(BlockRun* b) {
    Fiber* f = &b->fibers[b->current];
    cudacpu_switch_context(&f->sp, b->scheduler_sp);
}

static void fiber_main() {
    BlockRun* b = worker->block;
    int stack = b->new_runner_stack;
    void* idle_sp;
    while (b->next_start < b->count) {
        int k = b->next_start++;
        int i = b->start_order.empty() ? k : b->start_order[k];
        b->current = i;
        coords.thread_idx = b->tids[i];
        b->fibers[i].state = RUNNABLE;
        b->launch->run(b->launch->payload.get());
        b->fibers[b->current].state = DONE;
        b->done++;
    }
    b->free_stacks[b->num_free++] = stack;  // nothing left to start: the stack is free again
    cudacpu_switch_context(&idle_sp, b->scheduler_sp);
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
static uint64_t collective_result(const BlockRun* b, int warp_base, int lane, unsigned mask, bool* bad_source,
                                  int* source) {
    const Fiber& f = b->fibers[warp_base + lane];
    int width = f.width, seg = lane & ~(width - 1), src = lane;
    switch (f.op) {
        case WARP_SYNC:
        case WARP_CUSTOM: return 0;
        case WARP_BALLOT:
        case WARP_ANY:
        case WARP_ALL: {
            unsigned bits = 0;
            for (int l = 0; l < 32; l++) {
                if ((mask >> l & 1) && b->fibers[warp_base + l].value) bits |= 1u << l;
            }
            if (f.op == WARP_BALLOT) return bits;
            if (f.op == WARP_ANY) return bits != 0;
            return bits == mask;
        }
        case WARP_SHFL: src = seg + (f.arg & (width - 1)); break;
        case WARP_SHFL_UP: src = lane - f.arg < seg ? lane : lane - f.arg; break;
        case WARP_SHFL_DOWN: src = lane + f.arg >= seg + width ? lane : lane + f.arg; break;
        case WARP_SHFL_XOR: src = lane ^ f.arg; if ((src & ~(width - 1)) > seg) src = lane; break;
    }
    if (src < 0 || src >= 32 || !(mask >> src & 1)) {
        *bad_source = true;
        *source = src;
        return 0;
    }
    return b->fibers[warp_base + src].value;
}

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
            if (g.state == DONE) {
                block_fault(b, "lane %d (thread %d) returned before the %s that lanes %s of its warp wait in", l, t,
                            op_name(f), thread_list(b, [&](int k) {
                                return k / 32 == warp_base / 32 && b->fibers[k].state == AT_WARP;
                            }).c_str());
                return -1;
            }
            if (g.state == AT_BARRIER) {
                block_fault(b, "lane %d (thread %d) waits in __syncthreads while lane %d waits in %s (mask 0x%08x)", l, t,
                            lane, op_name(f), mask);
                return -1;
            }
            if (g.state == RUNNABLE || g.state == NOT_STARTED) ready = false;  // still on its way
            else if (g.op != f.op || g.mask != mask || g.width != f.width || g.complete != f.complete) {
                block_fault(b, "lanes of warp %d disagree: lane %d is in %s (mask 0x%08x), lane %d in %s (mask 0x%08x)",
                            warp_base / 32, lane, op_name(f), mask, l, op_name(g), g.mask);
                return -1;
            }
        }
        if (!ready) return 0;
        if (f.op == WARP_CUSTOM) {
            void* lanes[32];
            for (int l = 0; l < 32; l++) lanes[l] = (void*)(uintptr_t)b->fibers[warp_base + l].value;
            if (with_tools) tools_pause(true);
            const char* err = f.complete(lanes);
            if (with_tools) tools_pause(false);
            if (err) {
                block_fault(b, "warp %d: %s: %s", warp_base / 32, f.custom_name, err);
                return -1;
            }
        }
        for (int l = 0; l < 32; l++) {
            if (!(mask >> l & 1)) continue;
            bool bad = false;
            int src = 0;
            uint64_t r = collective_result(b, warp_base, l, mask, &bad, &src);
            if (bad) {
                block_fault(b, "lane %d (thread %d) in %s reads lane %d, which is not in the mask 0x%08x", l, warp_base + l,
                            op_name(f), src, mask);
                return -1;
            }
            b->fibers[warp_base + l].result = r;
        }
        if (with_tools) tools_warp_met(warp_base / 32, f.op != WARP_CUSTOM);
        for (int l = 0; l < 32; l++) {
            if (mask >> l & 1) b->fibers[warp_base + l].state = RUNNABLE;
        }
        b->at_warp[warp_base / 32] -= __builtin_popcount(mask);
        b->at_warps -= __builtin_popcount(mask);
        return 1;
    }
}

// Completes the collectives whose lanes have all arrived; false when none could.
static bool resolve_warps(BlockRun* b) {
    bool progress = false;
    for (int i = 0; i < b->count && b->fault.empty(); i++) {
        if (b->fibers[i].state != AT_WARP) continue;
        int r = resolve_group(b, i);
        if (r < 0) return false;
        progress |= r > 0;
    }
    return progress;
}

static bool resolve_barrier(BlockRun* b) {
    int waiting = 0, done = 0, count = 0;
    for (int i = 0; i < b->count; i++) {
        waiting += b->fibers[i].state == AT_BARRIER;
        done += b->fibers[i].state == DONE;
    }
    if (waiting == 0) return false;
    if (done > 0) {
        block_fault(b, "__syncthreads reached by threads %s, but threads %s returned without reaching it",
                    thread_list(b, [&](int k) { return b->fibers[k].state == AT_BARRIER; }).c_str(),
                    thread_list(b, [&](int k) { return b->fibers[k].state == DONE; }).c_str());
        return false;
    }
    if (waiting != b->count) return false;
    for (int i = 0; i < b->count; i++) count += b->fibers[i].value != 0;
    b->barrier_result = count;
    if (with_tools) tools_barrier();
    for (int i = 0; i < b->count; i++) b->fibers[i].state = RUNNABLE;
    b->at_barrier = 0;
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

// ---- running a block -------------------------------------------------------------------
static uint64_t launch_counter;

static void run_block(BlockRun* b, uint64_t seed) {
    WorkerState* w = worker;
    for (int i = 0; i < b->count; i++) {
        Fiber& f = w->fibers[i];
        f.state = NOT_STARTED;
        f.tid = b->tids[i];
        f.value = 0;
    }
    b->done = b->at_barrier = b->at_warps = 0;
    memset(b->at_warp, 0, sizeof(b->at_warp));
    b->num_free = b->fresh_stacks = 0;
    if (b->launch->shmem) memset(w->dynamic_shared.data(), 0xff, b->launch->shmem);
    std::vector<int> order;
    coords.block_idx = b->block;
    if (order_setting() == ORDER_FORWARD) b->start_order.clear();
    else make_order(b->start_order, b->count, seed * 1000003u);
    b->next_start = 0;
    for (uint64_t round = 0;; round++) {
        if (round == 0) {  // start every thread, in the start order
            while (b->next_start < b->count) {
                b->new_runner_stack = b->num_free ? b->free_stacks[--b->num_free] : b->fresh_stacks++;
                cudacpu_switch_context(&b->scheduler_sp, fiber_prepare(b->new_runner_stack));
            }
        } else {
            Order o = order_setting();
            if (o == ORDER_RANDOM) make_order(order, b->count, seed * 1000003u + round);
            for (int k = 0; k < b->count; k++) {
                int i = o == ORDER_FORWARD ? k : o == ORDER_REVERSE ? b->count - 1 - k : order[k];
                Fiber& f = b->fibers[i];
                if (f.state != RUNNABLE) continue;
                b->current = i;
                coords.thread_idx = f.tid;
                cudacpu_switch_context(&b->scheduler_sp, f.sp);
            }
        }
        if (b->done == b->count) return;
        // Released during the round (a wait its last participant completed): just go on.
        bool progress = b->done + b->at_barrier + b->at_warps < b->count;
        if (!progress && b->at_warps) progress = resolve_warps(b);
        if (!b->fault.empty()) return;
        if (!progress && b->at_barrier) progress = resolve_barrier(b);
        if (!b->fault.empty()) return;
        if (!progress) {
            block_fault(b, "no thread can go on: threads %s wait in __syncthreads, %s in warp collectives, %s returned",
                        thread_list(b, [&](int k) { return b->fibers[k].state == AT_BARRIER; }).c_str(),
                        thread_list(b, [&](int k) { return b->fibers[k].state == AT_WARP; }).c_str(),
                        thread_list(b, [&](int k) { return b->fibers[k].state == DONE; }).c_str());
            return;
        }
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

static void run_kernel(const Launch* L) {
    FlushDenormals flush(L->site.ftz);
    WorkerState* w = worker_state();
    uint64_t seed = __atomic_add_fetch(&launch_counter, 1, __ATOMIC_RELAXED);
    int count = (int)(L->block.x * L->block.y * L->block.z);
    if (w->dynamic_shared.size() < L->shmem) w->dynamic_shared.resize(L->shmem);
    coords.block_dim = L->block;
    coords.grid_dim = L->grid;
    BlockRun b;
    b.launch = L;
    b.fibers = w->fibers;
    b.count = count;
    std::vector<uint3> tids(count);
    for (int i = 0; i < count; i++) {
        tids[i] = make_uint3(i % L->block.x, (i / L->block.x) % L->block.y, i / (L->block.x * L->block.y));
    }
    b.tids = tids.data();
    with_tools = tools_on();
    if (with_tools) {
        tools_launch_begin(L->site, L->grid, L->block, L->shmem, w->stacks, kStackBytes + kPage, kStacks);
    }
    sigjmp_buf escape;
    if (sigsetjmp(escape, 1) != 0) {  // a memory fault inside the kernel (see kernel_fault_escape)
        w->block = nullptr;
        w->escape = nullptr;
        if (with_tools) tools_launch_end();
        cudaError_t err = w->escape_error;
        w->escape_error = cudaErrorIllegalAddress;
        device_fault(err, "kernel %s (launched at %s:%d) block (%u,%u,%u) thread (%u,%u,%u): %s",
                     L->site.kernel, L->site.file, L->site.line, b.block.x, b.block.y, b.block.z, coords.thread_idx.x,
                     coords.thread_idx.y, coords.thread_idx.z, w->escape_message);
        return;
    }
    w->escape = &escape;
    uint64_t blocks = (uint64_t)L->grid.x * L->grid.y * L->grid.z;
    std::vector<int> order;
    bool permute = order_setting() == ORDER_RANDOM && blocks <= (1u << 22);
    if (permute) make_order(order, (int)blocks, seed);
    for (uint64_t k = 0; k < blocks; k++) {
        uint64_t id = permute ? (uint64_t)order[k] : order_setting() == ORDER_REVERSE ? blocks - 1 - k : k;
        b.block = make_uint3((unsigned)(id % L->grid.x), (unsigned)(id / L->grid.x % L->grid.y),
                             (unsigned)(id / ((uint64_t)L->grid.x * L->grid.y)));
        b.shared.clear();
        b.shared_bytes = 0;
        b.fault.clear();
        w->block = &b;
        if (with_tools) tools_block_begin(id, b.block, count, &b.current, w->dynamic_shared.data(), L->shmem);
        run_block(&b, seed * 7919u + id);
        w->block = nullptr;
        std::string finding;
        if (with_tools && !tools_block_end(&finding) && b.fault.empty()) b.fault = finding;
        if (!b.fault.empty()) {
            w->escape = nullptr;
            if (with_tools) tools_launch_end();
            device_fault(cudaErrorLaunchFailure, "kernel %s (launched at %s:%d) block (%u,%u,%u): %s", L->site.kernel,
                         L->site.file, L->site.line, b.block.x, b.block.y, b.block.z, b.fault.c_str());
            return;
        }
    }
    w->escape = nullptr;
    if (with_tools) tools_launch_end();
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
    b->fibers[b->current].state = AT_BARRIER;
    b->fibers[b->current].value = predicate != 0;
    if (++b->at_barrier == b->count) resolve_barrier(b);
    else yield_to_scheduler(b);
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
        if (g.state != AT_WARP || g.op != f.op || g.mask != f.mask || g.width != f.width || g.complete != f.complete)
            return false;
    }
    return true;
}

static uint64_t warp_wait(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* custom_name,
                          WarpComplete complete) {
    BlockRun* b = running_block(custom_name ? custom_name : op_name(op));
    Fiber& f = b->fibers[b->current];
    f.custom_name = custom_name;
    f.complete = complete;
    if (width < 1 || width > 32 || (width & (width - 1))) {
        block_fault(b, "%s with width %d (must be a power of 2 up to 32)", op_name(op), width);
        width = 32;
    }
    f.state = AT_WARP;
    f.op = op;
    f.mask = mask;
    f.value = value;
    f.arg = arg;
    f.width = width;
    int warp_base = b->current & ~31;
    // The last lane to arrive completes the collective for all and goes on; any other
    // outcome (a lane missing or disagreeing) is sorted out between rounds (resolve_warps).
    int arrived = ++b->at_warp[warp_base / 32];
    b->at_warps++;
    if (arrived == __builtin_popcount(mask) && (mask >> (b->current & 31) & 1) && warp_complete(b, warp_base, f) &&
        resolve_group(b, b->current) > 0) {
        if (b->fibers[b->current].state == RUNNABLE) return b->fibers[b->current].result;
    }
    yield_to_scheduler(b);
    return b->fibers[b->current].result;
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
        if (b->fibers[base + l].state != DONE) m |= 1u << l;
    }
    return m;
}

static const size_t kStaticSharedLimit = 48 << 10;
static const size_t kSharedOptinLimit = 232448;  // 227 KiB, cudaDevAttrMaxSharedMemoryPerBlockOptin

void shared_declared(void* address, size_t bytes, const char* name) {
    BlockRun* b = running_block("__shared__");
    for (auto& s : b->shared) {
        if (s.first == address) return;
    }
    b->shared.push_back({address, bytes});
    b->shared_bytes += bytes;
    if (with_tools) tools_shared_declared(address, bytes, name);
    memset(address, 0xff, bytes);
    if (b->shared_bytes > kStaticSharedLimit) {
        block_fault(b, "static __shared__ memory of %zu bytes (with '%s') exceeds the 48 KiB a kernel may declare "
                    "(nvcc refuses it)", b->shared_bytes, name);
    } else if (b->shared_bytes + b->launch->shmem > kSharedOptinLimit) {
        block_fault(b, "%zu bytes of static and %zu of dynamic shared memory exceed the 227 KiB of a block",
                    b->shared_bytes, b->launch->shmem);
    }
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

// ---- attributes and launches -----------------------------------------------------------------
static std::mutex attr_mu;
static std::unordered_map<const void*, int>* max_dynamic_shared;

int kernel_max_dynamic_shared(const void* func) {
    std::lock_guard<std::mutex> g(attr_mu);
    if (max_dynamic_shared) {
        auto it = max_dynamic_shared->find(func);
        if (it != max_dynamic_shared->end()) return it->second;
    }
    return (int)kStaticSharedLimit;
}

void launch(const LaunchSite& site, const void* func, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
            void (*run)(void*), std::shared_ptr<void> payload, const PointerArg* pointers, int num_pointers) {
    const char* k = site.kernel;
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
    int max_dyn = kernel_max_dynamic_shared(func);
    if (shmem > (size_t)max_dyn) {
        diag("kernel %s (%s:%d): %zu bytes of dynamic shared memory; above %d bytes it needs "
             "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) first", k, site.file, site.line, shmem,
             max_dyn);
        result(cudaErrorInvalidValue);
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
    Launch* L = new Launch{site, grid, block, shmem, run, std::move(payload)};
    std::shared_ptr<Launch> owned(L);
    result(enqueue(stream, site.kernel, [owned]() { run_kernel(owned.get()); }));
}

}  // namespace cudacpu

using namespace cudacpu;

extern "C" cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > kSharedOptinLimit) {
            diag("cudaFuncSetAttribute: %d bytes of dynamic shared memory (at most %zu on this GPU)", value,
                 kSharedOptinLimit);
            return result(cudaErrorInvalidValue);
        }
        std::lock_guard<std::mutex> g(attr_mu);
        if (!max_dynamic_shared) max_dynamic_shared = new std::unordered_map<const void*, int>();
        (*max_dynamic_shared)[func] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return result(cudaErrorInvalidValue);
}
