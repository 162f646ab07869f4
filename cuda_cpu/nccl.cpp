/*
 * cuda_cpu/nccl.cpp: NCCL for the CPU execution layer, emulated over POSIX shared
 * memory between the processes (MPI ranks) of one machine. Implements nccl.h's functions
 * that the project calls; no NVIDIA library is linked.
 *
 * Model. A communicator is one shared memory segment (shm_open; its name, a magic and the
 * staging size travel in the ncclUniqueId). Rank 0 creates it in ncclCommInitRank, the
 * others map it; the name is unlinked once all have joined. Layout:
 *   SegHeader        nranks, joined count, doorbell (futex word), aborted-by, error word
 *   RankSlot[n]      pid, device UUID, posted collective number, barriers passed, what
 *                    the rank's process runs now (any communicator of that device)
 *   Channel[n*n]     send/recv descriptors and chunk counters of each ordered pair
 *   staging[n]       CUDA_CPU_NCCL_STAGE_BYTES per rank (default 1 MiB)
 * Every collective runs on the stream worker (cudacpu::enqueue): the rank writes its
 * descriptors (op, count, type, reduction, root) to its staging area, waits until all
 * ranks posted the same collective number, compares them with rank 0's (a difference is
 * a device fault that names both sides, and the communicator's async error becomes
 * ncclInvalidUsage: no hang), then moves the data in chunks: copy in, barrier, compute
 * its own output from the staging areas, barrier. Send/Recv go pairwise through the
 * sender's staging area, one slot per destination, all ops of a group progressing
 * together (a rank may send to and receive from the same peer in one group).
 *
 * Rules enforced at call time: a live communicator without async error, supported type
 * and reduction, root/peer in range, buffers inside device (or pinned) allocations of
 * the sizes NCCL reads and writes, and NCCL's only in-place forms (all-reduce, broadcast,
 * reduce: recvbuff == sendbuff; reduce-scatter: recvbuff == sendbuff + rank*recvcount;
 * all-gather: sendbuff == recvbuff + rank*sendcount): other overlaps are
 * ncclInvalidArgument. Two ranks on the same GPU UUID: ncclInvalidUsage at init.
 * Results: reductions in the order of NCCL's algorithms (CUDA_CPU_NCCL_ORDER; SumTree below):
 * ring (the default: what NCCL_ALGO=Ring runs, and what reduce-scatter, all-gather and
 * reduce always run), tree (all-reduces by NCCL's binary tree), rank (0, 1, 2, ...) or
 * random (a chain in an order drawn per call and piece). Each rank computes its output with
 * the same order, so all ranks get the same bits of an all-reduce; half and bf16 are rounded
 * (to nearest even) after every addition, like per-hop rounding. ncclAvg follows NCCL (src/enqueue.cc, hostToDevRedOp): for floating types it
 * is PreMulSum, every rank's input multiplied by 1/nranks rounded to the type (computed as
 * float(1.0/nranks), then rounded to bf16 or half) with each product rounded to the type,
 * then the products summed; for integer types the sum divided by nranks (SumPostDiv).
 * Ordering: a GPU runs the NCCL kernels of all its communicators in launch order, so each
 * process (device) hands out a ticket per launch and runs them in ticket order (not under
 * CUDA_CPU_EXEC=lazy, where the host decides what runs). A rank that waits on a peer for
 * over 2 s looks at what the peer runs: a collective on another communicator of this
 * device that this rank has not begun (issued after the one it is blocked in, or not yet)
 * is an order inversion, a certain deadlock: device fault, ncclInvalidUsage. A slow or
 * stopped peer is just waited for. Waits also give up on ncclCommAbort (local), a peer's
 * abort or error, or a peer that exited (ncclRemoteError); a rank whose device faulted
 * (the runtime then refuses its launches) tells its peers the same way. Device faults
 * raised here use cudaErrorLaunchFailure; the message says what went wrong.
 * CUDA_CPU_NCCL_PEERS=local (peers_local): as on a GPU, none of that reaches the peers: only
 * a rank's own ncclCommAbort ends its waits, and ncclCommGetAsyncError reports its own errors.
 * CUDA_CPU_NCCL_CONCURRENT=1: no tickets; the operations of one device's communicators
 * run as their streams allow, as a GPU may run them, at once. NCCL does not support that
 * (each may hold SMs the other's peers wait for), so an operation launched while another
 * communicator of the device has one queued or running on another stream is a device
 * fault and ncclInvalidUsage. Operations on one stream are ordered, so code that queues a
 * device's communicators on one stream passes; an event chain between two streams is not
 * followed (it would be reported).
 * Groups: calls between ncclGroupStart/End are validated, recorded and launched at the
 * outermost ncclGroupEnd, in call order, one queued operation per (communicator, stream).
 * A group in which a call failed launches nothing and ncclGroupEnd returns that error.
 * Collectives of count 0 are skipped on the host, as NCCL does; Send/Recv of 0 still pair.
 * ncclCommDestroy waits for the communicator's queued operations (with CUDA_CPU_NCCL_PEERS=local
 * also for every rank to reach its destroy or abort), then frees local state;
 * ncclCommAbort returns at once (waiting operations give up within ~20 ms), or with
 * CUDA_CPU_NCCL_ABORT=block once the device's queued work has run (see there). Handles are
 * kept as tombstones so that a call on a destroyed communicator is reported, not a crash.
 *
 * Not modelled: the ring's order of ranks (NCCL picks it from the topology: here rank
 * order), several channels and loops (one piece per rank per call), the double tree's second
 * tree, NVLS and CollNet (reductions in the switch), speed, network transports, more than one node,
 * non-blocking communicators (config->blocking is ignored), ncclCommSplit, custom ops,
 * fp8, several ranks per process, cross-communicator fusion inside a group.
 */
#include <nccl.h>

#include "internal.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

namespace {

using std::atomic;
constexpr double kInversionAfterS = 2.0;  // a wait this long looks for an order inversion
constexpr double kPollS = 0.02;           // how often a sleeping wait looks at flags
constexpr size_t kDefaultStage = 1 << 20;

// ---- small utilities ----------------------------------------------------------------
double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double env_double(const char* name, double dflt) {
    const char* v = getenv(name);
    char* end;
    double x = v && *v ? strtod(v, &end) : dflt;
    return v && *v && *end == '\0' && x > 0 ? x : dflt;
}

std::string vformat(const char* fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    return buf;
}

__attribute__((format(printf, 1, 2))) std::string format(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

// Shared (not FUTEX_PRIVATE) futex: the waker is another process.
void futex_wait(atomic<uint32_t>* word, uint32_t seen, double timeout_s) {
    timespec ts = {(time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e9)};
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

// A process that is gone, or a zombie its parent has not reaped yet.
bool process_alive(int pid) {
    if (pid <= 0) return true;  // not known yet
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    char path[64], stat[256] = {0};
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE* f = fopen(path, "r");
    if (!f) return true;
    size_t got = fread(stat, 1, sizeof(stat) - 1, f);
    fclose(f);
    const char* close_paren = strrchr(stat, ')');  // "pid (name) S ..."
    return !(got && close_paren && close_paren[1] == ' ' && close_paren[2] == 'Z');
}

// ---- last error -----------------------------------------------------------------------
// Call-time failures are this thread's; asynchronous ones the communicator's. The clock
// tells which is the more recent for ncclGetLastError(comm).
atomic<uint64_t> g_error_clock{0};
thread_local std::string t_error;
thread_local uint64_t t_error_at = 0;

__attribute__((format(printf, 2, 3))) ncclResult_t fail(ncclResult_t r, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    t_error = vformat(fmt, ap);
    va_end(ap);
    t_error_at = ++g_error_clock;
    cudacpu::diag("%s", t_error.c_str());
    return r;
}

// ---- operations -------------------------------------------------------------------------
enum Kind : int32_t { K_ALL_REDUCE, K_REDUCE_SCATTER, K_ALL_GATHER, K_BROADCAST, K_REDUCE, K_SEND, K_RECV };
const char* const kKindNames[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast",
                                  "ncclReduce",    "ncclSend",          "ncclRecv"};
const char* const kRedNames[] = {"sum", "prod", "max", "min", "avg"};

bool is_p2p(Kind k) { return k == K_SEND || k == K_RECV; }
bool reduces(Kind k) { return k == K_ALL_REDUCE || k == K_REDUCE_SCATTER || k == K_REDUCE; }
bool rooted(Kind k) { return k == K_BROADCAST || k == K_REDUCE; }

struct Op {
    Kind kind;
    ncclDataType_t type;
    ncclRedOp_t red;
    int root;  // root, or peer for Send/Recv
    size_t count;
    const char* send;
    char* recv;
};

// What the ranks compare: everything but the buffers (24 bytes, no padding).
struct WireOp {
    int32_t kind, type, red, root;
    uint64_t count;
};
struct WireHead {
    uint64_t seq;
    uint64_t nops;
};

// By ncclDataType_t value; fp8 (10, 11) is not emulated.
const struct {
    const char* name;
    size_t size;
} kTypes[] = {{"int8", 1},   {"uint8", 1}, {"int32", 4}, {"uint32", 4}, {"int64", 8},
              {"uint64", 8}, {"half", 2},  {"float", 4}, {"double", 8}, {"bfloat16", 2}};
const char* type_name(int t) { return t >= 0 && t < 10 ? kTypes[t].name : nullptr; }
size_t type_size(int t) { return kTypes[t].size; }

WireOp wire(const Op& o) {
    WireOp w;
    w.kind = o.kind;
    w.type = o.type;
    w.red = reduces(o.kind) ? o.red : 0;
    w.root = rooted(o.kind) || is_p2p(o.kind) ? o.root : 0;
    w.count = o.count;
    return w;
}

// "ncclReduceScatter of 4096 float sum", "ncclBroadcast of 10 float from root 1"
std::string describe(const WireOp& w) {
    std::string s = format("%s of %llu %s", kKindNames[w.kind], (unsigned long long)w.count, type_name(w.type));
    if (reduces((Kind)w.kind)) s += format(" %s", kRedNames[w.red]);
    if (rooted((Kind)w.kind)) s += format(w.kind == K_REDUCE ? " to root %d" : " from root %d", w.root);
    if (is_p2p((Kind)w.kind)) s += format(w.kind == K_SEND ? " to rank %d" : " from rank %d", w.root);
    return s;
}

std::string describe_list(const WireOp* ops, uint64_t n) {
    if (n == 1) return describe(ops[0]);
    std::string s = format("a group of %llu calls (", (unsigned long long)n);
    for (uint64_t i = 0; i < n && i < 3; i++) s += (i ? ", " : "") + describe(ops[i]);
    return s + (n > 3 ? ", ...)" : ")");
}

// ---- the shared segment -------------------------------------------------------------------
constexpr char kMagic[16] = "cudacpu-nccl-1";

struct IdPayload {  // what ncclUniqueId carries
    char magic[16];
    uint64_t comm_id;
    uint64_t stage_bytes;
    char shm_name[64];
};
static_assert(sizeof(IdPayload) <= NCCL_UNIQUE_ID_BYTES, "id payload too large");

struct alignas(64) SegHeader {
    char magic[16];
    uint64_t comm_id, stage_bytes;
    int32_t nranks;
    atomic<uint32_t> ready;     // rank 0 filled the header
    atomic<uint32_t> doorbell;  // bumped by every change a peer may wait for (futex word)
    atomic<uint32_t> sleepers;  // waiters in futex_wait: ring() skips the syscall when 0
    atomic<int32_t> joined;
    atomic<int32_t> aborted_by;  // 0, or 1 + the rank that called ncclCommAbort
    atomic<int32_t> error_word;  // 0, or (1 + rank) << 8 | the ncclResult_t it failed with
};

enum RunKind : uint32_t { RUN_IDLE, RUN_COLL, RUN_P2P };

struct alignas(64) RankSlot {
    atomic<uint32_t> claimed, departed;
    atomic<int32_t> pid;
    unsigned char uuid[16];
    atomic<uint64_t> posted;   // collective number whose descriptors are in this staging area
    atomic<uint64_t> arrived;  // barriers passed
    // What this rank's process runs now, on any communicator of its device. A seqlock:
    // run_version is odd while the fields are written.
    atomic<uint32_t> run_version, run_kind;
    atomic<uint64_t> run_comm, run_seq;
    char run_text[224];
};

struct alignas(64) Channel {             // data from src to dst
    atomic<uint64_t> sends, recvs;       // ops posted by each side
    atomic<uint64_t> written, consumed;  // chunks through the slot
    uint64_t scount[2], rcount[2];       // descriptors of ops k (slot k & 1): a side can be
    int32_t stype[2], rtype[2];          // at most one op ahead of the other
};

static_assert(atomic<uint64_t>::is_always_lock_free && atomic<uint32_t>::is_always_lock_free,
              "shared atomics must be lock-free");

struct Layout {
    size_t slots, chans, stage, total;
};

Layout layout(int n, size_t stage_bytes) {
    Layout L;
    L.slots = (sizeof(SegHeader) + 63) & ~size_t(63);
    L.chans = L.slots + (size_t)n * sizeof(RankSlot);
    L.stage = (L.chans + (size_t)n * n * sizeof(Channel) + 4095) & ~size_t(4095);
    L.total = L.stage + (size_t)n * stage_bytes;
    return L;
}

// ---- communicators ----------------------------------------------------------------------
struct CommState {
    uint64_t id = 0;
    int nranks = 0, rank = 0, device = 0;
    char name[12] = {0};  // 8 hex digits of the id, for messages
    char* base = nullptr;
    size_t bytes = 0, stage_bytes = 0;
    SegHeader* hdr = nullptr;
    RankSlot* slots = nullptr;
    Channel* chans = nullptr;
    char* staging = nullptr;

    atomic<bool> abort_local{false};
    atomic<int> async{ncclSuccess};
    atomic<uint64_t> launched{0}, started{0};  // collective numbers issued (host), begun (worker)
    uint64_t barriers = 0;                     // only the running unit uses it (tickets serialise)

    std::mutex mu;  // guards what follows
    std::string async_text;
    uint64_t async_at = 0;
    int pending = 0;  // queued units not finished
    std::condition_variable pending_cv;
    std::set<cudaStream_t> streams;
    std::multiset<cudaStream_t> in_flight;  // the streams of the queued units not finished
    double next_host_liveness = 0;  // ncclCommGetAsyncError probes the peers at most every 50 ms

    RankSlot& slot(int r) { return slots[r]; }
    Channel& chan(int src, int dst) { return chans[(size_t)src * nranks + dst]; }
    char* stage(int r) { return staging + (size_t)r * stage_bytes; }
    ~CommState() {
        if (base) munmap(base, bytes);
    }
};

void ring(CommState& c) {
    c.hdr->doorbell.fetch_add(1);
    if (c.hdr->sleepers.load())
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&c.hdr->doorbell), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// The first error wins; publish: tell the peers (an error of this rank's own making).
void set_async(CommState& c, ncclResult_t r, bool publish, const std::string& text) {
    int none = ncclSuccess;
    if (c.async.compare_exchange_strong(none, r)) {
        std::lock_guard<std::mutex> l(c.mu);
        c.async_text = text;
        c.async_at = ++g_error_clock;
    }
    int32_t zero = 0;
    if (publish && c.hdr->error_word.compare_exchange_strong(zero, ((c.rank + 1) << 8) | (int32_t)r)) ring(c);
}

}  // namespace

enum HandleState { H_LIVE, H_DESTROYED, H_ABORTED };
struct ncclComm {  // the handle; kept after destroy as a tombstone
    HandleState state;
    std::shared_ptr<CommState> st;
};

namespace {

std::mutex g_mu;                                 // guards the two registries
std::unordered_set<ncclComm*> g_handles;         // every handle ever made
std::vector<std::shared_ptr<CommState>> g_live;  // live communicators of this process

ncclResult_t resolve(ncclComm_t comm, const char* call, std::shared_ptr<CommState>* out, bool allow_error) {
    std::lock_guard<std::mutex> l(g_mu);
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", call);
    if (!g_handles.count(comm)) return fail(ncclInvalidArgument, "%s: %p is not a communicator", call, (void*)comm);
    if (comm->state != H_LIVE) {
        return fail(ncclInvalidArgument, "%s: the communicator was %s", call,
                    comm->state == H_DESTROYED ? "destroyed" : "aborted");
    }
    CommState& c = *comm->st;
    if (!allow_error && c.async.load() != ncclSuccess) {
        std::lock_guard<std::mutex> l2(c.mu);
        return fail((ncclResult_t)c.async.load(), "%s: communicator %s has an asynchronous error: %s", call, c.name,
                    c.async_text.c_str());
    }
    *out = comm->st;
    return ncclSuccess;
}

std::shared_ptr<CommState> find_live(uint64_t id) {
    std::lock_guard<std::mutex> l(g_mu);
    for (auto& c : g_live)
        if (c->id == id) return c;
    return nullptr;
}

void retire(ncclComm_t comm, HandleState state) {
    std::lock_guard<std::mutex> l(g_mu);
    g_live.erase(std::remove(g_live.begin(), g_live.end(), comm->st), g_live.end());
    cudacpu::device_memory_uncharge(comm->st->device, cudacpu::nccl_buffer_bytes(comm->st->nranks));
    comm->state = state;
    comm->st.reset();  // queued units keep the state (and the mapping) alive until they end
}

// ---- tickets: one device runs its NCCL work in launch order ----------------------------
struct TicketQueue {
    uint64_t next = 0, turn = 0;
    std::set<uint64_t> done_early;  // tickets given up before their turn
};
std::mutex g_tmu;
std::condition_variable g_tcv;
std::map<int, TicketQueue> g_tickets;

bool lazy_mode() { return cudacpu::exec_mode() == cudacpu::EXEC_LAZY; }
bool concurrent_mode() {
    static const bool on = cudacpu::env_long("NCCL_CONCURRENT", 0) != 0;
    return on;
}
// CUDA_CPU_NCCL_PEERS=local, as NCCL has them: no rank learns of a peer's abort, error, exit or
// destroy (its waits end by its own ncclCommAbort only; on a GPU the kernels spin on), and
// ncclCommDestroy returns once every rank has reached its own destroy or abort (NCCL 2.14+
// finalizes inside destroy, "an intra-node collective call"). notify: the layer before.
bool peers_local() {
    static const char* const names[] = {"notify", "local"};
    static const bool on = cudacpu::env_choice("NCCL_PEERS", names, 2) == 1;
    return on;
}

void end_ticket(int device, uint64_t t) {
    std::lock_guard<std::mutex> l(g_tmu);
    TicketQueue& q = g_tickets[device];
    if (t != q.turn) {
        q.done_early.insert(t);
        return;
    }
    for (q.turn++; q.done_early.erase(q.turn); q.turn++) {
    }
    g_tcv.notify_all();
}

// False when the communicator was aborted while this unit waited for its turn.
bool wait_turn(CommState& c, uint64_t t) {
    if (lazy_mode() || concurrent_mode()) return true;
    std::unique_lock<std::mutex> l(g_tmu);
    TicketQueue& q = g_tickets[c.device];
    while (q.turn != t) {
        if (c.abort_local.load()) return false;
        g_tcv.wait_for(l, std::chrono::milliseconds(20));
    }
    return true;
}

// ---- what this process runs now, published in all its segments ---------------------------
void publish_running(int device, RunKind kind, uint64_t comm_id, uint64_t seq, const std::string& text) {
    std::lock_guard<std::mutex> l(g_mu);
    for (auto& c : g_live) {
        if (c->device != device) continue;
        RankSlot& s = c->slot(c->rank);
        uint32_t v = s.run_version.load(std::memory_order_relaxed);
        s.run_version.store(v + 1, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_release);
        s.run_kind.store(kind, std::memory_order_relaxed);
        s.run_comm.store(comm_id, std::memory_order_relaxed);
        s.run_seq.store(seq, std::memory_order_relaxed);
        snprintf(s.run_text, sizeof(s.run_text), "%s", text.c_str());
        s.run_version.store(v + 2, std::memory_order_release);
    }
}

struct PeerRun {
    uint32_t kind = RUN_IDLE;
    uint64_t comm = 0, seq = 0;
    char text[224] = {0};
};

// A few tries only: a peer stopped in the middle of a write must not hang the reader.
PeerRun read_running(RankSlot& s) {
    PeerRun p;
    for (int tries = 0; tries < 100; tries++) {
        uint32_t v1 = s.run_version.load(std::memory_order_acquire);
        if (v1 & 1) continue;
        p.kind = s.run_kind.load(std::memory_order_relaxed);
        p.comm = s.run_comm.load(std::memory_order_relaxed);
        p.seq = s.run_seq.load(std::memory_order_relaxed);
        memcpy(p.text, s.run_text, sizeof(p.text));
        std::atomic_thread_fence(std::memory_order_acquire);
        if (s.run_version.load(std::memory_order_relaxed) == v1) {
            p.text[sizeof(p.text) - 1] = '\0';
            return p;
        }
    }
    return PeerRun();
}

// ---- waiting on peers -------------------------------------------------------------------------
struct Run {  // the unit a stream worker runs now
    CommState* c;
    std::string text;  // "collective #7 (ncclAllReduce of 4096 float sum)"
    double next_liveness = 0, next_inversion = 0;
    uint64_t seq = 0;  // the collective number, and which call of its group runs (sum orders)
    int call = 0;
};

// The peer runs a collective on another communicator of this device that this rank has
// not begun: issued or not, it can only run after the one this rank is blocked in (ticket
// order), and the peer cannot leave it without this rank: neither can finish. Under
// CUDA_CPU_EXEC=lazy the host decides what runs, so no order is assumed there.
bool inversion(Run& x, int peer, std::string* why) {
    CommState& c = *x.c;
    PeerRun p = read_running(c.slot(peer));
    if (lazy_mode() || p.kind != RUN_COLL || p.comm == c.id) return false;
    std::shared_ptr<CommState> other = find_live(p.comm);
    if (!other || other->device != c.device || other->started.load() >= p.seq) return false;
    bool issued = other->launched.load() >= p.seq;
    *why = format(
        "ranks issued collectives on two communicators in different orders (NCCL can deadlock): rank %d "
        "runs %s on communicator %s while rank %d runs %s on communicator %s, which rank %d %s",
        c.rank, x.text.c_str(), c.name, peer, p.text, other->name, c.rank,
        issued ? "issued after it" : "has not issued yet (it would run after this one)");
    return true;
}

enum Verdict { V_WAIT, V_GIVE_UP, V_FAULT };

// Why a wait on `peers` (nullptr: all ranks) must end, if it must.
Verdict look_for_trouble(Run& x, const std::vector<int>* peers, double waited, ncclResult_t* r, std::string* why) {
    CommState& c = *x.c;
    const char* what = x.text.c_str();
    *r = ncclRemoteError;
    if (c.abort_local.load()) {
        *r = ncclInvalidUsage;
        *why = format("%s on communicator %s abandoned: ncclCommAbort was called", what, c.name);
        return V_GIVE_UP;
    }
    int32_t ab = peers_local() ? 0 : c.hdr->aborted_by.load(), ew = peers_local() ? 0 : c.hdr->error_word.load();
    if (ab && ab - 1 != c.rank) {
        *why = format("%s on communicator %s cannot complete: rank %d aborted the communicator", what, c.name, ab - 1);
        return V_GIVE_UP;
    }
    if (ew && (ew >> 8) - 1 != c.rank) {
        *why = format("%s on communicator %s cannot complete: rank %d failed (%s)", what, c.name, (ew >> 8) - 1,
                      ncclGetErrorString((ncclResult_t)(ew & 0xff)));
        return V_GIVE_UP;
    }
    double t = now_s();
    if (t < x.next_liveness) return V_WAIT;
    x.next_liveness = t + 0.05;  // kill() and /proc are syscalls: not on every wake
    std::vector<int> all;
    if (!peers) {
        for (int q = 0; q < c.nranks; q++)
            if (q != c.rank) all.push_back(q);
        peers = &all;
    }
    for (int q : peers_local() ? std::vector<int>() : *peers) {  // local: a peer's exit is not seen
        int pid = c.slot(q).pid.load();
        if (q != c.rank && !process_alive(pid)) {
            *why = format("%s on communicator %s cannot complete: rank %d (pid %d) has exited", what, c.name, q, pid);
            return V_GIVE_UP;
        }
        if (q != c.rank && c.slot(q).departed.load()) {
            *why = format("%s on communicator %s cannot complete: rank %d destroyed the communicator", what, c.name, q);
            return V_GIVE_UP;
        }
    }
    if (waited < kInversionAfterS || t < x.next_inversion) return V_WAIT;
    x.next_inversion = t + 0.1;
    for (int q : *peers) {
        if (q != c.rank && inversion(x, q, why)) {
            *r = ncclInvalidUsage;
            return V_FAULT;
        }
    }
    return V_WAIT;
}

// Waits until ready() holds: a few yields (peers often are a moment away), then sleeps on
// the doorbell, looking at the flags at least every kPollS. On giving up the async error
// is set (and for an inversion, the device fault raised) before returning it.
template <class Ready>
ncclResult_t wait_until(Run& x, const std::vector<int>* peers, Ready ready) {
    SegHeader& h = *x.c->hdr;
    double start = 0;
    for (int spin = 0;; spin++) {
        uint32_t seen = h.doorbell.load();
        if (ready()) return ncclSuccess;
        if (spin < 8) {
            sched_yield();
            continue;
        }
        if (start == 0) start = now_s();
        ncclResult_t r;
        std::string why;
        Verdict v = look_for_trouble(x, peers, now_s() - start, &r, &why);
        if (v != V_WAIT) {
            if (ready()) return ncclSuccess;  // what ended the wait came after the peer's part
            if (v == V_FAULT) cudacpu::device_fault(cudaErrorLaunchFailure, "%s", why.c_str());
            else cudacpu::diag("%s", why.c_str());
            set_async(*x.c, r, v == V_FAULT, why);
            return r;
        }
        h.sleepers.fetch_add(1);
        futex_wait(&h.doorbell, seen, kPollS);
        h.sleepers.fetch_sub(1);
    }
}

ncclResult_t barrier(Run& x) {
    CommState& c = *x.c;
    uint64_t b = ++c.barriers;
    c.slot(c.rank).arrived.store(b, std::memory_order_release);
    ring(c);
    return wait_until(x, nullptr, [&] {
        for (int q = 0; q < c.nranks; q++)
            if (c.slot(q).arrived.load(std::memory_order_acquire) < b) return false;
        return true;
    });
}

// ---- reductions: element types ---------------------------------------------------------------
float half_to_float(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

uint16_t float_to_half(float f) {  // round to nearest even
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (u >> 16) & 0x8000;
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u) return sign | 0x7c00 | (u > 0x7f800000u ? 0x200 : 0);
    if (u >= 0x477ff000u) return sign | 0x7c00;  // 65520 and up round to infinity
    if (u < 0x38800000u) return sign | (uint16_t)nearbyintf(fabsf(f) * 16777216.0f);  // subnormal
    uint32_t h = (((u >> 23) - 112) << 10) | ((u & 0x7fffffu) >> 13), rest = u & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
    return sign | (uint16_t)h;
}

template <class T>
struct Plain {  // integers, float, double: accumulate in the type itself
    using Acc = T;
    static Acc load(T v) { return v; }
    static T store(Acc a) { return a; }
};
struct Bf16 {  // float accumulator, rounded back after every step
    using Acc = float;
    static Acc load(uint16_t v) { return cudacpu::bf16_bits_to_float(v); }
    static uint16_t store(Acc a) { return cudacpu::float_to_bf16_bits(a); }
};
struct Half {
    using Acc = float;
    static Acc load(uint16_t v) { return half_to_float(v); }
    static uint16_t store(Acc a) { return float_to_half(a); }
};

template <class A>
A add(A a, A b) {  // integers wrap, as on the GPU
    if constexpr (std::is_integral_v<A>) return (A)((std::make_unsigned_t<A>)a + (std::make_unsigned_t<A>)b);
    else return a + b;
}
template <class A>
A mul(A a, A b) {
    if constexpr (std::is_integral_v<A>) return (A)((std::make_unsigned_t<A>)a * (std::make_unsigned_t<A>)b);
    else return a * b;
}

// ---- the order of a reduction's additions (CUDA_CPU_NCCL_ORDER) ------------------------------
// NCCL sums in the order of its algorithm, not in rank order, and the order decides the last
// bits of a float sum. A SumTree is such an order: the value of rank r's node is its own
// input, then each child's value added in turn; the result is the root's. A chain (root
// s0, children s1, s2, ... all leaves) is ((x_s0 + x_s1) + x_s2) + ...
struct SumTree {
    int root;
    std::vector<std::vector<int>> kids;
};
enum SumOrder { ORDER_RING, ORDER_RANK, ORDER_TREE, ORDER_RANDOM };

SumOrder sum_order() {
    static const char* const names[] = {"ring", "rank", "tree", "random"};
    static const SumOrder order = (SumOrder)cudacpu::env_choice("NCCL_ORDER", names, 4);
    return order;
}

SumTree chain(const std::vector<int>& seq) {
    SumTree t{seq[0], std::vector<std::vector<int>>(seq.size())};
    t.kids[seq[0]].assign(seq.begin() + 1, seq.end());
    return t;
}

// Ring (NCCL's src/device/all_reduce.h and reduce_scatter.h, runRing, the ring in rank
// order): the piece that ends on rank `last` starts on the rank after it and collects each
// rank's input around the ring, last's own added last: ((x_{l+1} + x_{l+2}) + ...) + x_l.
SumTree ring_order(int n, int last) {
    std::vector<int> seq;
    for (int j = 1; j <= n; j++) seq.push_back((last + j) % n);
    return chain(seq);
}

// NCCL's binary tree (src/graph/trees.cc, ncclGetBtree: root 0, a rank's children
// rank - lowbit and rank + lowbit under its lowest set bit) as all_reduce.h's runTreeUpDown
// sums it: each rank adds to its input its children's sums, child 0 first. 4 ranks:
// x0 + ((x2 + x1) + x3); 3 ranks: x0 + (x2 + x1).
SumTree btree_order(int n) {
    SumTree t{0, std::vector<std::vector<int>>(n)};
    for (int r = 0; r < n; r++) {
        int bit = 1;
        while (bit < n && !(bit & r)) bit <<= 1;
        if (r == 0) {
            if (n > 1) t.kids[0].push_back(bit >> 1);
            continue;
        }
        int low = bit >> 1;
        if (low == 0) continue;
        t.kids[r].push_back(r - low);
        int d1 = r + low;
        while (d1 >= n && low > 0) {  // the first of r + low, r + low/2, ... below n
            low >>= 1;
            d1 = low ? r + low : -1;
        }
        if (d1 > 0) t.kids[r].push_back(d1);
    }
    return t;
}

// A chain in a random order drawn from (CUDA_CPU_SEED, communicator, collective number, call
// of its group, piece): every rank draws the same, every call another.
SumTree random_order(int n, uint64_t comm_id, uint64_t seq, int call, int piece) {
    uint64_t h = cudacpu::splitmix64((uint64_t)cudacpu::env_long("SEED", 1));
    for (uint64_t v : {comm_id, seq, (uint64_t)call << 32 | (uint32_t)piece}) h = cudacpu::splitmix64(h ^ v);
    std::vector<int> seq_r(n);
    for (int i = 0; i < n; i++) seq_r[i] = i;
    for (int i = n - 1; i > 0; i--) {  // Fisher-Yates
        h = cudacpu::splitmix64(h);
        std::swap(seq_r[i], seq_r[h % (uint64_t)(i + 1)]);
    }
    return chain(seq_r);
}

// The order of the piece of a reduction that ends on rank `last` (ring: reduce-scatter's
// block of `last`, an all-reduce's chunk `last`, a reduce's root). NCCL runs reduce-scatter
// and reduce on rings only: tree changes all-reduces (all_tree true) alone.
SumTree order_for(int n, int last, bool all_tree, uint64_t comm_id, uint64_t seq, int call) {
    switch (sum_order()) {
        case ORDER_RANK: {
            std::vector<int> seq_r(n);
            for (int i = 0; i < n; i++) seq_r[i] = i;
            return chain(seq_r);
        }
        case ORDER_TREE: return all_tree ? btree_order(n) : ring_order(n, last);
        case ORDER_RANDOM: return random_order(n, comm_id, seq, call, last);
        default: return ring_order(n, last);
    }
}

// Evaluates the tree for count elements of type T: dst = the root's value. pre maps an
// input before it is added (ncclAvg's PreMulSum), add folds a value into the sum.
template <class T, class Tr, class Pre, class F>
void fold_node(const SumTree& t, int node, T* dst, const char* const* src, size_t count, Pre pre, F f) {
    const T* own = (const T*)src[node];
    for (size_t i = 0; i < count; i++) dst[i] = pre(own[i]);
    std::vector<T> sub;
    for (int child : t.kids[node]) {
        const T* v = (const T*)src[child];
        if (!t.kids[child].empty()) {  // a subtree: its sum first
            sub.resize(count);
            fold_node<T, Tr>(t, child, sub.data(), src, count, pre, f);
            for (size_t i = 0; i < count; i++) dst[i] = Tr::store(f(Tr::load(dst[i]), Tr::load(sub[i])));
        } else {
            for (size_t i = 0; i < count; i++) dst[i] = Tr::store(f(Tr::load(dst[i]), Tr::load(pre(v[i]))));
        }
    }
}

// Per element the same operations in the same order on every rank (so the same bits);
// one pass per rank (so the loops vectorise). avg: integers' ncclAvg, the sum divided by n.
template <class T, class Tr, class F>
void reduce_loop(char* dst, const char* const* src, int n, size_t count, const SumTree& t, bool avg, F f) {
    fold_node<T, Tr>(t, t.root, (T*)dst, src, count, [](T v) { return v; }, f);
    using A = typename Tr::Acc;
    if (avg)
        for (size_t i = 0; i < count; i++) ((T*)dst)[i] = Tr::store(Tr::load(((T*)dst)[i]) / (A)n);
}

// ncclAvg of a floating type (NCCL's PreMulSum): each input times the type's 1/n, rounded
// to the type, then summed (rounded after each addition, as the sums above).
template <class T, class Tr>
void premul_sum_loop(char* dst, const char* const* src, int n, size_t count, const SumTree& t) {
    using A = typename Tr::Acc;
    const A scalar = Tr::load(Tr::store((A)(float)(1.0 / n)));
    fold_node<T, Tr>(t, t.root, (T*)dst, src, count, [&](T v) { return Tr::store(Tr::load(v) * scalar); },
                     [](A a, A b) { return a + b; });
}

template <class T, class Tr>
void reduce_typed(char* dst, const char* const* src, int n, size_t count, ncclRedOp_t op, const SumTree& t) {
    using A = typename Tr::Acc;
    switch (op) {
        case ncclProd: return reduce_loop<T, Tr>(dst, src, n, count, t, false, [](A a, A b) { return mul(a, b); });
        case ncclMax: return reduce_loop<T, Tr>(dst, src, n, count, t, false, [](A a, A b) { return b > a ? b : a; });
        case ncclMin: return reduce_loop<T, Tr>(dst, src, n, count, t, false, [](A a, A b) { return b < a ? b : a; });
        default:
            if constexpr (!std::is_integral_v<A>) {
                if (op == ncclAvg) return premul_sum_loop<T, Tr>(dst, src, n, count, t);
            }
            return reduce_loop<T, Tr>(dst, src, n, count, t, op == ncclAvg, [](A a, A b) { return add(a, b); });
    }
}

void reduce_into(char* dst, const char* const* src, int n, size_t count, ncclDataType_t type, ncclRedOp_t op,
                 const SumTree& t) {
    switch (type) {
        case ncclInt8: return reduce_typed<int8_t, Plain<int8_t>>(dst, src, n, count, op, t);
        case ncclUint8: return reduce_typed<uint8_t, Plain<uint8_t>>(dst, src, n, count, op, t);
        case ncclInt32: return reduce_typed<int32_t, Plain<int32_t>>(dst, src, n, count, op, t);
        case ncclUint32: return reduce_typed<uint32_t, Plain<uint32_t>>(dst, src, n, count, op, t);
        case ncclInt64: return reduce_typed<int64_t, Plain<int64_t>>(dst, src, n, count, op, t);
        case ncclUint64: return reduce_typed<uint64_t, Plain<uint64_t>>(dst, src, n, count, op, t);
        case ncclFloat16: return reduce_typed<uint16_t, Half>(dst, src, n, count, op, t);
        case ncclFloat32: return reduce_typed<float, Plain<float>>(dst, src, n, count, op, t);
        case ncclFloat64: return reduce_typed<double, Plain<double>>(dst, src, n, count, op, t);
        case ncclBfloat16: return reduce_typed<uint16_t, Bf16>(dst, src, n, count, op, t);
        default: return;
    }
}

// ---- collectives on the stream worker -------------------------------------------------------
std::string mismatch_text(CommState& c, uint64_t seq, const WireHead* h0, const WireHead* hq, int q) {
    const WireOp* a = (const WireOp*)(h0 + 1);
    const WireOp* b = (const WireOp*)(hq + 1);
    std::string where = format("collective #%llu on communicator %s: ", (unsigned long long)seq, c.name);
    if (h0->nops == hq->nops) {
        for (uint64_t i = 0; i < h0->nops; i++) {
            if (memcmp(&a[i], &b[i], sizeof(WireOp)) == 0) continue;
            if (h0->nops > 1) where += format("call %llu of its group: ", (unsigned long long)i + 1);
            return where +
                   format("rank 0 issued %s, rank %d issued %s", describe(a[i]).c_str(), q, describe(b[i]).c_str());
        }
    }
    return where + format("rank 0 issued %s, rank %d issued %s", describe_list(a, h0->nops).c_str(), q,
                          describe_list(b, hq->nops).c_str());
}

// Every rank posts its descriptors, waits for all, compares them with rank 0's.
ncclResult_t post_and_compare(Run& x, const std::vector<const Op*>& ops, uint64_t seq) {
    CommState& c = *x.c;
    WireHead* mine = (WireHead*)c.stage(c.rank);
    mine->seq = seq;
    mine->nops = ops.size();
    for (size_t i = 0; i < ops.size(); i++) ((WireOp*)(mine + 1))[i] = wire(*ops[i]);
    c.slot(c.rank).posted.store(seq, std::memory_order_release);
    ring(c);
    ncclResult_t r = wait_until(x, nullptr, [&] {
        for (int q = 0; q < c.nranks; q++)
            if (c.slot(q).posted.load(std::memory_order_acquire) < seq) return false;
        return true;
    });
    if (r != ncclSuccess) return r;
    const WireHead* h0 = (const WireHead*)c.stage(0);
    for (int q = 1; q < c.nranks; q++) {
        const WireHead* hq = (const WireHead*)c.stage(q);
        if (hq->nops == h0->nops && memcmp(h0 + 1, hq + 1, h0->nops * sizeof(WireOp)) == 0) continue;
        std::string why = mismatch_text(c, seq, h0, hq, q);
        cudacpu::device_fault(cudaErrorLaunchFailure, "%s", why.c_str());
        set_async(c, ncclInvalidUsage, true, why);
        return ncclInvalidUsage;
    }
    return barrier(x);  // nobody overwrites its descriptors before all compared them
}

// An all-reduce's ring chunks (all_reduce.h runRing, one channel, one loop): chunk j holds
// elements [j * len, (j + 1) * len), len = ceil(count / n) rounded up to 16 bytes, and ends
// on rank j. A reduce ends on its root.
ncclResult_t exec_reduce(Run& x, const Op& o, bool all) {  // all-reduce, reduce
    CommState& c = *x.c;
    size_t es = type_size(o.type), per = c.stage_bytes / es;
    size_t align = std::max<size_t>(1, 16 / es), len = (o.count + c.nranks - 1) / c.nranks;
    len = std::max<size_t>(align, (len + align - 1) / align * align);
    std::vector<const char*> src(c.nranks);
    for (size_t off = 0; off < o.count; off += per) {
        size_t m = std::min(per, o.count - off);
        memcpy(c.stage(c.rank), o.send + off * es, m * es);
        if (ncclResult_t r = barrier(x)) return r;
        for (size_t i = 0; (all || c.rank == o.root) && i < m;) {  // one piece per ring chunk
            size_t chunk = (off + i) / len, take = std::min(m - i, (chunk + 1) * len - (off + i));
            for (int q = 0; q < c.nranks; q++) src[q] = c.stage(q) + i * es;
            SumTree t = order_for(c.nranks, all ? (int)chunk : o.root, all, c.id, x.seq, x.call);
            reduce_into(o.recv + (off + i) * es, src.data(), c.nranks, take, o.type, o.red, t);
            i += take;
        }
        if (ncclResult_t r = barrier(x)) return r;
    }
    return ncclSuccess;
}

ncclResult_t exec_reduce_scatter(Run& x, const Op& o) {
    CommState& c = *x.c;
    size_t es = type_size(o.type), per = c.stage_bytes / (es * c.nranks);
    std::vector<const char*> src(c.nranks);
    for (size_t off = 0; off < o.count; off += per) {
        size_t m = std::min(per, o.count - off);
        for (int d = 0; d < c.nranks; d++)
            memcpy(c.stage(c.rank) + d * m * es, o.send + (d * o.count + off) * es, m * es);
        if (ncclResult_t r = barrier(x)) return r;
        for (int q = 0; q < c.nranks; q++) src[q] = c.stage(q) + c.rank * m * es;
        SumTree t = order_for(c.nranks, c.rank, false, c.id, x.seq, x.call);  // this rank's block ends here
        reduce_into(o.recv + off * es, src.data(), c.nranks, m, o.type, o.red, t);
        if (ncclResult_t r = barrier(x)) return r;
    }
    return ncclSuccess;
}

ncclResult_t exec_all_gather(Run& x, const Op& o) {
    CommState& c = *x.c;
    size_t es = type_size(o.type), per = c.stage_bytes / es;
    for (size_t off = 0; off < o.count; off += per) {
        size_t m = std::min(per, o.count - off);
        memcpy(c.stage(c.rank), o.send + off * es, m * es);
        if (ncclResult_t r = barrier(x)) return r;
        for (int q = 0; q < c.nranks; q++) {
            char* dst = o.recv + (q * o.count + off) * es;
            if (dst != o.send + off * es) memcpy(dst, c.stage(q), m * es);  // in place: own block is there
        }
        if (ncclResult_t r = barrier(x)) return r;
    }
    return ncclSuccess;
}

ncclResult_t exec_broadcast(Run& x, const Op& o) {
    CommState& c = *x.c;
    size_t es = type_size(o.type), per = c.stage_bytes / es;
    bool root = c.rank == o.root;
    for (size_t off = 0; off < o.count; off += per) {
        size_t m = std::min(per, o.count - off);
        if (root) memcpy(c.stage(c.rank), o.send + off * es, m * es);
        if (ncclResult_t r = barrier(x)) return r;
        if (!(root && o.recv == o.send)) memcpy(o.recv + off * es, c.stage(o.root), m * es);
        if (ncclResult_t r = barrier(x)) return r;
    }
    return ncclSuccess;
}

ncclResult_t exec_collective(Run& x, const Op& o) {
    switch (o.kind) {
        case K_ALL_REDUCE: return exec_reduce(x, o, true);
        case K_REDUCE: return exec_reduce(x, o, false);
        case K_REDUCE_SCATTER: return exec_reduce_scatter(x, o);
        case K_ALL_GATHER: return exec_all_gather(x, o);
        default: return exec_broadcast(x, o);
    }
}

// ---- send / receive --------------------------------------------------------------------------
struct P2p {
    const Op* op;
    int state;  // 0 post descriptor, 1 match the peer's, 2 move chunks, 3 sender: last chunk taken
    uint64_t k;
    size_t done;
    bool finished;
};

// Moves t on as far as it can without waiting; true if anything changed.
bool p2p_step(Run& x, P2p& t, ncclResult_t* err) {
    CommState& c = *x.c;
    const Op& o = *t.op;
    bool send = o.kind == K_SEND;
    int src = send ? c.rank : o.root, dst = send ? o.root : c.rank;
    Channel& ch = c.chan(src, dst);
    size_t sub = (c.stage_bytes / c.nranks) & ~size_t(63), bytes = o.count * type_size(o.type);
    char* slot = c.stage(src) + dst * sub;
    bool moved = false;
    if (t.state == 0) {
        t.k = (send ? ch.sends : ch.recvs).load(std::memory_order_relaxed);
        (send ? ch.scount : ch.rcount)[t.k & 1] = o.count;
        (send ? ch.stype : ch.rtype)[t.k & 1] = o.type;
        (send ? ch.sends : ch.recvs).store(t.k + 1, std::memory_order_release);
        ring(c);
        t.state = 1;
        moved = true;
    }
    if (t.state == 1) {
        if ((send ? ch.recvs : ch.sends).load(std::memory_order_acquire) < t.k + 1) return moved;
        uint64_t sc = ch.scount[t.k & 1], rc = ch.rcount[t.k & 1];
        int32_t st = ch.stype[t.k & 1], rt = ch.rtype[t.k & 1];
        if (sc != rc || st != rt) {
            std::string why = format(
                "ncclSend/ncclRecv #%llu from rank %d to rank %d on communicator %s: rank %d sends "
                "%llu %s, rank %d receives %llu %s",
                (unsigned long long)t.k + 1, src, dst, c.name, src, (unsigned long long)sc, type_name(st), dst,
                (unsigned long long)rc, type_name(rt));
            cudacpu::device_fault(cudaErrorLaunchFailure, "%s", why.c_str());
            set_async(c, ncclInvalidUsage, true, why);
            *err = ncclInvalidUsage;
            return true;
        }
        t.state = 2;
        moved = true;
    }
    while (t.state == 2 && t.done < bytes) {  // one chunk in the slot at a time
        size_t len = std::min(sub, bytes - t.done);
        if (send) {
            if (ch.consumed.load(std::memory_order_acquire) != ch.written.load(std::memory_order_relaxed)) break;
            memcpy(slot, o.send + t.done, len);
            ch.written.fetch_add(1, std::memory_order_release);
        } else {
            if (ch.written.load(std::memory_order_acquire) == ch.consumed.load(std::memory_order_relaxed)) break;
            memcpy(o.recv + t.done, slot, len);
            ch.consumed.fetch_add(1, std::memory_order_release);
        }
        t.done += len;
        ring(c);
        moved = true;
    }
    if (t.state == 2 && t.done == bytes) t.state = 3;
    // The sender's staging area must be free before its next unit uses it.
    if (t.state == 3 &&
        (!send || ch.consumed.load(std::memory_order_acquire) == ch.written.load(std::memory_order_relaxed))) {
        t.finished = moved = true;
    }
    return moved;
}

ncclResult_t exec_p2p(Run& x, const std::vector<const Op*>& ops) {
    std::vector<P2p> ts;
    for (const Op* o : ops) ts.push_back({o, 0, 0, 0, false});
    SegHeader& h = *x.c->hdr;
    for (;;) {
        uint32_t seen = h.doorbell.load();
        bool all_done = true, moved = false;
        std::vector<int> waiting_on;
        for (size_t i = 0; i < ts.size(); i++) {
            if (ts[i].finished) continue;
            all_done = false;
            bool behind = false;  // ops on one channel go in call order
            for (size_t j = 0; j < i && !behind; j++) {
                behind = !ts[j].finished && ts[j].op->kind == ts[i].op->kind && ts[j].op->root == ts[i].op->root;
            }
            if (behind) continue;
            ncclResult_t err = ncclSuccess;
            moved |= p2p_step(x, ts[i], &err);
            if (err != ncclSuccess) return err;
            if (!ts[i].finished) waiting_on.push_back(ts[i].op->root);
        }
        if (all_done) return ncclSuccess;
        if (moved) continue;
        if (ncclResult_t r = wait_until(x, &waiting_on, [&] { return h.doorbell.load() != seen; })) return r;
    }
}

// ---- units: what one enqueue runs --------------------------------------------------------------
struct Unit {
    std::shared_ptr<CommState> c;
    cudaStream_t stream = nullptr;
    std::vector<Op> ops;
    uint64_t ticket = 0, seq = 0;  // seq: the collective number, 0 for Send/Recv only
    atomic<bool> ran{false};
    bool cancelled = false;  // enqueue refused it and the numbering was rolled back
    ~Unit();
};

void unit_finished(CommState& c, cudaStream_t s) {
    std::lock_guard<std::mutex> l(c.mu);
    c.pending--;
    auto it = c.in_flight.find(s);
    if (it != c.in_flight.end()) c.in_flight.erase(it);
    c.pending_cv.notify_all();
}

// CUDA_CPU_NCCL_CONCURRENT=1: another communicator of c's device with an operation queued
// or running on a stream other than s (which an operation on s could then run beside);
// its description, or "" when there is none.
std::string in_flight_beside(const CommState& c, cudaStream_t s) {
    std::vector<std::shared_ptr<CommState>> others;
    {
        std::lock_guard<std::mutex> l(g_mu);
        for (auto& o : g_live)
            if (o.get() != &c && o->device == c.device) others.push_back(o);
    }
    for (auto& o : others) {
        std::lock_guard<std::mutex> l(o->mu);
        for (cudaStream_t t : o->in_flight)
            if (t != s) return format("communicator %s has an operation in flight on stream %p", o->name, (void*)t);
    }
    return "";
}

// A closure dropped without running (stream destroyed, device faulted): its ticket must not
// hold up later ones, and the peers cannot complete that collective.
Unit::~Unit() {
    if (ran.load()) return;
    end_ticket(c->device, ticket);
    if (!cancelled) {
        std::string why = format("a queued NCCL operation on communicator %s never ran (its stream was destroyed "
                                 "or the device faulted)", c->name);
        set_async(*c, ncclUnhandledCudaError, true, why);
    }
    unit_finished(*c, stream);
}

void run_unit(Unit& u) {
    u.ran = true;
    CommState& c = *u.c;
    std::vector<const Op*> coll, p2p;
    for (const Op& o : u.ops) (is_p2p(o.kind) ? p2p : coll).push_back(&o);
    bool turn = wait_turn(c, u.ticket);
    if (u.seq) c.started.store(u.seq);
    if (turn && !c.abort_local.load() && c.async.load() == ncclSuccess) {
        Run x{&c, "", 0, 0, u.seq, 0};
        std::vector<WireOp> w;
        for (const Op* o : coll) w.push_back(wire(*o));
        x.text = u.seq ? format("collective #%llu (%s)", (unsigned long long)u.seq,
                                describe_list(w.data(), w.size()).c_str())
                       : format("%zu ncclSend/ncclRecv", p2p.size());
        publish_running(c.device, u.seq ? RUN_COLL : RUN_P2P, c.id, u.seq, x.text);
        ncclResult_t r = coll.empty() ? ncclSuccess : post_and_compare(x, coll, u.seq);
        for (size_t i = 0; i < coll.size() && r == ncclSuccess; i++) {
            x.call = (int)i;
            r = exec_collective(x, *coll[i]);
        }
        if (r == ncclSuccess && !p2p.empty()) r = exec_p2p(x, p2p);
        publish_running(c.device, RUN_IDLE, 0, 0, "");
    }
    end_ticket(c.device, u.ticket);
    unit_finished(c, u.stream);
}

ncclResult_t launch(const std::shared_ptr<CommState>& c, cudaStream_t s, std::vector<Op> ops, const char* label) {
    if (concurrent_mode()) {
        std::string beside = in_flight_beside(*c, s);
        if (!beside.empty()) {
            std::string why = format("%s on communicator %s, stream %p, while %s of the same device: the two may run "
                                     "at once on one GPU, which NCCL does not support (CUDA_CPU_NCCL_CONCURRENT=1; "
                                     "queue a device's communicators on one stream)",
                                     label, c->name, (void*)s, beside.c_str());
            cudacpu::device_fault(cudaErrorLaunchFailure, "%s", why.c_str());
            set_async(*c, ncclInvalidUsage, true, why);
            return fail(ncclInvalidUsage, "%s", why.c_str());
        }
    }
    auto u = std::make_shared<Unit>();
    u->c = c;
    u->ops = std::move(ops);
    size_t ncoll = std::count_if(u->ops.begin(), u->ops.end(), [](const Op& o) { return !is_p2p(o.kind); });
    if (sizeof(WireHead) + ncoll * sizeof(WireOp) > c->stage_bytes) {  // the descriptors go through staging
        return fail(ncclInvalidUsage,
                    "%s: %zu collectives in one group on communicator %s: cuda_cpu takes at most %zu "
                    "(raise CUDA_CPU_NCCL_STAGE_BYTES)",
                    label, ncoll, c->name, (c->stage_bytes - sizeof(WireHead)) / sizeof(WireOp));
    }
    bool coll = ncoll > 0;
    u->stream = s;
    {
        std::lock_guard<std::mutex> l(g_tmu);  // ticket and number in one order across threads
        u->ticket = g_tickets[c->device].next++;
        if (coll) u->seq = ++c->launched;
    }
    {
        std::lock_guard<std::mutex> l(c->mu);
        c->pending++;
        c->streams.insert(s);
        c->in_flight.insert(s);
    }
    cudaError_t e = cudacpu::enqueue(s, label, [u] { run_unit(*u); });
    if (e == cudaSuccess) return ncclSuccess;
    if (!u->ran.load() && u.use_count() == 1) {  // refused, not queued: undo the numbering
        std::lock_guard<std::mutex> l(g_tmu);
        if (!u->seq || c->launched.load() == u->seq) {
            if (u->seq) c->launched--;
            u->cancelled = true;
        }
    }
    if (e == cudacpu::sticky_error()) {  // the device faulted: this rank is out; its peers must not wait for it
        set_async(*c, ncclUnhandledCudaError, true,
                  format("%s on communicator %s was not queued: the device has faulted (%s)", label, c->name,
                         cudaGetErrorString(e)));
    }
    return fail(ncclUnhandledCudaError, "%s: cannot queue on stream %p: %s", label, (void*)s, cudaGetErrorString(e));
}

// ---- groups -------------------------------------------------------------------------------------
struct Recorded {
    std::shared_ptr<CommState> c;
    cudaStream_t s;
    Op op;
};
thread_local int t_depth = 0;
thread_local std::vector<Recorded> t_group;
thread_local ncclResult_t t_group_error = ncclSuccess;

ncclResult_t refuse(ncclResult_t r) {  // a failed call inside a group fails the group
    if (t_depth > 0 && t_group_error == ncclSuccess) t_group_error = r;
    return r;
}

ncclResult_t submit(const std::shared_ptr<CommState>& c, cudaStream_t s, const Op& o) {
    if (t_depth > 0) {
        t_group.push_back({c, s, o});
        return ncclSuccess;
    }
    return launch(c, s, {o}, kKindNames[o.kind]);
}

// One unit per (communicator, stream), in the order each first appears.
ncclResult_t launch_group(std::vector<Recorded> calls) {
    ncclResult_t first = ncclSuccess;
    std::vector<bool> taken(calls.size(), false);
    for (size_t i = 0; i < calls.size(); i++) {
        if (taken[i]) continue;
        std::vector<Op> ops;
        for (size_t j = i; j < calls.size(); j++) {
            if (taken[j] || calls[j].c != calls[i].c || calls[j].s != calls[i].s) continue;
            ops.push_back(calls[j].op);
            taken[j] = true;
        }
        const char* label = ops.size() == 1 ? kKindNames[ops[0].kind] : "ncclGroupEnd";
        ncclResult_t r = launch(calls[i].c, calls[i].s, std::move(ops), label);
        if (first == ncclSuccess) first = r;
    }
    return first;
}

// ---- call-time validation ------------------------------------------------------------------------
bool overlap(const char* a, size_t an, const char* b, size_t bn) { return an && bn && a < b + bn && b < a + an; }

ncclResult_t check_buffer(const char* call, const char* which, const void* p, size_t bytes) {
    std::string what = format("%s %s", call, which);
    if (cudacpu::check_device_range(p, bytes, what.c_str(), true)) return ncclSuccess;
    return fail(ncclInvalidArgument, "%s: %s %p (%zu bytes) is not inside a device allocation", call, which, p, bytes);
}

ncclResult_t validate(CommState& c, const Op& o) {
    const char* call = kKindNames[o.kind];
    if (!type_name(o.type)) {
        return fail(ncclInvalidArgument, "%s: datatype %d is %s", call, (int)o.type,
                    o.type == ncclFloat8e4m3 || o.type == ncclFloat8e5m2 ? "an fp8 type, not emulated by cuda_cpu"
                                                                         : "not an ncclDataType_t");
    }
    if (reduces(o.kind) && ((int)o.red < 0 || (int)o.red >= (int)ncclNumOps)) {
        return fail(ncclInvalidArgument, "%s: reduction %d is not ncclSum, ncclProd, ncclMax, ncclMin or ncclAvg", call,
                    (int)o.red);
    }
    if ((rooted(o.kind) || is_p2p(o.kind)) && (o.root < 0 || o.root >= c.nranks)) {
        return fail(ncclInvalidArgument, "%s: %s %d is not a rank of communicator %s (%d ranks)", call,
                    is_p2p(o.kind) ? "peer" : "root", o.root, c.name, c.nranks);
    }
    if (o.count == 0) return ncclSuccess;
    size_t es = type_size(o.type), n = (size_t)c.nranks;
    if (o.count > SIZE_MAX / es / n) return fail(ncclInvalidArgument, "%s: count %zu is too large", call, o.count);
    size_t one = o.count * es, all = one * n, mine = (size_t)c.rank * one;
    bool is_root = c.rank == o.root;
    size_t sb = 0, rb = 0;  // bytes read from sendbuff, written to recvbuff
    switch (o.kind) {
        case K_REDUCE_SCATTER:
            sb = all;
            rb = one;
            break;
        case K_ALL_GATHER:
            sb = one;
            rb = all;
            break;
        case K_BROADCAST:
            sb = is_root ? one : 0;
            rb = one;
            break;
        case K_REDUCE:
            sb = one;
            rb = is_root ? one : 0;
            break;
        case K_SEND: sb = one; break;
        case K_RECV: rb = one; break;
        default: sb = rb = one;
    }
    if (sb) {
        if (ncclResult_t r = check_buffer(call, "sendbuff", o.send, sb)) return r;
    }
    if (rb) {
        if (ncclResult_t r = check_buffer(call, "recvbuff", o.recv, rb)) return r;
    }
    if (!overlap(o.send, sb, o.recv, rb)) return ncclSuccess;
    // NCCL's in-place forms; any other overlap would read what another step overwrote.
    const char* rule = "recvbuff == sendbuff";
    const char* diff = "recvbuff - sendbuff";
    ptrdiff_t actual = (ptrdiff_t)((uintptr_t)o.recv - (uintptr_t)o.send), expected = 0;
    if (o.kind == K_REDUCE_SCATTER) {
        rule = "recvbuff == sendbuff + rank*recvcount";
        expected = (ptrdiff_t)mine;
    } else if (o.kind == K_ALL_GATHER) {
        rule = "sendbuff == recvbuff + rank*sendcount";
        diff = "sendbuff - recvbuff";
        actual = -actual;
        expected = (ptrdiff_t)mine;
    }
    if (actual == expected) return ncclSuccess;
    return fail(ncclInvalidArgument,
                "%s: sendbuff and recvbuff overlap but not in NCCL's in-place form (%s, rank %d): "
                "%s is %td bytes (%td elements), expected %td bytes (%td elements)",
                call, rule, c.rank, diff, actual, actual / (ptrdiff_t)es, expected, expected / (ptrdiff_t)es);
}

ncclResult_t call(ncclComm_t comm, cudaStream_t s, const Op& o) {
    std::shared_ptr<CommState> c;
    if (ncclResult_t r = resolve(comm, kKindNames[o.kind], &c, false)) return refuse(r);
    if (ncclResult_t r = validate(*c, o)) return refuse(r);
    if (o.count == 0 && !is_p2p(o.kind)) return ncclSuccess;  // NCCL skips empty collectives
    return refuse(submit(c, s, o));
}

// ---- communicator set-up ------------------------------------------------------------------------
uint64_t random64() {
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) v = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e9);
    return v;
}

ncclResult_t map_segment(CommState& c, int fd, size_t bytes, const char* call) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return fail(ncclSystemError, "%s: mmap of %zu bytes: %s", call, bytes, strerror(errno));
    c.base = (char*)p;
    c.bytes = bytes;
    c.hdr = (SegHeader*)p;
    return ncclSuccess;
}

void point_into(CommState& c, const Layout& L) {
    c.slots = (RankSlot*)(c.base + L.slots);
    c.chans = (Channel*)(c.base + L.chans);
    c.staging = c.base + L.stage;
}

ncclResult_t create_segment(CommState& c, const IdPayload& id, const Layout& L, const char* call) {
    int fd = shm_open(id.shm_name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return fail(ncclSystemError, "%s: shm_open(%s): %s", call, id.shm_name, strerror(errno));
    int e = ftruncate(fd, (off_t)L.total) != 0 ? errno : posix_fallocate(fd, 0, (off_t)L.total);
    ncclResult_t r = e ? fail(ncclSystemError,
                              "%s: cannot reserve %zu bytes of shared memory for communicator %s: %s "
                              "(is /dev/shm full?)", call, L.total, c.name, strerror(e))
                       : map_segment(c, fd, L.total, call);
    close(fd);
    if (r != ncclSuccess) {
        shm_unlink(id.shm_name);
        return r;
    }
    memcpy(c.hdr->magic, kMagic, sizeof(kMagic));
    c.hdr->comm_id = c.id;
    c.hdr->stage_bytes = c.stage_bytes;
    c.hdr->nranks = c.nranks;
    c.hdr->ready.store(1, std::memory_order_release);
    return ncclSuccess;
}

// Waits for rank 0's segment, then checks that it is the communicator this rank expects.
ncclResult_t open_segment(CommState& c, const IdPayload& id, const Layout& L, double deadline, const char* call) {
    for (;;) {
        int fd = shm_open(id.shm_name, O_RDWR, 0);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(SegHeader)) {
            ncclResult_t r = map_segment(c, fd, (size_t)st.st_size, call);
            close(fd);
            if (r != ncclSuccess) return r;
            while (!c.hdr->ready.load(std::memory_order_acquire) && now_s() < deadline) usleep(1000);
            if (!c.hdr->ready.load()) break;
            if (c.hdr->nranks != c.nranks || c.bytes != L.total) {
                return fail(ncclInvalidUsage,
                            "%s: rank %d was given nranks %d, but rank 0 created communicator %s for %d", call, c.rank,
                            c.nranks, c.name, c.hdr->nranks);
            }
            point_into(c, L);
            return ncclSuccess;
        }
        if (fd >= 0) close(fd);
        if (now_s() >= deadline) break;
        usleep(10000);
    }
    return fail(ncclSystemError,
                "%s: rank %d waited %.0f s (CUDA_CPU_NCCL_INIT_TIMEOUT) for rank 0 to create communicator %s", call,
                c.rank, env_double("CUDA_CPU_NCCL_INIT_TIMEOUT", 600), c.name);
}

std::string uuid_text(const unsigned char* u) {
    std::string s = "GPU-";
    for (int i = 0; i < 16; i++) s += format(i == 4 || i == 6 || i == 8 || i == 10 ? "-%02x" : "%02x", u[i]);
    return s;
}

// Claims this rank's slot, waits for all ranks, refuses two ranks on one GPU.
ncclResult_t join(CommState& c, const IdPayload& id, double deadline, const char* call) {
    RankSlot& me = c.slot(c.rank);
    uint32_t zero = 0;
    if (!me.claimed.compare_exchange_strong(zero, 1)) {
        return fail(ncclInvalidUsage, "%s: rank %d of communicator %s was already taken (by pid %d)", call, c.rank,
                    c.name, me.pid.load());
    }
    cudacpu::device_uuid(c.device, me.uuid);
    me.pid.store(getpid());
    c.hdr->joined.fetch_add(1, std::memory_order_acq_rel);
    ring(c);
    while (c.hdr->joined.load(std::memory_order_acquire) < c.nranks) {
        for (int q = 0; q < c.nranks; q++) {
            // One that joined and left already is for the operations to report.
            if (!process_alive(c.slot(q).pid.load()) && c.hdr->joined.load() < c.nranks) {
                return fail(ncclRemoteError, "%s: rank %d (pid %d) exited while communicator %s was being set up", call,
                            q, c.slot(q).pid.load(), c.name);
            }
        }
        if (now_s() >= deadline) {
            std::string missing;
            for (int q = 0; q < c.nranks; q++)
                if (!c.slot(q).claimed.load()) missing += format(missing.empty() ? "%d" : ", %d", q);
            return fail(ncclSystemError,
                        "%s: only %d of %d ranks joined communicator %s in %.0f s "
                        "(CUDA_CPU_NCCL_INIT_TIMEOUT); missing ranks: %s",
                        call, c.hdr->joined.load(), c.nranks, c.name, env_double("CUDA_CPU_NCCL_INIT_TIMEOUT", 600),
                        missing.c_str());
        }
        uint32_t seen = c.hdr->doorbell.load();
        c.hdr->sleepers.fetch_add(1);
        futex_wait(&c.hdr->doorbell, seen, 0.05);
        c.hdr->sleepers.fetch_sub(1);
    }
    shm_unlink(id.shm_name);  // all have it mapped; whoever comes first removes the name
    for (int a = 0; a < c.nranks; a++) {
        for (int b = a + 1; b < c.nranks; b++) {
            if (memcmp(c.slot(a).uuid, c.slot(b).uuid, 16) != 0) continue;
            return fail(ncclInvalidUsage,
                        "%s: ranks %d (pid %d) and %d (pid %d) of communicator %s use the same GPU (%s); "
                        "NCCL needs a GPU of its own for each rank",
                        call, a, c.slot(a).pid.load(), b, c.slot(b).pid.load(), c.name,
                        uuid_text(c.slot(a).uuid).c_str());
        }
    }
    return ncclSuccess;
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& uid, int rank, const char* call) {
    if (!out) return fail(ncclInvalidArgument, "%s: comm is NULL", call);
    *out = nullptr;
    IdPayload id;
    memcpy(&id, &uid, sizeof(id));
    if (memcmp(id.magic, kMagic, sizeof(kMagic)) != 0) {
        return fail(ncclInvalidArgument, "%s: the ncclUniqueId does not come from ncclGetUniqueId", call);
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        return fail(ncclInvalidArgument, "%s: rank %d of %d ranks", call, rank, nranks);
    }
    auto c = std::make_shared<CommState>();
    c->id = id.comm_id;
    c->nranks = nranks;
    c->rank = rank;
    c->device = cudacpu::current_device();
    if (!cudacpu::device_memory_charge(c->device, cudacpu::nccl_buffer_bytes(nranks))) {  // released by retire
        return fail(ncclUnhandledCudaError, "%s: no device memory for its buffers (%zu MiB, CUDA_CPU_NCCL_MEMORY_MIB)",
                    call, cudacpu::nccl_buffer_bytes(nranks) >> 20);
    }
    // Send/Recv slots of 64 bytes at least: the same on every rank, computed from the id.
    c->stage_bytes = std::max<size_t>(id.stage_bytes, ((size_t)64 * nranks + 4095) & ~size_t(4095));
    snprintf(c->name, sizeof(c->name), "%08x", (unsigned)(id.comm_id >> 32));
    Layout L = layout(nranks, c->stage_bytes);
    double deadline = now_s() + env_double("CUDA_CPU_NCCL_INIT_TIMEOUT", 600);
    ncclResult_t r = rank == 0 ? create_segment(*c, id, L, call) : open_segment(*c, id, L, deadline, call);
    if (r == ncclSuccess) {
        if (rank == 0) point_into(*c, L);
        r = join(*c, id, deadline, call);
    }
    if (r != ncclSuccess) {
        shm_unlink(id.shm_name);  // a late rank then fails too, instead of joining a dead one
        cudacpu::device_memory_uncharge(c->device, cudacpu::nccl_buffer_bytes(nranks));
        return r;
    }
    ncclComm* h = new ncclComm{H_LIVE, c};
    std::lock_guard<std::mutex> l(g_mu);
    g_handles.insert(h);
    g_live.push_back(c);
    *out = h;
    return ncclSuccess;
}

// CUDA_CPU_NCCL_PEERS=local's destroy: until every rank has departed (destroyed or aborted),
// however long; past kInversionAfterS one note names those it waits for, a dead one too.
void wait_all_departed(CommState& c) {
    double start = now_s();
    bool noted = false;
    for (;;) {
        uint32_t seen = c.hdr->doorbell.load();
        std::string missing;
        for (int q = 0; q < c.nranks; q++) {
            if (c.slot(q).departed.load()) continue;
            int pid = c.slot(q).pid.load();
            missing += format("%s%d (pid %d%s)", missing.empty() ? "" : ", ", q, pid,
                              process_alive(pid) ? "" : ", exited");
        }
        if (missing.empty()) return;
        if (!noted && now_s() - start >= kInversionAfterS) {
            noted = true;
            cudacpu::diag("ncclCommDestroy: rank %d of communicator %s waits for rank %s to reach ncclCommDestroy or "
                          "ncclCommAbort (CUDA_CPU_NCCL_PEERS=local: NCCL finalizes in destroy, which every rank "
                          "must call; after an error or a timeout, ncclCommAbort)",
                          c.rank, c.name, missing.c_str());
        }
        c.hdr->sleepers.fetch_add(1);
        futex_wait(&c.hdr->doorbell, seen, 0.05);
        c.hdr->sleepers.fetch_sub(1);
    }
}

ncclResult_t query(ncclComm_t comm, const char* call, int* out, int CommState::*field) {
    std::shared_ptr<CommState> c;
    if (ncclResult_t r = resolve(comm, call, &c, true)) return r;
    if (!out) return fail(ncclInvalidArgument, "%s: the result pointer is NULL", call);
    *out = (*c).*field;
    return ncclSuccess;
}

}  // namespace

// ===================================== nccl.h ======================================================
extern "C" {

ncclResult_t ncclGetVersion(int* version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error";
        case ncclSystemError: return "unhandled system error";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

const char* ncclGetLastError(ncclComm_t comm) {
    thread_local std::string out;
    out = t_error;
    std::lock_guard<std::mutex> l(g_mu);
    if (comm && g_handles.count(comm) && comm->st) {
        std::lock_guard<std::mutex> l2(comm->st->mu);
        if (comm->st->async_at > t_error_at) out = comm->st->async_text;
    }
    return out.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uid) {
    if (!uid) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    static atomic<unsigned> counter{0};
    IdPayload id;
    memset(&id, 0, sizeof(id));
    memcpy(id.magic, kMagic, sizeof(kMagic));
    id.comm_id = random64();
    id.stage_bytes = (size_t)env_double("CUDA_CPU_NCCL_STAGE_BYTES", kDefaultStage);
    id.stage_bytes = std::max<uint64_t>(4096, id.stage_bytes & ~uint64_t(4095));
    snprintf(id.shm_name, sizeof(id.shm_name), "/cudacpu-nccl.%d.%u.%016llx", (int)getpid(), counter++,
             (unsigned long long)random64());
    memset(uid, 0, sizeof(*uid));
    memcpy(uid, &id, sizeof(id));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
    return init_rank(comm, nranks, commId, rank, "ncclCommInitRank");
}

// Communicators are always blocking here: the config is accepted and otherwise ignored.
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t*) {
    return init_rank(comm, nranks, commId, rank, "ncclCommInitRankConfig");
}

// Like ncclCommFinalize + destroy: waits until the communicator's queued work has run; with
// CUDA_CPU_NCCL_PEERS=local also until every rank has reached its destroy or abort.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    std::shared_ptr<CommState> c;
    if (ncclResult_t r = resolve(comm, "ncclCommDestroy", &c, true)) return r;
    std::vector<cudaStream_t> streams;
    {
        std::lock_guard<std::mutex> l(c->mu);
        if (c->pending > 0) streams.assign(c->streams.begin(), c->streams.end());
    }
    // Lazy execution runs queued work only when something waits for it.
    if (lazy_mode())
        for (cudaStream_t s : streams) (void)cudaStreamSynchronize(s);
    {
        std::unique_lock<std::mutex> l(c->mu);
        while (c->pending > 0) c->pending_cv.wait_for(l, std::chrono::milliseconds(100));
    }
    c->slot(c->rank).departed.store(1);
    ring(*c);
    if (peers_local()) wait_all_departed(*c);
    retire(comm, H_DESTROYED);
    return ncclSuccess;
}

// Operations waiting on peers see the flag and give up; the peers see the segment's
// aborted-by word (ncclRemoteError). Then it returns at once, or with CUDA_CPU_NCCL_ABORT=block
// waits first until the work queued on the communicator's device has run, as a GPU's
// ncclCommAbort may (it frees device memory, which synchronizes the device): behind a kernel
// that never ends, forever. The handle is retired before: a call made meanwhile is refused.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    std::shared_ptr<CommState> c;
    if (ncclResult_t r = resolve(comm, "ncclCommAbort", &c, true)) return r;
    c->abort_local.store(true);
    int32_t zero = 0;
    c->hdr->aborted_by.compare_exchange_strong(zero, c->rank + 1);
    c->slot(c->rank).departed.store(1);  // a peer's destroy (CUDA_CPU_NCCL_PEERS=local) need not wait for it
    ring(*c);
    {
        std::lock_guard<std::mutex> l(g_tmu);
        g_tcv.notify_all();  // a unit waiting for its turn gives up now
    }
    retire(comm, H_ABORTED);
    static const char* const modes[] = {"return", "block"};
    if (cudacpu::env_choice("NCCL_ABORT", modes, 2) == 1) {
        int before = 0;
        cudaGetDevice(&before);
        cudaSetDevice(c->device);
        (void)cudaDeviceSynchronize();  // its sticky error, if any, is not abort's to report
        cudaSetDevice(before);
    }
    return ncclSuccess;
}

// Also notices, between operations, a peer that aborted, failed or exited.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    std::shared_ptr<CommState> c;
    if (ncclResult_t r = resolve(comm, "ncclCommGetAsyncError", &c, true)) return r;
    if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    if (peers_local()) {  // this rank's own errors only
        *asyncError = (ncclResult_t)c->async.load();
        return ncclSuccess;
    }
    int32_t ab = c->hdr->aborted_by.load(), ew = c->hdr->error_word.load();
    if (c->async.load() == ncclSuccess && ab && ab - 1 != c->rank) {
        set_async(*c, ncclRemoteError, false, format("rank %d aborted communicator %s", ab - 1, c->name));
    } else if (c->async.load() == ncclSuccess && ew && (ew >> 8) - 1 != c->rank) {
        set_async(*c, ncclRemoteError, false,
                  format("rank %d of communicator %s failed (%s)", (ew >> 8) - 1, c->name,
                         ncclGetErrorString((ncclResult_t)(ew & 0xff))));
    }
    bool probe;
    {
        std::lock_guard<std::mutex> l(c->mu);
        double t = now_s();
        probe = t >= c->next_host_liveness;
        if (probe) c->next_host_liveness = t + 0.05;
    }
    for (int q = 0; probe && q < c->nranks && c->async.load() == ncclSuccess; q++) {
        RankSlot& s = c->slot(q);
        if (q != c->rank && !s.departed.load() && !process_alive(s.pid.load())) {
            set_async(*c, ncclRemoteError, false,
                      format("rank %d (pid %d) of communicator %s has exited", q, s.pid.load(), c->name));
        }
    }
    *asyncError = (ncclResult_t)c->async.load();
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    return query(comm, "ncclCommCount", count, &CommState::nranks);
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    return query(comm, "ncclCommCuDevice", device, &CommState::device);
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    return query(comm, "ncclCommUserRank", rank, &CommState::rank);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return call(comm, stream, {K_ALL_REDUCE, datatype, op, 0, count, (const char*)sendbuff, (char*)recvbuff});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return call(comm, stream, {K_REDUCE_SCATTER, datatype, op, 0, recvcount, (const char*)sendbuff, (char*)recvbuff});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return call(comm, stream, {K_ALL_GATHER, datatype, ncclSum, 0, sendcount, (const char*)sendbuff, (char*)recvbuff});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return call(comm, stream, {K_BROADCAST, datatype, ncclSum, root, count, (const char*)sendbuff, (char*)recvbuff});
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    return call(comm, stream, {K_REDUCE, datatype, op, root, count, (const char*)sendbuff, (char*)recvbuff});
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return call(comm, stream, {K_SEND, datatype, ncclSum, peer, count, (const char*)sendbuff, nullptr});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return call(comm, stream, {K_RECV, datatype, ncclSum, peer, count, nullptr, (char*)recvbuff});
}

ncclResult_t ncclGroupStart() {
    t_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (t_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart to end");
    if (--t_depth > 0) return ncclSuccess;  // nested: the outermost end launches
    std::vector<Recorded> calls;
    calls.swap(t_group);
    ncclResult_t err = t_group_error;
    t_group_error = ncclSuccess;
    if (err != ncclSuccess) {
        std::string cause = t_error;
        return fail(err, "ncclGroupEnd: nothing launched, a call in the group failed: %s", cause.c_str());
    }
    return launch_group(std::move(calls));
}

}  // extern "C"
