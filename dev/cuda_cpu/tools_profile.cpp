/*
 * dev/cuda_cpu/tools_profile.cpp: the profiler (CUDA_CPU_PROFILE=FILE), from the accesses
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

#include "dev/cuda_cpu/internal.h"
#include "dev/cuda_cpu/tools.h"

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
        mine.t.add(p.second.t);
    }
}

// ---- one request ---------------------------------------------------------------------------------
static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Distinct bytes covered by the accesses.
static uint64_t distinct_bytes(const Access* a, int n) {
    std::vector<std::pair<uintptr_t, uintptr_t>> iv(n);
    for (int i = 0; i < n; i++) iv[i] = {a[i].addr, a[i].addr + a[i].size};
    std::sort(iv.begin(), iv.end());
    uint64_t total = 0;
    uintptr_t lo = iv[0].first, hi = iv[0].second;
    for (int i = 1; i < n; i++) {
        if (iv[i].first > hi) {
            total += hi - lo;
            lo = iv[i].first;
        }
        hi = std::max(hi, iv[i].second);
    }
    return total + (hi - lo);
}

static Traffic global_request(const Access* a, int n) {
    std::vector<uintptr_t> sectors;
    Traffic t;
    for (int i = 0; i < n; i++) {
        for (uintptr_t s = a[i].addr >> 5; s <= (a[i].addr + a[i].size - 1) >> 5; s++) sectors.push_back(s);
        t.bytes += a[i].size;
    }
    std::sort(sectors.begin(), sectors.end());
    t.requests = 1;
    t.units = std::unique(sectors.begin(), sectors.end()) - sectors.begin();
    t.ideal = ceil_div(distinct_bytes(a, n), 32);
    return t;
}

static Traffic shared_request(const Access* a, int n) {
    unsigned widest = 0;
    for (int i = 0; i < n; i++) widest = std::max<unsigned>(widest, a[i].size);
    int lanes_per_phase = widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
    std::vector<std::pair<int, uintptr_t>> words;  // (phase, word)
    Traffic t;
    for (int i = 0; i < n; i++) {
        int phase = (a[i].thread & 31) / lanes_per_phase;
        for (uintptr_t wd = a[i].addr >> 2; wd <= (a[i].addr + a[i].size - 1) >> 2; wd++) words.push_back({phase, wd});
        t.bytes += a[i].size;
    }
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    uint64_t wavefronts = 0;
    for (size_t i = 0; i < words.size();) {
        int phase = words[i].first, per_bank[32] = {0}, most = 0;
        for (; i < words.size() && words[i].first == phase; i++) most = std::max(most, ++per_bank[words[i].second & 31]);
        wavefronts += most;
    }
    std::vector<uintptr_t> distinct;
    for (const auto& p : words) distinct.push_back(p.second);
    std::sort(distinct.begin(), distinct.end());
    uint64_t nd = std::unique(distinct.begin(), distinct.end()) - distinct.begin();
    t.requests = 1;
    t.units = wavefronts;
    t.ideal = std::max<uint64_t>(1, ceil_div(nd, 32));
    return t;
}

static void count_request(Worker* w, const Access* a, int n) {
    Traffic t;
    int space = a[0].space, kind = a[0].kind;
    if (space == SPACE_GLOBAL) {
        t = global_request(a, n);
    } else if (space == SPACE_SHARED) {
        t = shared_request(a, n);
    } else {
        t.requests = 1;
        for (int i = 0; i < n; i++) t.bytes += a[i].size;
    }
    w->stats.traffic[space][kind].add(t);
    PcTraffic& p = w->stats.pcs[a[0].pc];
    p.space = (uint8_t)space;
    p.kind = (uint8_t)kind;
    p.t.add(t);
}

// ---- grouping a warp's accesses into requests -------------------------------------------------------
struct Keyed {
    uintptr_t pc;
    uint32_t n;     // the lane's n-th access at pc since the lanes last met
    uint8_t space;  // one instruction may reach several spaces (a generic pointer)
    uint32_t index;
};

void profile_flush(Worker* w, int warp) {
    std::vector<Access>& v = w->pending[warp];
    if (v.empty()) return;
    std::vector<Keyed> keys(v.size());
    for (size_t i = 0; i < v.size(); i++) keys[i] = Keyed{v[i].pc, 0, v[i].space, (uint32_t)i};
    // n: order the accesses by (pc, lane), keeping each lane's own order, and count.
    std::stable_sort(keys.begin(), keys.end(), [&](const Keyed& x, const Keyed& y) {
        return x.pc != y.pc ? x.pc < y.pc : v[x.index].thread < v[y.index].thread;
    });
    for (size_t i = 0; i < keys.size(); i++) {
        bool same = i > 0 && keys[i].pc == keys[i - 1].pc && v[keys[i].index].thread == v[keys[i - 1].index].thread;
        keys[i].n = same ? keys[i - 1].n + 1 : 0;
    }
    std::sort(keys.begin(), keys.end(), [](const Keyed& x, const Keyed& y) {
        if (x.pc != y.pc) return x.pc < y.pc;
        if (x.n != y.n) return x.n < y.n;
        return x.space < y.space;
    });
    std::vector<Access> group;
    for (size_t i = 0; i < keys.size();) {
        group.clear();
        size_t j = i;
        for (; j < keys.size() && keys[j].pc == keys[i].pc && keys[j].n == keys[i].n && keys[j].space == keys[i].space;
             j++)
            group.push_back(v[keys[j].index]);
        count_request(w, group.data(), (int)group.size());
        i = j;
    }
    v.clear();
}

// The layer's whole-warp operations say themselves which accesses form a request.
void profile_modeled(Worker* w, uintptr_t pc, const Access* a, int n) {
    std::vector<Access> sorted(a, a + n);
    std::stable_sort(sorted.begin(), sorted.end(), [](const Access& x, const Access& y) {
        return x.request != y.request ? x.request < y.request : x.space < y.space;
    });
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && sorted[j].request == sorted[i].request && sorted[j].space == sorted[i].space) j++;
        count_request(w, sorted.data() + i, j - i);
        i = j;
    }
}

// ---- per kernel, over the program ----------------------------------------------------------------
static std::mutex all_mu;
static std::map<std::string, KernelStats>* all;

void profile_launch_end(Worker* w) {
    std::lock_guard<std::mutex> g(all_mu);
    if (!all) all = new std::map<std::string, KernelStats>();
    (*all)[w->kernel].add(w->stats);
    w->stats = KernelStats();
}

static const char* const kSpaceNames[NUM_SPACES] = {"global", "shared", "local"};
static const char* const kKindNames[NUM_KINDS] = {"load", "store", "atomic"};
static const char* const kUnitNames[NUM_SPACES] = {"sectors", "wavefronts", "bytes"};
static const int kWorstLines = 4;

static double per(uint64_t a, uint64_t b) { return b ? (double)a / b : 0.0; }

// The instructions of a kernel that lose the most units to conflicts or scatter (global and
// shared), then its local-memory ones by bytes.
static std::vector<std::pair<uintptr_t, const PcTraffic*>> worst_lines(const KernelStats& k) {
    std::vector<std::pair<uintptr_t, const PcTraffic*>> v;
    for (const auto& p : k.pcs) {
        const Traffic& t = p.second.t;
        if (p.second.space == SPACE_LOCAL || t.units > t.ideal) v.push_back({p.first, &p.second});
    }
    auto excess = [](const PcTraffic* p) {
        return p->space == SPACE_LOCAL ? p->t.bytes / 64 : p->t.units - p->t.ideal;
    };
    std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) {
        return excess(a.second) != excess(b.second) ? excess(a.second) > excess(b.second) : a.first < b.first;
    });
    if (v.size() > (size_t)kWorstLines) v.resize(kWorstLines);
    return v;
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
