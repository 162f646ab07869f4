/*
 * cuda_cpu/tools.cpp: the sanitizer's and profiler's common part (cuda_cpu/tools.h):
 * the settings, the __asan_* entry points the instrumented kernels call, what an address
 * is, the events of a launch, and source lines for the reports (addr2line on the
 * instruction's return address). The sanitizer is tools_race.cpp, the profiler
 * tools_profile.cpp; docs/cuda_cpu.md says what they measure and model.
 */
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "cuda_cpu.h"  // the qualifiers before the toolkit's headers (internal.h)
#include "internal.h"
#include "tools.h"

namespace cudacpu {

void device_arena(uintptr_t* lo, size_t* len);  // runtime.cpp
void kernel_memcheck_fault(cudaError_t err, const char* message);  // kernel.cpp

namespace tools {
thread_local Worker* active = nullptr;
}
using namespace tools;

// ---- settings -------------------------------------------------------------------------
static bool instrumented = false;  // set by __asan_init: some translation unit calls the hooks

struct Settings {
    bool race = false, memcheck = false, profile = false;
    std::string file;
};

static void write_profile_at_exit();

// CUDA_CPU_CHECK: off, or race and memcheck in any order, comma-separated.
static void parse_checks(Settings* r) {
    const char* v = getenv("CUDA_CPU_CHECK");
    if (!v || !*v || strcmp(v, "off") == 0) return;
    std::string all = v;
    size_t at = 0;
    while (at <= all.size()) {
        size_t comma = all.find(',', at);
        std::string one = all.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        if (one == "race") r->race = true;
        else if (one == "memcheck") r->memcheck = true;
        else {
            fprintf(stderr, "error: cuda_cpu: CUDA_CPU_CHECK=%s: use off, race, memcheck or race,memcheck\n", v);
            exit(1);
        }
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
}

// memcheck's host side: the device arena while memcheck is on (an empty range otherwise),
// read by every instrumented host access.
static uintptr_t host_guard_lo, host_guard_len;

// Never destroyed: the profile is written at exit, after static objects may be gone.
static const Settings& settings() {
    static const Settings* s = [] {
        Settings* r = new Settings();
        parse_checks(r);
        const char* f = getenv("CUDA_CPU_PROFILE");
        r->profile = f && *f;
        if (r->profile) {  // %p: the process id (each rank of a job its own file)
            r->file = f;
            size_t at = r->file.find("%p");
            if (at != std::string::npos) r->file.replace(at, 2, std::to_string((long)getpid()));
        }
        if ((r->race || r->memcheck || r->profile) && !instrumented) {
            fprintf(stderr, "error: cuda_cpu: %s needs the layer's tools in the build: rebuild with make ... "
                    "CUDA_ON_CPU=1 CUDA_CPU_TOOLS=1 (this program's kernels report no memory accesses)\n",
                    r->race || r->memcheck ? "CUDA_CPU_CHECK" : "CUDA_CPU_PROFILE");
            exit(1);
        }
        if (r->memcheck) device_arena(&host_guard_lo, &host_guard_len);
        if (r->profile) {
            FILE* probe = fopen(r->file.c_str(), "w");  // a bad path fails now, not at exit
            if (!probe) {
                fprintf(stderr, "error: cuda_cpu: CUDA_CPU_PROFILE=%s: cannot write %s (%s)\n", f, r->file.c_str(),
                        strerror(errno));
                exit(1);
            }
            fclose(probe);
            atexit(write_profile_at_exit);
        }
        return r;
    }();
    return *s;
}

static void write_profile_at_exit() { profile_write(settings().file.c_str()); }

bool tools_race() { return settings().race; }
bool tools_profile() { return settings().profile; }
bool tools_memcheck() { return settings().memcheck; }
bool tools_on() { return settings().race || settings().memcheck || settings().profile; }

// ---- what an address is ------------------------------------------------------------------
static int space_of(Worker* w, uintptr_t a) {
    if (a - w->arena_lo < w->arena_len) return SPACE_GLOBAL;
    if (a - w->stack_lo < w->stack_len) return SPACE_LOCAL;
    for (int i = 0; i < w->num_shared; i++) {
        if (a - w->shared[i].lo < w->shared[i].hi - w->shared[i].lo) return SPACE_SHARED;
    }
    return -1;
}

static void seen(Worker* w, uintptr_t pc, uintptr_t a, unsigned size, int kind, int thread, int request) {
    int space = space_of(w, a);
    if (w->memcheck) memcheck_access(w, pc, a, size, kind, space);  // returns only if the access is valid
    if (space < 0) return;
    if (w->race && space != SPACE_LOCAL) race_access(w, pc, a, size, space, kind, thread);
    if (w->profiling) {
        w->pending[thread >> 5].push_back(
            Access{pc, a, (uint16_t)thread, (uint16_t)size, (uint8_t)space, (uint8_t)kind, (uint16_t)request});
    }
}

static thread_local Worker* worker_of_thread;

// An instrumented access to device memory with no block running on this thread: host
// code's, unless the thread is inside a kernel doing the layer's own work (tools_pause).
static void host_access(uintptr_t pc, uintptr_t a, unsigned size, int kind) {
    Worker* w = worker_of_thread;
    if (w && w->in_block) return;
    memcheck_host_access(pc, a, size, kind);
}

// The hooks' common path; host code (no block running on this thread) returns at once
// unless memcheck is on and the address is device memory.
static inline __attribute__((always_inline)) void hook(const volatile void* p, unsigned size, int kind, void* ret) {
    Worker* w = active;
    if (__builtin_expect(w == nullptr, 1)) {
        if (__builtin_expect((uintptr_t)p - host_guard_lo < host_guard_len, 0))
            host_access((uintptr_t)ret, (uintptr_t)p, size, kind);
        return;
    }
    seen(w, (uintptr_t)ret, (uintptr_t)p, size, kind, *w->current, 0);
}

namespace tools {
std::string address_of(Worker* w, uintptr_t a, int space) {
    char buf[512];
    if (space == SPACE_SHARED) {
        for (int i = 0; i < w->num_shared; i++) {
            const SharedRange& r = w->shared[i];
            if (a >= r.lo && a < r.hi) {
                snprintf(buf, sizeof(buf), "__shared__ '%s' (byte %zu of %zu)", r.name, (size_t)(a - r.lo),
                         (size_t)(r.hi - r.lo));
                return buf;
            }
        }
        return "shared memory";
    }
    return device_address(a, 1);
}

std::string block_name(const Worker* w, uint64_t linear) {
    char buf[64];
    uint64_t gx = w->grid.x, gy = w->grid.y;
    snprintf(buf, sizeof(buf), "(%" PRIu64 ",%" PRIu64 ",%" PRIu64 ")", linear % gx, linear / gx % gy,
             linear / (gx * gy));
    return buf;
}

// ---- findings ----------------------------------------------------------------------------
static std::mutex findings_mu;
static std::set<std::pair<uintptr_t, uintptr_t>>* printed_pairs;
static const int kMaxPrinted = 20;

bool finding_wanted(Worker* w, uintptr_t a, uintptr_t b) {
    std::lock_guard<std::mutex> g(findings_mu);
    if (!printed_pairs) printed_pairs = new std::set<std::pair<uintptr_t, uintptr_t>>();
    if (!printed_pairs->insert({a, b}).second) return false;  // this pair of instructions is known
    return w->finding.empty() || w->findings_printed < kMaxPrinted;
}

void report_finding(Worker* w, const std::string& message) {
    if (w->finding.empty()) {
        w->finding = message;  // becomes the kernel's fault at the block's end
        return;
    }
    w->findings_printed++;
    fprintf(stderr, "cuda_cpu: also in kernel %s (launched at %s:%d) block %s: %s\n", w->kernel, w->file, w->line,
            block_name(w, w->block_linear).c_str(), message.c_str());
}

// ---- source lines ----------------------------------------------------------------------------
static std::mutex sym_mu;
static std::unordered_map<uintptr_t, std::string>* sym_cache;

struct ObjectLookup {
    uintptr_t pc;
    std::string path;
    uintptr_t vaddr;
    bool found;
};

static int find_object(struct dl_phdr_info* info, size_t, void* data) {
    ObjectLookup* q = (ObjectLookup*)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && q->pc >= lo && q->pc < lo + ph.p_memsz) {
            q->found = true;
            q->vaddr = q->pc - info->dlpi_addr;
            if (info->dlpi_name && info->dlpi_name[0]) {
                q->path = info->dlpi_name;
            } else {  // the program itself; addr2line must not read its own /proc/self/exe
                char exe[4096];
                ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
                q->path = n > 0 ? std::string(exe, (size_t)n) : "";
            }
            return 1;
        }
    }
    return 0;
}

// "file:line < file:line (function)" from addr2line -p -i lines: innermost frame first.
static std::string frames_text(const std::vector<std::string>& frames) {
    std::string out, func;
    for (size_t i = 0; i < frames.size() && i < 4; i++) {
        std::string f = frames[i];
        const char* inl = " (inlined by) ";
        if (f.compare(0, strlen(inl), inl) == 0) f = f.substr(strlen(inl));
        size_t at = f.rfind(" at ");
        std::string where = at == std::string::npos ? f : f.substr(at + 4);
        size_t disc = where.find(" (discriminator");
        if (disc != std::string::npos) where = where.substr(0, disc);
        while (where.compare(0, 2, "./") == 0) where = where.substr(2);  // the build's relative paths
        if (at != std::string::npos) {
            func = f.substr(0, at);
            size_t paren = func.find('(');
            if (paren != std::string::npos) func = func.substr(0, paren);
        }
        if (!out.empty()) out += " < ";
        out += where;
    }
    if (!func.empty()) out += " (" + func + ")";
    return out;
}

void source_prefetch(const std::vector<uintptr_t>& pcs) {
    std::lock_guard<std::mutex> g(sym_mu);
    if (!sym_cache) sym_cache = new std::unordered_map<uintptr_t, std::string>();
    std::unordered_map<std::string, std::vector<std::pair<uintptr_t, uintptr_t>>> by_object;  // path -> (pc, vaddr)
    for (uintptr_t pc : pcs) {
        if (!pc || sym_cache->count(pc)) continue;
        ObjectLookup q{pc - 1, "", 0, false};  // pc - 1: inside the call, not after it
        dl_iterate_phdr(find_object, &q);
        char fallback[32];
        snprintf(fallback, sizeof(fallback), "%#" PRIxPTR, pc);
        (*sym_cache)[pc] = fallback;
        if (q.found && !q.path.empty()) by_object[q.path].push_back({pc, q.vaddr});
    }
    for (auto& obj : by_object) {
        auto& list = obj.second;
        for (size_t start = 0; start < list.size(); start += 200) {
            std::string cmd = "addr2line -f -C -i -p -e '" + obj.first + "'";
            size_t end = std::min(list.size(), start + 200);
            for (size_t i = start; i < end; i++) {
                char a[32];
                snprintf(a, sizeof(a), " %#" PRIxPTR, list[i].second);
                cmd += a;
            }
            cmd += " 2>/dev/null";
            FILE* p = popen(cmd.c_str(), "r");
            if (!p) continue;
            std::vector<std::vector<std::string>> groups;
            char line[4096];
            while (fgets(line, sizeof(line), p)) {
                std::string s(line);
                while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
                if (s.compare(0, 14, " (inlined by) ") == 0 && !groups.empty()) groups.back().push_back(s);
                else groups.push_back({s});
            }
            pclose(p);
            if (groups.size() != end - start) continue;  // unexpected output: keep the addresses
            for (size_t i = start; i < end; i++) {
                const auto& fr = groups[i - start];
                if (fr[0].find("??") == 0) continue;
                (*sym_cache)[list[i].first] = frames_text(fr);
            }
        }
    }
}

std::string source_of(uintptr_t pc) {
    source_prefetch({pc});
    std::lock_guard<std::mutex> g(sym_mu);
    return (*sym_cache)[pc];
}

}  // namespace tools

// ---- launch events --------------------------------------------------------------------------
static std::atomic<uint32_t> launches{0};

void tools_launch_begin(const LaunchSite& site, dim3 grid, dim3 block, size_t shmem, const void* stacks, size_t slot,
                        int count) {
    Worker* w = worker_of_thread;
    if (!w) {
        w = worker_of_thread = new Worker();
        if (tools_race()) w->race = race_new();
        w->profiling = tools_profile();
        w->memcheck = settings().memcheck;
    }
    w->kernel = site.kernel;
    w->file = site.file;
    w->line = site.line;
    w->grid = grid;
    w->block_dim = block;
    w->launch_id = ++launches;
    size_t len;
    device_arena(&w->arena_lo, &len);
    w->arena_len = len;
    w->stack_lo = (uintptr_t)stacks;
    w->stack_slot = slot;
    w->stack_len = slot * count;
    w->stats = KernelStats();
    w->stats.launches = 1;
    w->finding.clear();
    w->findings_printed = 0;
}

void tools_block_begin(uint64_t linear, uint3 block_idx, int threads, const int* current, void* dynamic_shared,
                       size_t shmem) {
    Worker* w = worker_of_thread;
    w->block_linear = linear;
    w->block_idx = block_idx;
    w->threads = threads;
    w->current = current;
    w->num_shared = 0;
    w->shared_bytes = 0;
    w->stats.blocks++;
    w->stats.threads += threads;
    if (w->race) race_block_begin(w);
    if (shmem) tools_shared_declared(dynamic_shared, shmem, "extern __shared__");
    w->in_block = true;
    active = w;
}

void tools_shared_declared(void* address, size_t bytes, const char* name) {
    Worker* w = worker_of_thread;
    if (w->num_shared == (int)(sizeof(w->shared) / sizeof(w->shared[0]))) return;  // beyond: not tracked
    w->shared[w->num_shared++] = SharedRange{(uintptr_t)address, (uintptr_t)address + bytes, name, w->shared_bytes};
    w->shared_bytes += (bytes + 1) & ~(size_t)1;
}

void tools_warp_met(int warp, bool collective) {
    Worker* w = active;
    if (!w) return;
    if (w->profiling) profile_flush(w, warp);
    if (w->race && collective) race_warp_met(w, warp);
}

void tools_barrier() {
    Worker* w = active;
    if (!w) return;
    if (w->profiling) {
        for (int k = 0; k < 32; k++) profile_flush(w, k);
    }
    if (w->race) race_barrier(w);
}

bool tools_block_end(std::string* fault) {
    Worker* w = worker_of_thread;
    if (w->profiling) {
        for (int k = 0; k < 32; k++) profile_flush(w, k);
    }
    active = nullptr;
    w->in_block = false;
    if (w->finding.empty()) return true;
    *fault = w->finding;
    return false;
}

void tools_launch_end() {
    Worker* w = worker_of_thread;
    active = nullptr;
    if (!w) return;
    w->in_block = false;
    for (auto& p : w->pending) p.clear();  // a block that faulted leaves some
    if (w->profiling) profile_launch_end(w);
}

// ---- the layer's own device operations (cuda_cpu.h: WMMA in cuda_cpu/include/mma.h) ---------
void tools_modeled(const void* pc, const ModeledAccess* list, int n) {
    Worker* w = worker_of_thread;
    if (!w || !w->in_block) return;
    int warp_base = *w->current & ~31;
    std::vector<Access> group;
    for (int i = 0; i < n; i++) {
        const ModeledAccess& m = list[i];
        int space = space_of(w, (uintptr_t)m.addr);
        if (space < 0) continue;
        int kind = m.store ? KIND_STORE : KIND_LOAD;
        if (w->race && space != SPACE_LOCAL)
            race_access(w, (uintptr_t)pc, (uintptr_t)m.addr, m.size, space, kind, warp_base + m.lane);
        group.push_back(Access{(uintptr_t)pc, (uintptr_t)m.addr, (uint16_t)(warp_base + m.lane), m.size,
                               (uint8_t)space, (uint8_t)kind, m.request});
    }
    if (w->profiling && !group.empty()) profile_modeled(w, (uintptr_t)pc, group.data(), (int)group.size());
}

void tools_mma() {
    Worker* w = worker_of_thread;
    if (w && w->in_block) w->stats.wmma_mma++;
}

void tools_pause(bool pause) {
    Worker* w = worker_of_thread;
    if (w && w->in_block) active = pause ? nullptr : w;
}

void tools_atomic(const void* p, unsigned size, const void* pc) {
    Worker* w = active;
    if (w) seen(w, (uintptr_t)pc, (uintptr_t)p, size, KIND_ATOMIC, *w->current, 0);
}

}  // namespace cudacpu

// ---- the instrumentation's entry points ------------------------------------------------------
// g++ -fsanitize=address with --param asan-instrumentation-with-call-threshold=0 calls these
// (gcc/asan.cc names them) before each load and store it does not prove harmless: every
// access through a pointer, and accesses to the function's own variables at run-time
// offsets (which a GPU keeps in local memory too); constant-offset accesses to a function's
// own variables are registers on a GPU, and g++ leaves them alone. No ASan runtime is
// linked: these are the only definitions.
using namespace cudacpu;
using cudacpu::tools::KIND_LOAD;
using cudacpu::tools::KIND_STORE;

#define RET __builtin_return_address(0)
extern "C" {
void __asan_init(void) { cudacpu::instrumented = true; }
void __asan_version_mismatch_check_v8(void) {}
void __asan_handle_no_return(void) {}
void __asan_before_dynamic_init(const char*) {}  // around a unit's dynamic initializers
void __asan_after_dynamic_init(void) {}

#define CUDA_CPU_HOOKS(n)                                                           \
    void __asan_load##n(void* p) { hook(p, n, KIND_LOAD, RET); }                    \
    void __asan_store##n(void* p) { hook(p, n, KIND_STORE, RET); }                  \
    void __asan_load##n##_noabort(void* p) { hook(p, n, KIND_LOAD, RET); }          \
    void __asan_store##n##_noabort(void* p) { hook(p, n, KIND_STORE, RET); }
CUDA_CPU_HOOKS(1)
CUDA_CPU_HOOKS(2)
CUDA_CPU_HOOKS(4)
CUDA_CPU_HOOKS(8)
CUDA_CPU_HOOKS(16)
void __asan_loadN(void* p, size_t n) { hook(p, (unsigned)n, KIND_LOAD, RET); }
void __asan_storeN(void* p, size_t n) { hook(p, (unsigned)n, KIND_STORE, RET); }
void __asan_loadN_noabort(void* p, size_t n) { hook(p, (unsigned)n, KIND_LOAD, RET); }
void __asan_storeN_noabort(void* p, size_t n) { hook(p, (unsigned)n, KIND_STORE, RET); }
}
