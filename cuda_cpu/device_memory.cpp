/*
 * cuda_cpu/device_memory.cpp: what the emulated GPU's memory holds, as an H100's driver
 * counts it (docs/cuda_cpu.md, "Device memory"): the cap of CUDA_CPU_GPU's totalGlobalMem,
 * cudaMalloc's 2 MiB granularity, and the charges of what the program does not allocate
 * itself: the CUDA context, cuBLAS's default workspace, NCCL's buffers. runtime.cpp keeps
 * the bytes (the arena); this file keeps the count that cudaMalloc and cudaMemGetInfo see.
 *
 * Ranks that share a GPU (CUDA_CPU_SHARED_GPU=1) share its count, as they share an H100's
 * memory: a small shared-memory segment per device and job holds one slot per process
 * (its pid and the bytes it holds). A process that ended holds nothing (its slot is taken
 * back, as the driver frees a dead process's memory). Without the setting each process
 * has a GPU of its own, counted in the process.
 */
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <ctime>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

namespace cudacpu {

namespace {

const size_t kMiB = (size_t)1 << 20;
const size_t kGranularity = 2 * kMiB;  // cuMemGetAllocationGranularity's minimum on an H100
const size_t kAlignment = 256;         // every cudaMalloc'd address (Programming Guide, Device Memory Accesses)
const int kMaxDevices = 64;            // CUDA_CPU_DEVICES' bound (runtime.cpp)
const int kSlots = 256;                // processes sharing one GPU

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

struct Slot {
    std::atomic<int> pid;
    std::atomic<uint64_t> bytes;
};
struct Pool {                 // zero-filled when created: unlocked, every slot free
    std::atomic<int> lock;    // the pid that holds it, 0 when free
    Slot slot[kSlots];
};

bool process_gone(int pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

// A spin lock between processes; one held by a process that died is taken over.
void pool_lock(Pool* p) {
    int me = getpid();
    for (int spins = 0;; spins++) {
        int holder = 0;
        if (p->lock.compare_exchange_strong(holder, me)) return;
        if (process_gone(holder) && p->lock.compare_exchange_strong(holder, me)) return;
        if (spins > 100) usleep(50);
    }
}
void pool_unlock(Pool* p) { p->lock.store(0); }

// Under the lock: the bytes every live process holds (the slots of dead ones freed).
uint64_t pool_used_locked(Pool* p) {
    uint64_t used = 0;
    for (Slot& s : p->slot) {
        int pid = s.pid.load();
        if (pid == 0) continue;
        if (process_gone(pid)) {
            s.bytes.store(0);
            s.pid.store(0);
            continue;
        }
        used += s.bytes.load();
    }
    return used;
}

struct Device {
    Pool* pool = nullptr;
    Slot* mine = nullptr;       // this process's slot in it
    bool context = false;       // the context is charged
    size_t small_bytes = 0;     // live allocations under the granularity, each rounded to kAlignment
    size_t small_chunks = 0;    // 2 MiB chunks charged for them
    char shm_name[64] = "";
};
std::mutex g_mu;
Device g_dev[kMaxDevices];

// The job the process belongs to: ranks of one mpirun share a GPU, other jobs on the host
// do not (Open MPI's PMIx namespace; else the launcher's pid, the parent of every local rank).
unsigned long long job_key() {
    const char* ns = getenv("PMIX_NAMESPACE");
    if (!ns || !*ns) ns = getenv("OMPI_MCA_ess_base_jobid");
    unsigned long long h = 1469598103934665603ull;
    if (ns && *ns) {
        for (const char* p = ns; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
        return h;
    }
    return h ^ (unsigned long long)getppid();
}

void release_slots_at_exit();

// A job killed without its exit handlers leaves its segment: one a minute old (its ranks
// have taken their slots by then) whose processes are all gone is removed.
void remove_stale_pools() {
    DIR* dir = opendir("/dev/shm");
    if (!dir) return;
    while (struct dirent* e = readdir(dir)) {
        if (strncmp(e->d_name, "cudacpu-gpu.", 12) != 0) continue;
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        struct stat st;
        int fd = shm_open(name, O_RDWR, 0600);
        if (fd < 0) continue;
        void* m = fstat(fd, &st) == 0 && st.st_size == (off_t)sizeof(Pool) && time(nullptr) - st.st_mtime > 60
                      ? mmap(nullptr, sizeof(Pool), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                      : MAP_FAILED;
        close(fd);
        if (m == MAP_FAILED) continue;
        bool gone = true;
        for (Slot& slot : ((Pool*)m)->slot) gone &= slot.pid.load() == 0 || process_gone(slot.pid.load());
        if (gone) shm_unlink(name);
        munmap(m, sizeof(Pool));
    }
    closedir(dir);
}

Pool* open_shared_pool(int device, Device& d) {
    remove_stale_pools();
    unsigned char uuid[16];
    device_uuid(device, uuid);
    unsigned long long h = job_key();
    for (unsigned char b : uuid) h = (h ^ b) * 1099511628211ull;
    snprintf(d.shm_name, sizeof(d.shm_name), "/cudacpu-gpu.%016llx", h);
    int fd = shm_open(d.shm_name, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(Pool)) != 0) {
        if (fd >= 0) close(fd);
        return nullptr;
    }
    void* m = mmap(nullptr, sizeof(Pool), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return m == MAP_FAILED ? nullptr : (Pool*)m;
}

// This process's slot on the device's GPU, made on first use.
Device& device_state(int device) {
    Device& d = g_dev[device];
    if (d.pool) return d;
    if (env_long("SHARED_GPU", 0)) d.pool = open_shared_pool(device, d);
    if (!d.pool) {
        d.pool = new Pool();
        d.shm_name[0] = '\0';
    }
    static bool registered = false;
    if (!registered) registered = atexit(release_slots_at_exit) == 0;
    pool_lock(d.pool);
    pool_used_locked(d.pool);  // frees the slots of processes gone
    for (Slot& s : d.pool->slot) {
        int zero = 0;
        if (s.pid.compare_exchange_strong(zero, (int)getpid())) {
            s.bytes.store(0);
            d.mine = &s;
            break;
        }
    }
    pool_unlock(d.pool);
    if (!d.mine) {
        fprintf(stderr, "error: cuda_cpu: more than %d processes share GPU %d\n", kSlots, device);
        exit(1);
    }
    return d;
}

// The last process to leave a shared GPU removes its segment.
void release_slots_at_exit() {
    std::lock_guard<std::mutex> g(g_mu);
    for (Device& d : g_dev) {
        if (!d.mine || !d.shm_name[0]) continue;
        pool_lock(d.pool);
        d.mine->bytes.store(0);
        d.mine->pid.store(0);
        bool empty = pool_used_locked(d.pool) == 0;
        for (Slot& s : d.pool->slot) empty &= s.pid.load() == 0;
        if (empty) shm_unlink(d.shm_name);
        pool_unlock(d.pool);
        d.mine = nullptr;
    }
}

// Adds bytes to this process's share of the device when the GPU has room for them.
bool take_locked(Device& d, size_t bytes) {
    pool_lock(d.pool);
    bool fits = pool_used_locked(d.pool) + bytes <= device_memory_total();
    if (fits) d.mine->bytes.fetch_add(bytes);
    pool_unlock(d.pool);
    return fits;
}
void give_locked(Device& d, size_t bytes) {
    pool_lock(d.pool);
    d.mine->bytes.fetch_sub(bytes);
    pool_unlock(d.pool);
}

// The context, created on the device by the first call that needs it (as CUDA 12 creates
// the primary context at cudaSetDevice or the first allocation).
bool context_locked(int device) {
    Device& d = device_state(device);
    if (d.context) return true;
    d.context = take_locked(d, round_up(context_bytes(), kGranularity));
    return d.context;
}

bool valid(int device) { return device >= 0 && device < kMaxDevices; }

}  // namespace

bool gpu_is_h100() {
    const char* g = getenv("CUDA_CPU_GPU");
    return g && strcmp(g, "H100") == 0;
}

// totalGlobalMem: an H100 80GB HBM3 reports 81,559 MiB, an H200 143,771 MiB.
size_t device_memory_total() { return (size_t)env_long("MEMORY_MIB", gpu_is_h100() ? 81559 : 143771) * kMiB; }

// The context of a process on an H100: 400 MiB. NVIDIA documents no figure; measured with
// lazy module loading (CUDA >= 11.7, the default), about 400 MB (pytorch/pytorch#109888, an
// NVIDIA engineer), growing with the SM count (ggml-org/llama.cpp#23604: 107 MiB on 34 SMs,
// 555 MiB on 188, so about 390 MiB on an H100's 132).
size_t context_bytes() { return (size_t)env_long("CONTEXT_MIB", 400) * kMiB; }

size_t device_memory_used(int device) {
    std::lock_guard<std::mutex> g(g_mu);
    if (!valid(device)) return 0;
    Device& d = device_state(device);
    context_locked(device);
    pool_lock(d.pool);
    size_t used = pool_used_locked(d.pool);
    pool_unlock(d.pool);
    return used;
}

bool device_context(int device) {
    std::lock_guard<std::mutex> g(g_mu);
    return valid(device) && context_locked(device);
}

// cudaMalloc's count: sizes from 2 MiB up rounded up to 2 MiB; smaller ones packed into
// shared 2 MiB chunks (each at 256-byte alignment), a chunk charged when the packed bytes
// need one more: no fragmentation, the least the driver could take.
bool device_memory_alloc(int device, size_t size) {
    std::lock_guard<std::mutex> g(g_mu);
    if (!valid(device) || !context_locked(device)) return false;
    Device& d = device_state(device);
    if (size >= kGranularity) return take_locked(d, round_up(size, kGranularity));
    size_t bytes = round_up(size ? size : 1, kAlignment);
    size_t chunks = round_up(d.small_bytes + bytes, kGranularity) / kGranularity;
    if (chunks > d.small_chunks && !take_locked(d, (chunks - d.small_chunks) * kGranularity)) return false;
    d.small_chunks = chunks > d.small_chunks ? chunks : d.small_chunks;
    d.small_bytes += bytes;
    return true;
}

void device_memory_free(int device, size_t size) {
    std::lock_guard<std::mutex> g(g_mu);
    if (!valid(device)) return;
    Device& d = device_state(device);
    if (size >= kGranularity) {
        give_locked(d, round_up(size, kGranularity));
        return;
    }
    d.small_bytes -= round_up(size ? size : 1, kAlignment);
    size_t chunks = round_up(d.small_bytes, kGranularity) / kGranularity;
    if (chunks < d.small_chunks) give_locked(d, (d.small_chunks - chunks) * kGranularity);
    d.small_chunks = chunks;
}

bool device_memory_charge(int device, size_t bytes) {
    std::lock_guard<std::mutex> g(g_mu);
    if (!valid(device) || !context_locked(device)) return false;
    return take_locked(device_state(device), round_up(bytes, kGranularity));
}

void device_memory_uncharge(int device, size_t bytes) {
    std::lock_guard<std::mutex> g(g_mu);
    if (valid(device)) give_locked(device_state(device), round_up(bytes, kGranularity));
}

// cuBLAS's default workspace per handle: what CUBLAS_WORKSPACE_CONFIG asks for (":SIZE:COUNT"
// pairs, SIZE in KiB), else 32 MiB, the size the cuBLAS docs give Hopper (cublasSetWorkspace).
size_t cublas_workspace_bytes() {
    const char* v = getenv("CUBLAS_WORKSPACE_CONFIG");
    if (!v || !*v) return 32 * kMiB;
    size_t total = 0;
    while (*v == ':') {
        char* end;
        unsigned long kib = strtoul(v + 1, &end, 10);
        if (*end != ':') break;
        unsigned long count = strtoul(end + 1, &end, 10);
        total += (size_t)kib * 1024 * count;
        v = end;
    }
    return total;
}

// NCCL's buffers per communicator of two ranks or more: 1024 MiB. NCCL documents the size of
// one buffer (NCCL_BUFFSIZE, 4 MiB: per channel, peer and protocol), not how many it makes;
// measured on 8 H100s, 1.06 GB per GPU after init and an all-reduce (NVIDIA/nccl#1685), and
// its allocations are 10 MiB per channel and peer (the Simple, LL128 and LL buffers).
size_t nccl_buffer_bytes(int nranks) { return nranks < 2 ? 0 : (size_t)env_long("NCCL_MEMORY_MIB", 1024) * kMiB; }

}  // namespace cudacpu
