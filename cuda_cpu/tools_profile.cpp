/*
 * cuda_cpu/tools_profile.cpp: the profiler (CUDA_CPU_PROFILE=FILE), from the accesses
 * tools.cpp sees, counted as Nsight Compute counts them per kernel.
 *
 * Requests. A request is one warp-wide memory instruction. The layer runs a warp's lanes
 * one after another, so their accesses are put back together: between two points where the
 * warp's lanes meet (a warp collective, a __syncthreads, the block's end), the n-th access
 * that lane l makes at instruction (return address) pc and the n-th that lane l' makes at
 * the same pc are one request, as the lanes of a warp execute an instruction together.
 *
 * Units per request, for the lanes' accesses [addr, addr + size):
 *   global   32-byte sectors touched; ideal: the distinct bytes asked, in sectors (rounded up)
 *   shared   wavefronts of sm_90's 32 banks of 4 bytes: accesses of up to 4 bytes go in one
 *            phase of 32 lanes, 8-byte ones in 2 phases of 16, 16-byte ones in 4 of 8; a
 *            phase takes as many wavefronts as the most distinct 4-byte words any one bank
 *            holds (lanes reading one word share it: a broadcast); ideal: the distinct words
 *            asked, in 32s (rounded up)
 *   local    bytes (the thread's own stack frame: what g++ keeps in memory, see the docs)
 */
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda_cpu.h"  // the qualifiers before the toolkit's headers (internal.h)
#include "internal.h"
#include "tools.h"

namespace cudacpu {
namespace tools {

void KernelStats::add(const KernelStats& o) {
    launches += o.launches;
    blocks += o.blocks;
    threads += o.threads;
    wmma_mma += o.wmma_mma;
    for (int s = 0; s < NUM_SPACES; s++)
        for (int k = 0; k < NUM_KINDS; k++) traffic[s][k].add(o.traffic[s][k]);
    for (const auto& p : o.pcs) {
        PcTraffic& mine = pcs[p.first];
        mine.space = p.second.space;
        mine.kind = p.second.kind;
        const PcTraffic& o = p.second;
        if (o.first_offset >= 0) {
            if (mine.first_offset < 0) {
                mine.first_offset = o.first_offset;
                mine.lo = o.lo;
                mine.hi = o.hi;
            }
            mine.offsets_vary |= o.offsets_vary || mine.first_offset != o.first_offset;
            mine.lo = std::min(mine.lo, o.lo);
            mine.hi = std::max(mine.hi, o.hi);
        }
        mine.t.add(o.t);
    }
}

// ---- one request ---------------------------------------------------------------------------------
static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Small sets of addresses, sorted in place (a request has at most a few hundred).
static size_t sort_unique(uintptr_t* v, size_t n) {
    std::sort(v, v + n);
    return std::unique(v, v + n) - v;
}

static const int kMaxUnits = 4096;  // words or sectors of one request we look at (more: ignored)

static Traffic global_request(const Access* const* a, int n) {
    uintptr_t sectors[kMaxUnits];
    std::pair<uintptr_t, uintptr_t> iv[256];
    size_t ns = 0;
    Traffic t;
    for (int i = 0; i < n; i++) {
        for (uintptr_t s = a[i]->addr >> 5; s <= (a[i]->addr + a[i]->size - 1) >> 5 && ns < kMaxUnits; s++) {
            sectors[ns++] = s;
        }
        t.bytes += a[i]->size;
        if (i < 256) iv[i] = {a[i]->addr, a[i]->addr + a[i]->size};
    }
    t.requests = 1;
    t.units = sort_unique(sectors, ns);
    // The distinct bytes asked, in sectors.
    int m = std::min(n, 256);
    std::sort(iv, iv + m);
    uint64_t bytes = 0;
    uintptr_t lo = iv[0].first, hi = iv[0].second;
    for (int i = 1; i < m; i++) {
        if (iv[i].first > hi) {
            bytes += hi - lo;
            lo = iv[i].first;
        }
        hi = std::max(hi, iv[i].second);
    }
    t.ideal = ceil_div(bytes + (hi - lo), 32);
    return t;
}

static Traffic shared_request(const Access* const* a, int n) {
    unsigned widest = 0;
    for (int i = 0; i < n; i++) widest = std::max<unsigned>(widest, a[i]->size);
    int lanes_per_phase = widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
    // Words tagged with their phase in the top bits (addresses use 47).
    uintptr_t words[kMaxUnits];
    size_t nw = 0;
    Traffic t;
    for (int i = 0; i < n; i++) {
        uintptr_t phase = (uintptr_t)((a[i]->thread & 31) / lanes_per_phase) << 56;
        for (uintptr_t wd = a[i]->addr >> 2; wd <= (a[i]->addr + a[i]->size - 1) >> 2 && nw < kMaxUnits; wd++) {
            words[nw++] = phase | wd;
        }
        t.bytes += a[i]->size;
    }
    nw = sort_unique(words, nw);
    uint64_t wavefronts = 0;
    for (size_t i = 0; i < nw;) {
        uintptr_t phase = words[i] >> 56;
        int per_bank[32] = {0}, most = 0;
        for (; i < nw && words[i] >> 56 == phase; i++) most = std::max(most, ++per_bank[words[i] & 31]);
        wavefronts += most;
    }
    for (size_t i = 0; i < nw; i++) words[i] &= ((uintptr_t)1 << 56) - 1;
    t.requests = 1;
    t.units = wavefronts;
    t.ideal = std::max<uint64_t>(1, ceil_div(sort_unique(words, nw), 32));
    return t;
}

// A small cache in front of the per-instruction map (its nodes stay put).
struct PcCache {
    uintptr_t pc[64];
    PcTraffic* slot[64];
};
static thread_local PcCache pc_cache;
static thread_local const KernelStats* pc_cache_owner;

static PcTraffic& pc_traffic(Worker* w, uintptr_t pc) {
    if (pc_cache_owner != &w->stats || w->stats.pcs.empty()) {
        memset(&pc_cache, 0, sizeof(pc_cache));
        pc_cache_owner = &w->stats;
    }
    unsigned h = (unsigned)((pc >> 2) ^ (pc >> 9)) & 63;
    if (pc_cache.pc[h] != pc || !pc_cache.slot[h]) {
        pc_cache.pc[h] = pc;
        pc_cache.slot[h] = &w->stats.pcs[pc];
    }
    return *pc_cache.slot[h];
}

static void count_request(Worker* w, const Access* const* a, int n) {
    int space = a[0]->space, kind = a[0]->kind;
    PcTraffic& p = pc_traffic(w, a[0]->pc);
    p.space = (uint8_t)space;
    p.kind = (uint8_t)kind;
    Traffic t;
    if (space == SPACE_GLOBAL) {
        t = global_request(a, n);
    } else if (space == SPACE_SHARED) {
        t = shared_request(a, n);
    } else {  // local: the thread's stack-slot offsets decide (profile_launch_end)
        t.requests = 1;
        for (int i = 0; i < n; i++) {
            t.bytes += a[i]->size;
            int64_t off = (int64_t)((a[i]->addr - w->stack_lo) % w->stack_slot);
            if (p.first_offset < 0) {
                p.first_offset = p.lo = off;
                p.hi = off + a[i]->size;
            } else if (off != p.first_offset) {
                p.offsets_vary = true;
                p.lo = std::min(p.lo, off);
                p.hi = std::max(p.hi, off + (int64_t)a[i]->size);
            }
        }
        p.t.add(t);
        return;
    }
    w->stats.traffic[space][kind].add(t);
    p.t.add(t);
}

// Counts the requests of group (accesses of one instruction, one per lane or more), split
// by space where one instruction reached several (a generic pointer).
static void count_group(Worker* w, const Access** g, int n) {
    bool mixed = false;
    for (int i = 1; i < n; i++) mixed |= g[i]->space != g[0]->space;
    if (!mixed) {
        count_request(w, g, n);
        return;
    }
    for (int s = 0; s < NUM_SPACES; s++) {
        const Access* part[kMaxUnits];
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (g[i]->space == s) part[m++] = g[i];
        }
        if (m) count_request(w, part, m);
    }
}

// ---- grouping a warp's accesses into requests -------------------------------------------------------
// The common case: every lane ran the same instructions in the same order (one run of
// records per lane, equal lengths, the same pcs): access i of each lane is one request.
static bool flush_converged(Worker* w, const std::vector<Access>& v) {
    int starts[33] = {0}, lanes = 0;
    for (size_t i = 0; i < v.size(); i++) {
        if (i == 0 || v[i].thread != v[i - 1].thread) {
            if (lanes == 32) return false;
            for (int l = 0; l < lanes; l++) {
                if (v[starts[l]].thread == v[i].thread) return false;  // a lane in two runs
            }
            starts[lanes++] = (int)i;
        }
    }
    starts[lanes] = (int)v.size();
    size_t len = (size_t)starts[1] - starts[0];
    for (int l = 1; l < lanes; l++) {
        if ((size_t)(starts[l + 1] - starts[l]) != len) return false;
        for (size_t i = 0; i < len; i++) {
            if (v[starts[l] + i].pc != v[starts[0] + i].pc) return false;
        }
    }
    const Access* g[32];
    for (size_t i = 0; i < len; i++) {
        for (int l = 0; l < lanes; l++) g[l] = &v[starts[l] + i];
        count_group(w, g, lanes);
    }
    return true;
}

// Otherwise (divergent lanes): the n-th access of each lane at one pc form a request.
struct Keyed {
    uintptr_t pc;
    uint32_t n;
    uint32_t index;
};

void profile_flush(Worker* w, int warp) {
    std::vector<Access>& v = w->pending[warp];
    if (v.empty()) return;
    if (flush_converged(w, v)) {
        v.clear();
        return;
    }
    static thread_local std::vector<Keyed> keys;
    keys.resize(v.size());
    for (size_t i = 0; i < v.size(); i++) keys[i] = Keyed{v[i].pc, v[i].thread, (uint32_t)i};
    // (pc, lane, order) first, to number each lane's accesses at each pc ...
    std::sort(keys.begin(), keys.end(), [](const Keyed& x, const Keyed& y) {
        return x.pc != y.pc ? x.pc < y.pc : x.n != y.n ? x.n < y.n : x.index < y.index;
    });
    for (size_t i = 0; i < keys.size(); i++) {
        bool same = i > 0 && keys[i].pc == keys[i - 1].pc && v[keys[i].index].thread == v[keys[i - 1].index].thread;
        keys[i].n = same ? keys[i - 1].n + 1 : 0;
    }
    // ... then (pc, n): the requests.
    std::sort(keys.begin(), keys.end(), [](const Keyed& x, const Keyed& y) {
        return x.pc != y.pc ? x.pc < y.pc : x.n != y.n ? x.n < y.n : x.index < y.index;
    });
    const Access* g[kMaxUnits];
    for (size_t i = 0; i < keys.size();) {
        int m = 0;
        size_t j = i;
        for (; j < keys.size() && keys[j].pc == keys[i].pc && keys[j].n == keys[i].n; j++) {
            if (m < kMaxUnits) g[m++] = &v[keys[j].index];
        }
        count_group(w, g, m);
        i = j;
    }
    v.clear();
}

// The layer's whole-warp operations say themselves which accesses form a request.
void profile_modeled(Worker* w, uintptr_t pc, const Access* a, int n) {
    const Access* g[kMaxUnits];
    for (int r = 0;; r++) {
        int m = 0;
        bool more = false;
        for (int i = 0; i < n; i++) {
            if (a[i].request == r && m < kMaxUnits) g[m++] = &a[i];
            more |= a[i].request > r;
        }
        if (m) count_group(w, g, m);
        if (!more) break;
    }
}

// ---- per kernel, over the program ----------------------------------------------------------------
static std::mutex all_mu;
static std::map<std::string, KernelStats>* all;

// Local memory: the stack bytes some instruction indexes at run time (an array nvcc puts in
// local memory too), and every access to them; an instruction always at one offset outside
// them is a register on a GPU.
static bool is_local(const KernelStats& k, const PcTraffic& p) {
    if (p.space != SPACE_LOCAL || p.first_offset < 0) return false;
    if (p.offsets_vary) return true;
    for (const auto& q : k.pcs) {
        if (q.second.space == SPACE_LOCAL && q.second.offsets_vary && p.first_offset >= q.second.lo &&
            p.first_offset < q.second.hi)
            return true;
    }
    return false;
}

static void count_local(KernelStats* k) {
    for (int kd = 0; kd < NUM_KINDS; kd++) k->traffic[SPACE_LOCAL][kd] = Traffic();
    for (auto& p : k->pcs) {
        if (is_local(*k, p.second)) k->traffic[SPACE_LOCAL][p.second.kind].add(p.second.t);
    }
}

void profile_launch_end(Worker* w) {
    std::lock_guard<std::mutex> g(all_mu);
    if (!all) all = new std::map<std::string, KernelStats>();
    KernelStats& k = (*all)[w->kernel];
    k.add(w->stats);
    count_local(&k);
    w->stats = KernelStats();
    pc_cache_owner = nullptr;
}

static const char* const kSpaceNames[NUM_SPACES] = {"global", "shared", "local"};
static const char* const kKindNames[NUM_KINDS] = {"load", "store", "atomic"};
static const char* const kUnitNames[NUM_SPACES] = {"sectors", "wavefronts", "bytes"};
static const int kWorstLines = 5, kWorstLocal = 2;

static double per(uint64_t a, uint64_t b) { return b ? (double)a / b : 0.0; }

// The instructions of a kernel that lose the most units to conflicts or scatter (global and
// shared), then its local-memory ones with the most bytes.
static std::vector<std::pair<uintptr_t, const PcTraffic*>> worst_lines(const KernelStats& k) {
    std::vector<std::pair<uintptr_t, const PcTraffic*>> lost, local;
    for (const auto& p : k.pcs) {
        const Traffic& t = p.second.t;
        if (is_local(k, p.second)) local.push_back({p.first, &p.second});
        else if (p.second.space != SPACE_LOCAL && t.units > t.ideal) lost.push_back({p.first, &p.second});
    }
    auto by = [](auto measure) {
        return [measure](const std::pair<uintptr_t, const PcTraffic*>& a, const std::pair<uintptr_t, const PcTraffic*>& b) {
            return measure(a.second) != measure(b.second) ? measure(a.second) > measure(b.second) : a.first < b.first;
        };
    };
    std::sort(lost.begin(), lost.end(), by([](const PcTraffic* p) { return p->t.units - p->t.ideal; }));
    std::sort(local.begin(), local.end(), by([](const PcTraffic* p) { return p->t.bytes; }));
    if (lost.size() > (size_t)kWorstLines) lost.resize(kWorstLines);
    if (local.size() > (size_t)kWorstLocal) local.resize(kWorstLocal);
    lost.insert(lost.end(), local.begin(), local.end());
    return lost;
}

static std::string json_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        if ((unsigned char)c >= 0x20) o += c;
    }
    return o;
}

void profile_write(const char* file) {
    std::lock_guard<std::mutex> g(all_mu);
    std::map<std::string, KernelStats> none;
    const std::map<std::string, KernelStats>& ks = all ? *all : none;
    std::vector<uintptr_t> pcs;
    for (const auto& k : ks)
        for (const auto& p : worst_lines(k.second)) pcs.push_back(p.first);
    source_prefetch(pcs);

    FILE* f = fopen(file, "w");
    if (!f) fprintf(stderr, "cuda_cpu: CUDA_CPU_PROFILE=%s: cannot write it\n", file);
    for (const auto& k : ks) {
        const KernelStats& s = k.second;
        if (!f) break;
        fprintf(f, "{\"kernel\": \"%s\", \"launches\": %" PRIu64 ", \"blocks\": %" PRIu64 ", \"threads\": %" PRIu64,
                json_escape(k.first).c_str(), s.launches, s.blocks, s.threads);
        for (int sp = 0; sp < NUM_SPACES; sp++) {
            for (int kd = 0; kd < NUM_KINDS; kd++) {
                const Traffic& t = s.traffic[sp][kd];
                const char *sn = kSpaceNames[sp], *kn = kKindNames[kd];
                fprintf(f, ", \"%s_%s_requests\": %" PRIu64 ", \"%s_%s_bytes\": %" PRIu64, sn, kn, t.requests, sn, kn,
                        t.bytes);
                if (sp != SPACE_LOCAL) {
                    fprintf(f, ", \"%s_%s_%s\": %" PRIu64 ", \"%s_%s_ideal_%s\": %" PRIu64, sn, kn, kUnitNames[sp],
                            t.units, sn, kn, kUnitNames[sp], t.ideal);
                }
            }
        }
        fprintf(f, ", \"wmma_mma\": %" PRIu64 ", \"wmma_flops\": %" PRIu64 ", \"worst\": [", s.wmma_mma,
                s.wmma_mma * 2 * 16 * 16 * 16);
        bool first = true;
        for (const auto& p : worst_lines(s)) {
            const Traffic& t = p.second->t;
            fprintf(f, "%s{\"at\": \"%s\", \"space\": \"%s\", \"kind\": \"%s\", \"requests\": %" PRIu64
                       ", \"units\": %" PRIu64 ", \"ideal\": %" PRIu64 ", \"bytes\": %" PRIu64 "}",
                    first ? "" : ", ", json_escape(source_of(p.first)).c_str(), kSpaceNames[p.second->space],
                    kKindNames[p.second->kind], t.requests, t.units, t.ideal, t.bytes);
            first = false;
        }
        fprintf(f, "]}\n");
    }
    if (f) fclose(f);

    // The table: per kernel, requests and units per request (ideal in brackets).
    fprintf(stderr, "cuda_cpu profile (%s): per kernel, summed over its launches; units per request, ideal in ()\n",
            file);
    fprintf(stderr, "%-44s %8s | %26s | %26s | %26s | %26s | %12s | %9s\n", "kernel", "launches",
            "global load: req sect/req", "global store: req sect/req", "shared load: req wave/req",
            "shared store: req wave/req", "local ld+st B", "WMMA MFLOP");
    auto cell = [](const Traffic& t) {
        char b[64];
        if (!t.requests) snprintf(b, sizeof(b), "%26s", "-");
        else snprintf(b, sizeof(b), "%10" PRIu64 " %6.2f (%5.2f)", t.requests, per(t.units, t.requests),
                      per(t.ideal, t.requests));
        return std::string(b);
    };
    for (const auto& k : ks) {
        const KernelStats& s = k.second;
        std::string name = k.first.size() > 44 ? k.first.substr(0, 41) + "..." : k.first;
        fprintf(stderr, "%-44s %8" PRIu64 " | %s | %s | %s | %s | %12" PRIu64 " | %9.1f\n", name.c_str(), s.launches,
                cell(s.traffic[SPACE_GLOBAL][KIND_LOAD]).c_str(), cell(s.traffic[SPACE_GLOBAL][KIND_STORE]).c_str(),
                cell(s.traffic[SPACE_SHARED][KIND_LOAD]).c_str(), cell(s.traffic[SPACE_SHARED][KIND_STORE]).c_str(),
                s.traffic[SPACE_LOCAL][KIND_LOAD].bytes + s.traffic[SPACE_LOCAL][KIND_STORE].bytes,
                s.wmma_mma * 8192 / 1e6);
    }
    fprintf(stderr, "worst instructions (units lost to bank conflicts or scattered sectors; local memory by bytes):\n");
    for (const auto& k : ks) {
        for (const auto& p : worst_lines(k.second)) {
            const Traffic& t = p.second->t;
            fprintf(stderr, "  %s: %s %s at %s: %" PRIu64 " requests, %.2f %s/request (ideal %.2f), %" PRIu64 " bytes\n",
                    k.first.c_str(), kSpaceNames[p.second->space], kKindNames[p.second->kind],
                    source_of(p.first).c_str(), t.requests, per(p.second->space == SPACE_LOCAL ? t.bytes : t.units,
                    t.requests), kUnitNames[p.second->space], per(t.ideal, t.requests), t.bytes);
        }
    }
}

}  // namespace tools
}  // namespace cudacpu
