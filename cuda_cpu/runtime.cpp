/*
 * cuda_cpu/runtime.cpp: the CUDA runtime of the CPU execution layer: devices, memory,
 * streams, events, copies and fills, errors. The rules it follows are the runtime
 * documentation's ("API synchronization behavior", "Stream synchronization behavior",
 * cudaGetLastError, cudaStreamQuery, cudaEventQuery); where the documentation leaves room
 * the layer takes the strict reading, so that code relying on luck fails here.
 *
 * Memory. Device memory comes from one reserved arena, never reused: each allocation gets
 * its own pages, ends exactly at a PROT_NONE guard page (the size rounded up to 256
 * bytes, the rest a canary checked at cudaFree), is filled with 0xff bytes (a NaN in
 * every float format, -1 as an integer), and is unmapped at cudaFree, so an access past
 * its end or after its free faults where it happens. What the GPU counts as taken (the
 * 2 MiB granularity, the context, libraries' buffers) is device_memory.cpp's. Pinned host memory
 * (cudaMallocHost) is ordinary memory that the layer knows. CUDA_CPU_PROTECT=1 tags the
 * arena with a memory protection key that only the layer's worker threads may use: host
 * code that dereferences device memory faults, as it would on a GPU.
 *
 * Streams. Each stream is an in-order queue. CUDA_CPU_EXEC=async (default): a worker
 * thread per stream runs it; eager: every operation runs before its call returns; lazy:
 * nothing runs until something waits for it (a synchronize, a query, a blocking copy),
 * and then only what that wait needs. The legacy default stream waits for all earlier
 * work of the blocking streams on its device, and they for its earlier work;
 * non-blocking streams are not ordered with it.
 *
 * Copies (the documented behaviour, taken strictly): from pageable memory the source is
 * staged when the call is made; to pageable memory the call returns when the copy is
 * done; to pinned memory it does not (the destination keeps what it held until the copy
 * runs, which in lazy mode is when something waits for it). Every copy checks its
 * direction and that both ranges lie in one allocation. The driver's two freedoms with
 * pageable memory are switches: CUDA_CPU_PAGEABLE_D2H=async (cudaMemcpyAsync to pageable
 * memory returns at once, as to pinned memory) and CUDA_CPU_PAGEABLE_H2D=stream (a copy
 * from pageable memory first waits for its stream's earlier work).
 */
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

namespace cudacpu {
void kernel_fault_escape(const char* message);  // kernel.cpp
bool address_in_fiber_guard(const void* p);     // kernel.cpp
bool in_kernel();                               // kernel.cpp
bool tools_on();                                // tools.cpp
void race_forget_range(const void* base, size_t bytes);  // tools_race.cpp
}  // namespace cudacpu

namespace cudacpu {

// ---- settings and errors -------------------------------------------------------------
long env_long(const char* name, long def) {
    char key[96];
    snprintf(key, sizeof(key), "CUDA_CPU_%s", name);
    const char* v = getenv(key);
    if (!v || !*v) return def;
    char* end;
    long x = strtol(v, &end, 10);
    if (*end) {
        fprintf(stderr, "error: cuda_cpu: %s=%s is not an integer\n", key, v);
        exit(1);
    }
    return x;
}

int env_choice(const char* name, const char* const* choices, int count) {
    char key[96];
    snprintf(key, sizeof(key), "CUDA_CPU_%s", name);
    const char* v = getenv(key);
    if (!v || !*v) return 0;
    for (int i = 0; i < count; i++) {
        if (strcmp(v, choices[i]) == 0) return i;
    }
    fprintf(stderr, "error: cuda_cpu: %s=%s: use one of", key, v);
    for (int i = 0; i < count; i++) fprintf(stderr, " %s", choices[i]);
    fprintf(stderr, "\n");
    exit(1);
}

ExecMode exec_mode() {
    static const char* const names[] = {"async", "eager", "lazy"};
    static ExecMode mode = (ExecMode)env_choice("EXEC", names, 3);
    return mode;
}

static thread_local cudaError_t last_error = cudaSuccess;
static std::atomic<int> sticky{cudaSuccess};

void diag(const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda_cpu: %s\n", msg);
}

void device_fault(cudaError_t err, const char* fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    int expected = cudaSuccess;
    if (sticky.compare_exchange_strong(expected, (int)err)) fprintf(stderr, "error: cuda_cpu: %s\n", msg);
}

cudaError_t sticky_error() { return (cudaError_t)sticky.load(); }

cudaError_t result(cudaError_t err) {
    if (err != cudaSuccess) last_error = err;
    return err;
}

// ---- memory ----------------------------------------------------------------------------
static const size_t kPage = 4096;
static const size_t kArenaBytes = (size_t)1 << 42;  // address space only (4 TiB)

struct Allocation {
    char* base;
    size_t size;      // as asked
    size_t rounded;   // to 256 bytes: the canary runs from size to rounded
    MemKind kind;
    int device;
    bool freed;
    const void* made_at;  // cudaMalloc's return address (the sanitizer names it)
};

struct Memory {
    std::mutex mu;
    std::map<uintptr_t, Allocation> allocs;  // by base
    char* arena = nullptr;
    size_t cursor = 0;
    int pkey = -1;
};
static Memory* mem;

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static Allocation* find_locked(const void* p) {
    auto it = mem->allocs.upper_bound((uintptr_t)p);
    if (it == mem->allocs.begin()) return nullptr;
    --it;
    Allocation& a = it->second;
    if ((const char*)p >= a.base && (const char*)p <= a.base + a.size) return &a;  // the end pointer counts
    return nullptr;
}

MemRange lookup(const void* p) {
    MemRange r = {MEM_HOST, nullptr, 0, 0, false};
    if (!mem) return r;
    std::lock_guard<std::mutex> g(mem->mu);
    Allocation* a = find_locked(p);
    if (a) r = {a->kind, a->base, a->size, a->device, a->freed};
    return r;
}

static const char* kind_name(MemKind k) {
    return k == MEM_DEVICE ? "device memory" : k == MEM_PINNED ? "pinned host memory" : "pageable host memory";
}

bool check_device_range(const void* p, size_t bytes, const char* what, bool allow_pinned) {
    MemRange r = lookup(p);
    if (r.freed) {
        diag("%s: %p lies in %s that was freed", what, p, kind_name(r.kind));
        return false;
    }
    if (r.kind == MEM_HOST || (r.kind == MEM_PINNED && !allow_pinned)) {
        diag("%s: %p is %s, not device memory", what, p, kind_name(r.kind));
        return false;
    }
    size_t off = (size_t)((const char*)p - r.base);
    if (bytes > r.size - off) {
        diag("%s: %zu bytes at offset %zu of an allocation of %zu bytes run %zu bytes past its end", what, bytes, off,
             r.size, bytes - (r.size - off));
        return false;
    }
    return true;
}

void device_arena(uintptr_t* lo, size_t* len) {
    *lo = mem ? (uintptr_t)mem->arena : 0;
    *len = mem ? kArenaBytes : 0;
}

// The device allocation that holds p, else the nearest one below it, else the first above
// (memcheck names it); false when there is none.
bool device_allocation_near(const void* p, DeviceAllocationInfo* out) {
    std::lock_guard<std::mutex> g(mem->mu);
    auto above = mem->allocs.upper_bound((uintptr_t)p);
    for (auto it = above; it != mem->allocs.begin();) {
        --it;
        if (it->second.kind != MEM_DEVICE) continue;
        *out = {it->second.base, it->second.size, it->second.made_at, it->second.freed};
        return true;
    }
    for (auto it = above; it != mem->allocs.end(); ++it) {
        if (it->second.kind != MEM_DEVICE) continue;
        *out = {it->second.base, it->second.size, it->second.made_at, it->second.freed};
        return true;
    }
    return false;
}

static bool protect_mode() { return mem && mem->pkey >= 0; }

static thread_local int access_depth = 0;
static void set_access(bool on) {
    if (protect_mode()) pkey_set(mem->pkey, on ? 0 : PKEY_DISABLE_ACCESS);
}
DeviceAccess::DeviceAccess() {
    if (access_depth++ == 0) set_access(true);
}
DeviceAccess::~DeviceAccess() {
    if (--access_depth == 0) set_access(false);
}

// A worker thread runs device operations only: it always has access.
static void grant_worker_access() {
    access_depth = 1 << 20;
    set_access(true);
}

static cudaError_t device_alloc(void** out, size_t size, int device, const void* made_at) {
    size_t rounded = round_up(size ? size : 1, 256);
    size_t pages = round_up(rounded, kPage);
    std::lock_guard<std::mutex> g(mem->mu);
    if (mem->cursor + pages + kPage > kArenaBytes || !device_memory_alloc(device, size)) return cudaErrorMemoryAllocation;
    char* region = mem->arena + mem->cursor;
    mem->cursor += pages + kPage;  // the page after stays PROT_NONE: the guard
    int rc = mem->pkey >= 0 ? pkey_mprotect(region, pages, PROT_READ | PROT_WRITE, mem->pkey)
                            : mprotect(region, pages, PROT_READ | PROT_WRITE);
    if (rc != 0) {
        device_memory_free(device, size);
        return cudaErrorMemoryAllocation;
    }
    char* base = region + (pages - rounded);  // ends where the guard page starts
    {
        DeviceAccess access;
        memset(base, 0xff, size);
        memset(base + size, 0xa5, rounded - size);
    }
    mem->allocs[(uintptr_t)base] = Allocation{base, size, rounded, MEM_DEVICE, device, false, made_at};
    *out = base;
    return cudaSuccess;
}

static cudaError_t device_free(void* p) {
    std::lock_guard<std::mutex> g(mem->mu);
    auto it = mem->allocs.find((uintptr_t)p);
    if (it == mem->allocs.end() || it->second.kind != MEM_DEVICE) {
        diag("cudaFree(%p): not the start of a device allocation", p);
        return cudaErrorInvalidValue;
    }
    Allocation& a = it->second;
    if (a.freed) {
        diag("cudaFree(%p): freed twice", p);
        return cudaErrorInvalidValue;
    }
    {
        DeviceAccess access;
        for (size_t i = a.size; i < a.rounded; i++) {
            if ((unsigned char)a.base[i] != 0xa5) {
                device_fault(cudaErrorIllegalAddress, "device memory written past the end of an allocation of %zu bytes "
                             "(byte %zu; found at cudaFree)", a.size, i);
                break;
            }
        }
    }
    char* region = (char*)((uintptr_t)a.base & ~(uintptr_t)(kPage - 1));
    size_t pages = round_up(a.rounded, kPage);
    madvise(region, pages, MADV_DONTNEED);
    mprotect(region, pages, PROT_NONE);
    race_forget_range(region, pages);
    a.freed = true;
    device_memory_free(a.device, a.size);
    return cudaSuccess;
}

// A fault's address in words, for the messages of the SIGSEGV handler.
static void describe_address(const void* p, char* out, size_t n) {
    if (address_in_fiber_guard(p)) {
        snprintf(out, n, "stack overflow of a device thread (fiber stacks are 128 KiB)");
        return;
    }
    if (!mem || (const char*)p < mem->arena || (const char*)p >= mem->arena + kArenaBytes) {
        snprintf(out, n, "invalid address %p (not device memory)", p);
        return;
    }
    // Another worker's fault may hold the lock for a moment (blocks run on several at once);
    // this thread may hold it itself (a fault inside the layer's lookup): wait 0.1 s at most.
    bool locked = mem->mu.try_lock();
    for (int i = 0; i < 1000 && !locked; i++) {
        struct timespec pause = {0, 100000};
        nanosleep(&pause, nullptr);
        locked = mem->mu.try_lock();
    }
    if (!locked) {
        snprintf(out, n, "address %p in device memory", p);
        return;
    }
    auto it = mem->allocs.upper_bound((uintptr_t)p);
    const Allocation* a = it == mem->allocs.begin() ? nullptr : &(--it)->second;
    if (a && (const char*)p >= a->base && (const char*)p < a->base + a->rounded + kPage) {
        if (a->freed) snprintf(out, n, "address %p in an allocation of %zu bytes that was freed", p, a->size);
        else if ((const char*)p >= a->base + a->size)
            snprintf(out, n, "address %p is %zu bytes past the end of an allocation of %zu bytes", p,
                     (size_t)((const char*)p - a->base - a->size), a->size);
        else snprintf(out, n, "address %p inside an allocation of %zu bytes (device memory)", p, a->size);
    } else {
        snprintf(out, n, "address %p in device address space outside any allocation", p);
    }
    mem->mu.unlock();
}

static void on_segv(int sig, siginfo_t* info, void* ctx) {
    char what[256];
    if (info->si_code == SI_KERNEL && info->si_addr == nullptr)  // x86's general protection: no address
        snprintf(what, sizeof(what), "a general-protection fault (on x86 most likely an aligned 16-byte move at a "
                 "misaligned address: CUDA_CPU_CHECK=memcheck names the access)");
    else describe_address(info->si_addr, what, sizeof(what));
    if (in_kernel()) kernel_fault_escape(what);  // does not return inside a kernel
    char line[512];
    int protect = protect_mode() && mem && (const char*)info->si_addr >= mem->arena &&
                  (const char*)info->si_addr < mem->arena + kArenaBytes;
    int len = snprintf(line, sizeof(line), "error: cuda_cpu: %s: %s%s\n", protect ? "host code touched device memory"
                       : "segmentation fault", what, protect ? " (on a GPU this dereference crashes too)" : "");
    if (write(2, line, (size_t)len) < 0) {
    }
    signal(sig, SIG_DFL);  // returning re-runs the access, which now ends the process
}

static void install_signal_stack() {
    stack_t ss;
    ss.ss_size = 64 << 10;
    ss.ss_sp = malloc(ss.ss_size);
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
}

void device_thread_setup() {
    grant_worker_access();
    install_signal_stack();
}

static void init_memory() {
    mem = new Memory();
    void* a = mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a == MAP_FAILED) {
        fprintf(stderr, "error: cuda_cpu: cannot reserve the device address space\n");
        exit(1);
    }
    mem->arena = (char*)a;
    if (env_long("PROTECT", 0)) {
        mem->pkey = pkey_alloc(0, PKEY_DISABLE_ACCESS);
        if (mem->pkey < 0) {
            fprintf(stderr, "error: cuda_cpu: CUDA_CPU_PROTECT=1 needs memory protection keys, which this CPU or "
                    "kernel does not offer (%s)\n", strerror(errno));
            exit(1);
        }
    }
    install_signal_stack();
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
}

// GPU numerics are a build setting (cuda_cpu.h): each translation unit reports whether it has
// them before main; CUDA_CPU_NUMERICS in the environment, where set, must match the build.
static bool numerics_gpu_seen = false;
void numerics_built(bool gpu) { numerics_gpu_seen |= gpu; }
bool numerics_gpu() { return numerics_gpu_seen; }  // tensorcore.cpp

static void check_numerics() {
    const char* v = getenv("CUDA_CPU_NUMERICS");
    if (!v || !*v) return;
    bool gpu = strcmp(v, "gpu") == 0;
    if (!gpu && strcmp(v, "ieee") != 0) {
        fprintf(stderr, "error: cuda_cpu: CUDA_CPU_NUMERICS=%s: use ieee or gpu\n", v);
        exit(1);
    }
    if (gpu == numerics_gpu_seen) return;
    fprintf(stderr, "error: cuda_cpu: CUDA_CPU_NUMERICS=%s, but this program was built with %s numerics: rebuild with "
            "make ... CUDA_ON_CPU=1 CUDA_CPU_NUMERICS=%s\n", v, numerics_gpu_seen ? "gpu" : "ieee", v);
    exit(1);
}

static void init_once() {
    static std::once_flag once;
    std::call_once(once, [] {
        init_memory();
        exec_mode();
        tools_on();
        check_numerics();
    });
}

// ---- streams ---------------------------------------------------------------------------
struct Stream;
struct Dep {
    Stream* stream;
    uint64_t seq;
};
struct Op {
    uint64_t seq;
    const char* label;
    std::function<void()> fn;
    std::vector<Dep> deps;
};

struct Stream {
    int device;
    bool legacy, blocking, destroyed = false;
    std::deque<Op> queue;
    uint64_t enqueued = 0, completed = 0, released = 0;
    std::thread worker;
    bool worker_started = false;
    const char* running = nullptr;  // label of the op in progress
};

struct Streams {
    std::mutex mu;
    std::condition_variable cv;  // any completion, enqueue or release
    std::set<Stream*> live;      // streams that may be named (legacy ones included)
    std::vector<Stream*> all;
    Stream* legacy[64] = {};
};
static Streams* S;
static thread_local Stream* current_op_stream = nullptr;

static Streams* streams() {
    static std::once_flag once;
    std::call_once(once, [] { S = new Streams(); });
    return S;
}

cudaStream_t current_stream() { return (cudaStream_t)current_op_stream; }

static thread_local int selected_device = 0;
int current_device() { return selected_device; }

static Stream* new_stream_locked(int device, bool legacy, bool blocking) {
    Stream* s = new Stream();
    s->device = device;
    s->legacy = legacy;
    s->blocking = blocking;
    S->live.insert(s);
    S->all.push_back(s);
    return s;
}

static Stream* legacy_stream_locked(int device) {
    if (!S->legacy[device]) S->legacy[device] = new_stream_locked(device, true, true);
    return S->legacy[device];
}

// The stream a handle names, or NULL if it names none (destroyed or never made).
static Stream* resolve_locked(cudaStream_t h) {
    if (h == 0 || h == cudaStreamLegacy || h == cudaStreamPerThread) return legacy_stream_locked(current_device());
    Stream* s = (Stream*)h;
    if (!S->live.count(s)) return nullptr;
    return s;
}

bool stream_alive(cudaStream_t h) {
    streams();
    std::lock_guard<std::mutex> g(S->mu);
    return resolve_locked(h) != nullptr;
}

// Lets a lazy stream run up to seq, and what that work waits for (its deps do it as they come).
static void release_locked(Stream* s, uint64_t seq) {
    if (seq > s->released) {
        s->released = seq;
        S->cv.notify_all();
    }
}

static bool deps_done_locked(const Op& op) {
    for (const Dep& d : op.deps) {
        if (d.stream->completed < d.seq) return false;
    }
    return true;
}

static void run_op(Stream* s, Op& op) {
    current_op_stream = s;
    s->running = op.label;
    if (op.fn) op.fn();
    s->running = nullptr;
    current_op_stream = nullptr;
}

static void worker_loop(Stream* s) {
    device_thread_setup();
    std::unique_lock<std::mutex> lk(S->mu);
    for (;;) {
        S->cv.wait(lk, [&] {
            if (s->queue.empty()) return s->destroyed;
            const Op& op = s->queue.front();
            if (exec_mode() == EXEC_LAZY && op.seq > s->released) return false;
            if (exec_mode() == EXEC_LAZY) {
                for (const Dep& d : op.deps) release_locked(d.stream, d.seq);
            }
            return deps_done_locked(op);
        });
        if (s->queue.empty()) return;  // destroyed and drained
        Op op = std::move(s->queue.front());
        s->queue.pop_front();
        lk.unlock();
        run_op(s, op);
        lk.lock();
        s->completed = op.seq;
        S->cv.notify_all();
    }
}

// Waits (host side) until s has completed seq; lazily held work is released first.
static void wait_locked(std::unique_lock<std::mutex>& lk, Stream* s, uint64_t seq) {
    release_locked(s, seq);
    S->cv.wait(lk, [&] { return s->completed >= seq; });
}

// Appends op to s's queue, starting the stream's worker on first use.
static void queue_locked(Stream* s, Op op) {
    s->queue.push_back(std::move(op));
    if (!s->worker_started) {
        s->worker_started = true;
        s->worker = std::thread(worker_loop, s);
        s->worker.detach();  // never joined: at exit a worker may still be inside a kernel
    }
    S->cv.notify_all();
}

static cudaError_t enqueue_at(cudaStream_t h, const char* label, std::function<void()> fn, Stream** on,
                              uint64_t* seq);
cudaError_t enqueue(cudaStream_t h, const char* label, std::function<void()> fn) {
    return enqueue_at(h, label, std::move(fn), nullptr, nullptr);
}

// enqueue, and where the op went (for event records).
static cudaError_t enqueue_at(cudaStream_t h, const char* label, std::function<void()> fn, Stream** on,
                              uint64_t* seq) {
    init_once();
    if (sticky_error() != cudaSuccess) return sticky_error();
    streams();
    std::unique_lock<std::mutex> lk(S->mu);
    Stream* s = resolve_locked(h);
    if (!s) {
        diag("%s on stream %p, which does not exist (destroyed?)", label, (void*)h);
        return cudaErrorInvalidResourceHandle;
    }
    Op op{++s->enqueued, label, std::move(fn), {}};
    if (on) *on = s;
    if (seq) *seq = op.seq;
    // Implicit ordering with the legacy default stream (blocking streams only).
    if (s->legacy) {
        for (Stream* o : S->live) {
            if (o != s && o->blocking && o->device == s->device && o->enqueued > o->completed)
                op.deps.push_back({o, o->enqueued});
        }
    } else if (s->blocking) {
        Stream* L = S->legacy[s->device];
        if (L && L->enqueued > L->completed) op.deps.push_back({L, L->enqueued});
    }
    if (exec_mode() == EXEC_EAGER) {
        for (const Dep& d : op.deps) wait_locked(lk, d.stream, d.seq);
        lk.unlock();
        {
            DeviceAccess access;
            run_op(s, op);
        }
        lk.lock();
        s->completed = op.seq;
        S->cv.notify_all();
        return cudaSuccess;
    }
    queue_locked(s, std::move(op));
    return cudaSuccess;
}

// Op a wait-event adds: it runs when the event's captured work has.
cudaError_t enqueue_wait(cudaStream_t h, Stream* on, uint64_t seq) {
    init_once();
    streams();
    std::unique_lock<std::mutex> lk(S->mu);
    Stream* s = resolve_locked(h);
    if (!s) return cudaErrorInvalidResourceHandle;
    if (!on || on->completed >= seq) return cudaSuccess;
    Op op{++s->enqueued, "cudaStreamWaitEvent", nullptr, {{on, seq}}};
    if (exec_mode() == EXEC_EAGER) {
        wait_locked(lk, on, seq);
        s->completed = op.seq;
        return cudaSuccess;
    }
    queue_locked(s, std::move(op));
    return cudaSuccess;
}

// ---- devices -----------------------------------------------------------------------------
static int device_count() {
    long n = env_long("DEVICES", 1);
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

void device_uuid(int device, unsigned char out[16]) {
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    uint64_t h = 1469598103934665603ull;
    for (const char* p = host; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    uint64_t who = env_long("SHARED_GPU", 0) ? 0 : (uint64_t)getpid();
    uint64_t a = h ^ (who * 0x9e3779b97f4a7c15ull), b = (uint64_t)device * 0xbf58476d1ce4e5b9ull ^ 0x5851f42d4c957f2dull;
    memcpy(out, &a, 8);
    memcpy(out + 8, &b, 8);
}

}  // namespace cudacpu

using namespace cudacpu;

// ---- the runtime API ------------------------------------------------------------------------
extern "C" {

cudaError_t cudaGetLastError(void) {
    if (sticky_error() != cudaSuccess) return sticky_error();
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return sticky_error() != cudaSuccess ? sticky_error() : last_error; }

// The runtime's names and messages for the errors the layer returns.
static const struct {
    cudaError_t err;
    const char *name, *text;
} kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
};

const char* cudaGetErrorName(cudaError_t e) {
    for (const auto& k : kErrors) {
        if (k.err == e) return k.name;
    }
    return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
    for (const auto& k : kErrors) {
        if (k.err == e) return k.text;
    }
    return "unknown error";
}

// The driver's CUDA version (1000 x major + 10 x minor): the headers' own, or
// CUDA_CPU_DRIVER_VERSION, so that a test can play a driver older than the binary.
static int driver_version() { return (int)env_long("DRIVER_VERSION", CUDART_VERSION); }

cudaError_t cudaDriverGetVersion(int* version) {
    if (!version) return result(cudaErrorInvalidValue);
    *version = driver_version();
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
    if (!version) return result(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
    init_once();
    // A runtime newer (in major version) than the driver cannot start, as on a GPU.
    if (driver_version() / 1000 < CUDART_VERSION / 1000) {
        *count = 0;
        return result(cudaErrorInsufficientDriver);
    }
    *count = device_count();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    init_once();
    if (device < 0 || device >= device_count()) return result(cudaErrorInvalidDevice);
    selected_device = device;
    // CUDA 12 creates the device's primary context here.
    return device_context(device) ? cudaSuccess : result(cudaErrorMemoryAllocation);
}

cudaError_t cudaGetDevice(int* device) {
    *device = selected_device;
    return cudaSuccess;
}

// CUDA_CPU_COMPUTE_MODE: the compute mode reported (nvidia-smi -c sets a GPU's), only
// reported: exclusive-process does not keep a second process off the emulated GPU.
static int compute_mode() {
    static const char* const names[] = {"default", "exclusive-process", "prohibited"};
    static const int modes[] = {cudaComputeModeDefault, cudaComputeModeExclusiveProcess, cudaComputeModeProhibited};
    return modes[env_choice("COMPUTE_MODE", names, 3)];
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* p, int device) {
    init_once();
    if (device < 0 || device >= device_count()) return result(cudaErrorInvalidDevice);
    memset(p, 0, sizeof(*p));
    bool h100 = gpu_is_h100();
    snprintf(p->name, sizeof(p->name), "%s", h100 ? "NVIDIA H100 80GB HBM3" : "NVIDIA H200");
    device_uuid(device, (unsigned char*)p->uuid.bytes);
    p->totalGlobalMem = device_memory_total();
    p->sharedMemPerBlock = 49152;
    p->sharedMemPerBlockOptin = 232448;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = h100 ? 5120 : 6144;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 4;
    p->unifiedAddressing = 1;
    p->managedMemory = 1;
    p->pciBusID = 0x18 + device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) return e;
    switch (attr) {
        case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
        case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
        case cudaDevAttrWarpSize: *value = 32; break;
        case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
        case cudaDevAttrClockRate: *value = 1980000; break;  // kHz
        case cudaDevAttrComputeMode: *value = compute_mode(); break;  // not in CUDA 13's cudaDeviceProp
        default: return result(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    init_once();
    size_t t = device_memory_total(), used = device_memory_used(current_device());
    *total = t;
    *free_bytes = t > used ? t - used : 0;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t size) {
    init_once();
    if (sticky_error() != cudaSuccess) return sticky_error();
    if (!p) return result(cudaErrorInvalidValue);
    cudaError_t e = device_alloc(p, size, current_device(), __builtin_return_address(0));
    if (e != cudaSuccess) {
        *p = nullptr;
        diag("cudaMalloc of %zu bytes: out of device memory", size);
    }
    return result(e);
}

// cudaFree synchronizes the device (documented), then frees.
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaFree(void* p) {
    init_once();
    if (!p) return cudaSuccess;
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return e;
    return result(device_free(p));
}

cudaError_t cudaMallocHost(void** p, size_t size) {
    init_once();
    if (!p) return result(cudaErrorInvalidValue);
    void* q = nullptr;
    if (posix_memalign(&q, kPage, size ? size : 1) != 0) return result(cudaErrorMemoryAllocation);
    memset(q, 0xff, size);
    std::lock_guard<std::mutex> g(mem->mu);
    mem->allocs[(uintptr_t)q] = Allocation{(char*)q, size, size, MEM_PINNED, 0, false, __builtin_return_address(0)};
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int flags) { return cudaMallocHost(p, size); }

cudaError_t cudaFreeHost(void* p) {
    init_once();
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> g(mem->mu);
    auto it = mem->allocs.find((uintptr_t)p);
    if (it == mem->allocs.end() || it->second.kind != MEM_PINNED || it->second.freed) {
        diag("cudaFreeHost(%p): not a live pinned allocation", p);
        return result(cudaErrorInvalidValue);
    }
    mem->allocs.erase(it);  // host addresses are reused by malloc: forget it entirely
    free(p);
    return cudaSuccess;
}

// ---- streams -----------------------------------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned int flags) {
    init_once();
    streams();
    std::lock_guard<std::mutex> g(S->mu);
    *out = (cudaStream_t)new_stream_locked(current_device(), false, !(flags & cudaStreamNonBlocking));
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* out, unsigned int flags, int priority) {
    return cudaStreamCreateWithFlags(out, flags);
}

// Returns at once; work already queued still runs (documented).
cudaError_t cudaStreamDestroy(cudaStream_t h) {
    streams();
    std::lock_guard<std::mutex> g(S->mu);
    Stream* s = resolve_locked(h);
    if (!s || s->legacy) {
        diag("cudaStreamDestroy(%p): not a stream (destroyed twice?)", (void*)h);
        return result(cudaErrorInvalidResourceHandle);
    }
    s->destroyed = true;
    S->live.erase(s);
    S->cv.notify_all();
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
    init_once();
    streams();
    std::unique_lock<std::mutex> lk(S->mu);
    Stream* s = resolve_locked(h);
    if (!s) return result(cudaErrorInvalidResourceHandle);
    wait_locked(lk, s, s->enqueued);
    return result(sticky_error());
}

cudaError_t cudaStreamQuery(cudaStream_t h) {
    init_once();
    streams();
    std::unique_lock<std::mutex> lk(S->mu);
    Stream* s = resolve_locked(h);
    if (!s) return result(cudaErrorInvalidResourceHandle);
    if (sticky_error() != cudaSuccess) return sticky_error();
    release_locked(s, s->enqueued);
    return result(s->completed >= s->enqueued ? cudaSuccess : cudaErrorNotReady);
}

cudaError_t cudaDeviceSynchronize(void) {
    init_once();
    streams();
    std::unique_lock<std::mutex> lk(S->mu);
    std::vector<Stream*> all = S->all;  // destroyed streams' queued work counts too
    for (Stream* s : all) {
        if (s->device == current_device()) wait_locked(lk, s, s->enqueued);
    }
    return result(sticky_error());
}

// ---- events ------------------------------------------------------------------------------------
struct EventImpl {
    bool timing;
    bool destroyed = false;
    Stream* stream = nullptr;  // the record in effect: stream and its op
    uint64_t seq = 0;
    std::shared_ptr<std::chrono::steady_clock::time_point> when;  // set when the record runs
};
static std::mutex event_mu;
static std::set<EventImpl*>* live_events;

static EventImpl* event_of(cudaEvent_t e) {
    std::lock_guard<std::mutex> g(event_mu);
    EventImpl* ev = (EventImpl*)e;
    if (!live_events || !live_events->count(ev)) return nullptr;
    return ev;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned int flags) {
    init_once();
    EventImpl* ev = new EventImpl();
    ev->timing = !(flags & cudaEventDisableTiming);
    std::lock_guard<std::mutex> g(event_mu);
    if (!live_events) live_events = new std::set<EventImpl*>();
    live_events->insert(ev);
    *out = (cudaEvent_t)ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* out) { return cudaEventCreateWithFlags(out, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    std::lock_guard<std::mutex> g(event_mu);
    EventImpl* ev = (EventImpl*)e;
    if (!live_events || !live_events->count(ev)) return result(cudaErrorInvalidResourceHandle);
    live_events->erase(ev);  // kept allocated: a queued record may still point at it
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t h) {
    EventImpl* ev = event_of(e);
    if (!ev) return result(cudaErrorInvalidResourceHandle);
    auto when = std::make_shared<std::chrono::steady_clock::time_point>();
    bool timing = ev->timing;
    Stream* s = nullptr;
    uint64_t seq = 0;
    cudaError_t err = enqueue_at(h, "cudaEventRecord", [when, timing] {
        if (timing) *when = std::chrono::steady_clock::now();
    }, &s, &seq);
    if (err != cudaSuccess) return result(err);
    std::lock_guard<std::mutex> g(S->mu);
    ev->stream = s;
    ev->seq = seq;
    ev->when = when;
    return cudaSuccess;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t h, unsigned int flags) { return cudaEventRecord(e, h); }

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t e, unsigned int flags) {
    EventImpl* ev = event_of(e);
    if (!ev) return result(cudaErrorInvalidResourceHandle);
    Stream* on;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> g(streams()->mu);
        on = ev->stream;
        seq = ev->seq;
    }
    return result(enqueue_wait(h, on, seq));
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    EventImpl* ev = event_of(e);
    if (!ev) return result(cudaErrorInvalidResourceHandle);
    if (sticky_error() != cudaSuccess) return sticky_error();
    if (!ev->stream) return cudaSuccess;  // never recorded: complete (documented)
    std::lock_guard<std::mutex> g(S->mu);
    release_locked(ev->stream, ev->seq);
    return result(ev->stream->completed >= ev->seq ? cudaSuccess : cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    EventImpl* ev = event_of(e);
    if (!ev) return result(cudaErrorInvalidResourceHandle);
    if (!ev->stream) return cudaSuccess;
    std::unique_lock<std::mutex> lk(S->mu);
    wait_locked(lk, ev->stream, ev->seq);
    return result(sticky_error());
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    EventImpl *x = event_of(a), *y = event_of(b);
    if (!x || !y || !x->timing || !y->timing || !x->stream || !y->stream) return result(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> g(S->mu);
    if (x->stream->completed < x->seq || y->stream->completed < y->seq) return result(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(*y->when - *x->when).count();
    return cudaSuccess;
}

// ---- copies and fills ------------------------------------------------------------------------------
// Checks one side of a copy: `device` says which kind the direction demands.
static bool check_side(const void* p, size_t bytes, bool device, const char* call, const char* side) {
    char what[96];
    snprintf(what, sizeof(what), "%s %s", call, side);
    MemRange r = lookup(p);
    if (device) return check_device_range(p, bytes, what, false);
    if (r.kind == MEM_DEVICE) {
        diag("%s: %p is device memory, but the direction says host memory", what, p);
        return false;
    }
    if (r.kind == MEM_PINNED && bytes > r.size - (size_t)((const char*)p - r.base)) {
        diag("%s: %zu bytes run past the end of a pinned allocation of %zu bytes", what, bytes, r.size);
        return false;
    }
    return true;
}

static cudaMemcpyKind infer_kind(const void* dst, const void* src) {
    bool d = lookup(dst).kind == MEM_DEVICE, s = lookup(src).kind == MEM_DEVICE;
    return d ? (s ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice) : (s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
}

static cudaError_t wait_for_stream(cudaStream_t h) {
    std::unique_lock<std::mutex> lk(S->mu);
    Stream* s = resolve_locked(h);
    if (s) wait_locked(lk, s, s->enqueued);
    return sticky_error();
}

// The driver's freedoms with pageable memory ("API synchronization behavior": a copy between
// device and pageable memory "might be synchronous"; staging "may synchronize with the
// stream"): CUDA_CPU_PAGEABLE_D2H=async, CUDA_CPU_PAGEABLE_H2D=stream (docs/cuda_cpu.md).
static bool pageable_d2h_async() {
    static const char* const names[] = {"sync", "async"};
    static const bool on = env_choice("PAGEABLE_D2H", names, 2) == 1;
    return on;
}
static bool pageable_h2d_waits() {
    static const char* const names[] = {"staged", "stream"};
    static const bool on = env_choice("PAGEABLE_H2D", names, 2) == 1;
    return on;
}

// sync: the blocking cudaMemcpy (on the legacy stream) rather than cudaMemcpyAsync.
static cudaError_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t h, bool sync) {
    init_once();
    streams();
    const char* call = sync ? "cudaMemcpy" : "cudaMemcpyAsync";
    if (sticky_error() != cudaSuccess) return sticky_error();
    if (kind == cudaMemcpyDefault) kind = infer_kind(dst, src);
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice) return result(cudaErrorInvalidMemcpyDirection);
    if (bytes == 0) return cudaSuccess;
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (!check_side(dst, bytes, dst_dev, call, "destination") || !check_side(src, bytes, src_dev, call, "source"))
        return result(cudaErrorInvalidValue);
    if (sync) h = 0;
    bool src_pageable = !src_dev && lookup(src).kind == MEM_HOST;
    bool dst_pageable = !dst_dev && lookup(dst).kind == MEM_HOST;
    cudaError_t e;
    if (kind == cudaMemcpyHostToHost) {
        e = enqueue(h, call, [dst, src, bytes] { memmove(dst, src, bytes); });
        if (e == cudaSuccess) e = wait_for_stream(h);
        return result(e);
    }
    if (src_pageable && pageable_h2d_waits() && (e = wait_for_stream(h)) != cudaSuccess) return result(e);
    if (src_pageable) {  // staged now: the caller may reuse its buffer at once
        auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + bytes);
        e = enqueue(h, call, [dst, staged, bytes] { memcpy(dst, staged->data(), bytes); });
    } else {
        e = enqueue(h, call, [dst, src, bytes] { memmove(dst, src, bytes); });
    }
    if (e != cudaSuccess) return result(e);
    // Returns only when done: to pageable memory always (cudaMemcpyAsync's only by default);
    // the blocking call also from pinned memory and to pinned memory (documented); device
    // to device never waits.
    bool wait = (dst_pageable && (sync || !pageable_d2h_async())) ||
                (sync && kind != cudaMemcpyDeviceToDevice && !src_pageable);
    if (wait) e = wait_for_stream(h);
    return result(e);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
    return copy(dst, src, bytes, kind, 0, true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    return copy(dst, src, bytes, kind, s, false);
}

static cudaError_t fill(void* p, int value, size_t bytes, cudaStream_t h, const char* call) {
    init_once();
    if (sticky_error() != cudaSuccess) return sticky_error();
    if (bytes == 0) return cudaSuccess;
    if (!check_device_range(p, bytes, call, false)) return result(cudaErrorInvalidValue);
    return result(enqueue(h, call, [p, value, bytes] { memset(p, value, bytes); }));
}

// Asynchronous with respect to the host for device memory, the blocking form included (documented).
cudaError_t cudaMemset(void* p, int value, size_t bytes) { return fill(p, value, bytes, 0, "cudaMemset"); }
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
    return fill(p, value, bytes, s, "cudaMemsetAsync");
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
    return result(enqueue(s, "cudaLaunchHostFunc", [fn, data] { fn(data); }));
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attr, const void* p) {
    init_once();
    memset(attr, 0, sizeof(*attr));
    MemRange r = lookup(p);
    attr->type = r.freed ? cudaMemoryTypeUnregistered
                 : r.kind == MEM_DEVICE ? cudaMemoryTypeDevice
                 : r.kind == MEM_PINNED ? cudaMemoryTypeHost
                                        : cudaMemoryTypeUnregistered;
    attr->device = r.device;
    attr->devicePointer = r.kind == MEM_HOST ? nullptr : (void*)p;
    attr->hostPointer = r.kind == MEM_DEVICE ? nullptr : (void*)p;
    return cudaSuccess;
}

cudaError_t cudaDeviceReset(void) { return cudaDeviceSynchronize(); }

}  // extern "C"
