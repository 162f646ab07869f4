/*
 * zero1/ledger.h: per-rank memory and per-step communication of one layout, for the
 * planner, the trainers' start-up printout and their memory check (zero1/gpt2.h's
 * zero1_gpt2_memory_buffers) (header only, static inline).
 *
 * Definitions (numel = padded buffer size, owned = numel / DP, exact because every
 * bucket is divisible by DP):
 *   replicated per rank = param buffer (param_bytes * numel) + grad buffer (grad_bytes * numel)
 *                         + optimizer state (state_bytes * numel)
 *   ZeRO-1 per rank     = same param and grad buffers + state_bytes * owned
 *   state_bytes = 12 (fp32 master + m + v) for bf16 params; 8 (m + v) for fp32 params,
 *   where the param buffer itself is the master copy. Muon's layer-wise buffer: 8 or 4 (one
 *   momentum), on the whole matrices a rank owns instead of owned (zero1_ledger_set_muon_state).
 * Bytes each rank sends per optimizer step, ring algorithms:
 *   all-reduce of grads (replicated)        2 * (DP-1)/DP * numel * grad_bytes
 *   ZeRO-1 reduce-scatter of grads            (DP-1)/DP * numel * grad_bytes
 *        + all-gather of params               (DP-1)/DP * numel * param_bytes
 * (ZeRO-1's buffers are not smaller than the replicated ones: it saves optimizer state only.)
 *
 * Distributed-optimizer instances (K groups of DP ranks, W = K * DP ranks in all): DP is
 * the group's size, so owned = numel / DP and the reduce-scatter and all-gather above run
 * inside the group; each rank then all-reduces its owned shard with the K ranks at its
 * position in the other groups: 2 * (K-1)/K * owned * grad_bytes (rounded down to a
 * byte). The replicated column is the same job without sharding: an all-reduce over all W
 * ranks, 2 * (W-1)/W * numel * grad_bytes.
 *
 * fp32 accumulation (--fp32-accumulation): the reduce-scatter is an all-to-all of the same
 * bf16 bucket, which sends each peer its slice: (DP-1)/DP * numel * 2 bytes, the ring
 * reduce-scatter's count; the shard crosses instances in fp32 (grad_bytes 4 for that row).
 * Its receive temporaries, 2 x the largest bucket x 2 B, are added to ZeRO-1's memory
 * (zero1_ledger_add_recv_temporaries).
 *
 * DP-invariant mode (--dp-invariant, k micro-steps a step): the reduce-scatter is an
 * all-to-all of the fp32 bucket ((DP-1)/DP * numel * 4 bytes, the fp32 reduce-scatter's
 * count); ZeRO-1's memory gains log2(k) partial sums of the fp32 grad buffer and, with more
 * than one rank, two fp32 receive temporaries of the largest bucket
 * (zero1_ledger_add_dp_invariant).
 *
 * Split embedding (--split-embedding, P = tokens per micro-step per rank, C = the row
 * width): wte's bucket is reduced as before, only earlier; the last micro-step's encoder
 * rows add, per rank, the compact rows (P x C fp32) and the received rows
 * (zero1_split_recv_rows x C fp32) to ZeRO-1's memory, and at most (P + DP - 1) x C x 4
 * bytes sent (the rows of distinct tokens, each to the owner of its elements, a row that
 * straddles two owners' slots to both), after the embeddings' backward
 * (zero1_ledger_add_split). Averaging in the collective changes no byte count.
 */
#ifndef ZERO1_LEDGER_H
#define ZERO1_LEDGER_H

#include <stdint.h>
#include <stdio.h>

#include "zero1/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int dp;                                    // ranks that shard the state (a group's, with instances)
    int instances;                             // groups; dp * instances ranks in all
    uint64_t numel, owned_numel;
    int param_bytes, grad_bytes, state_bytes;  // per element
    uint64_t param_buffer, grad_buffer;        // bytes, same for both modes
    uint64_t state_replicated, state_zero1;
    uint64_t total_replicated, total_zero1;
    uint64_t sent_all_reduce;                  // replicated: bytes sent per rank per step
    uint64_t sent_reduce_scatter, sent_all_gather;  // ZeRO-1, inside the group
    uint64_t sent_cross_all_reduce;            // ZeRO-1, the owned shard across instances (0 for one)
    uint64_t sent_zero1;                       // all of ZeRO-1's
    uint64_t recv_temporaries;                 // fp32 accumulation, DP-invariant: receive temporaries (bytes), else 0
    int dp_invariant;                          // 1: the DP-invariant mode's rows (recv_temporaries in fp32)
    int partial_levels;                        // DP-invariant: log2(micro-steps)
    uint64_t partial_grads;                    // DP-invariant: its partial sums of the grad buffer (bytes)
    uint64_t split_rows;                       // split embedding: compact + received rows (bytes), else 0
    uint64_t split_sent_max;                   // split embedding: bytes sent sparsely, at most
    int muon_state;                            // 1: Muon's state (zero1_ledger_set_muon_state)
    uint64_t state_owned_numel;                // ZeRO-1's state elements per rank (owned_numel, or Muon's most)

    int overflow;                              // 1 if a byte count exceeded 64 bits (values invalid)
} Zero1Ledger;

static inline uint64_t zero1_ledger_mul_(uint64_t a, uint64_t b, int* overflow) {
    if (a != 0 && b > UINT64_MAX / a) {
        *overflow = 1;
        return 0;
    }
    return a * b;
}

static inline uint64_t zero1_ledger_add_(uint64_t a, uint64_t b, int* overflow) {
    if (b > UINT64_MAX - a) {
        *overflow = 1;
        return 0;
    }
    return a + b;
}

// 2 * (n-1)/n * bytes, rounded down: what each of n ranks sends in a ring all-reduce.
static inline uint64_t zero1_ledger_ring_all_reduce_(uint64_t elements, int bytes, int n, int* overflow) {
    uint64_t b = zero1_ledger_mul_(elements, (uint64_t)bytes, overflow);
    return zero1_ledger_mul_(b, 2 * (uint64_t)(n - 1), overflow) / (uint64_t)n;
}

// param_bytes: 2 (bf16) or 4 (fp32, then master == params); grad_bytes: 4 (fp32) or 2.
// dp: the ranks that shard the state, instances: how many such groups (1: plain ZeRO-1).
// numel must be divisible by dp (true for any Zero1Layout).
static inline Zero1Ledger zero1_ledger_compute_instances(uint64_t numel, int dp, int instances, int param_bytes,
                                                         int grad_bytes) {
    Zero1Ledger g;
    int of = 0;
    if (dp < 1) dp = 1;
    if (instances < 1) instances = 1;
    g.dp = dp;
    g.instances = instances;
    g.numel = numel;
    g.owned_numel = numel / (uint64_t)dp;
    g.param_bytes = param_bytes;
    g.grad_bytes = grad_bytes;
    g.state_bytes = param_bytes >= 4 ? 8 : 12;
    g.param_buffer = zero1_ledger_mul_(numel, (uint64_t)param_bytes, &of);
    g.grad_buffer = zero1_ledger_mul_(numel, (uint64_t)grad_bytes, &of);
    g.state_replicated = zero1_ledger_mul_(numel, (uint64_t)g.state_bytes, &of);
    g.state_zero1 = zero1_ledger_mul_(g.owned_numel, (uint64_t)g.state_bytes, &of);
    uint64_t buffers = zero1_ledger_add_(g.param_buffer, g.grad_buffer, &of);
    g.total_replicated = zero1_ledger_add_(buffers, g.state_replicated, &of);
    g.total_zero1 = zero1_ledger_add_(buffers, g.state_zero1, &of);
    // (DP-1)/DP * numel = (DP-1) * owned exactly; a ring step sends one chunk per hop.
    uint64_t others = zero1_ledger_mul_((uint64_t)(dp - 1), g.owned_numel, &of);
    g.sent_reduce_scatter = zero1_ledger_mul_(others, (uint64_t)grad_bytes, &of);
    g.sent_all_reduce = instances == 1 ? zero1_ledger_mul_(g.sent_reduce_scatter, 2, &of)
                                       : zero1_ledger_ring_all_reduce_(numel, grad_bytes, dp * instances, &of);
    g.sent_all_gather = zero1_ledger_mul_(others, (uint64_t)param_bytes, &of);
    g.sent_cross_all_reduce = zero1_ledger_ring_all_reduce_(g.owned_numel, grad_bytes, instances, &of);
    g.sent_zero1 = zero1_ledger_add_(zero1_ledger_add_(g.sent_reduce_scatter, g.sent_all_gather, &of),
                                     g.sent_cross_all_reduce, &of);
    g.recv_temporaries = g.split_rows = g.split_sent_max = g.partial_grads = 0;
    g.dp_invariant = g.partial_levels = 0;
    g.muon_state = 0;
    g.state_owned_numel = g.owned_numel;
    g.overflow = of;
    return g;
}

// fp32 accumulation: the two all-to-all receive temporaries (2 x largest bucket x 2 B) join
// ZeRO-1's memory, and the shard's all-reduce across instances runs in fp32.
static inline void zero1_ledger_add_recv_temporaries(Zero1Ledger* g, uint64_t largest_bucket) {
    int of = g->overflow;
    g->recv_temporaries = zero1_ledger_mul_(largest_bucket, 4, &of);
    g->total_zero1 = zero1_ledger_add_(g->total_zero1, g->recv_temporaries, &of);
    uint64_t cross = zero1_ledger_ring_all_reduce_(g->owned_numel, 4, g->instances, &of);
    g->sent_zero1 = zero1_ledger_add_(g->sent_zero1 - g->sent_cross_all_reduce, cross, &of);
    g->sent_cross_all_reduce = cross;
    g->overflow = of;
}

// --dp-invariant with micro_steps (a power of two) a step: log2(micro_steps) fp32 partial
// sums of the grad buffer, and two fp32 receive temporaries of largest_bucket elements (0
// where one rank exchanges nothing) join ZeRO-1's memory.
static inline void zero1_ledger_add_dp_invariant(Zero1Ledger* g, int micro_steps, uint64_t largest_bucket) {
    int of = g->overflow;
    g->dp_invariant = 1;
    g->partial_levels = 0;
    while ((1 << g->partial_levels) < micro_steps) g->partial_levels++;
    g->partial_grads = zero1_ledger_mul_(zero1_ledger_mul_(g->numel, 4, &of), (uint64_t)g->partial_levels, &of);
    g->recv_temporaries = zero1_ledger_mul_(largest_bucket, 8, &of);
    g->total_zero1 = zero1_ledger_add_(zero1_ledger_add_(g->total_zero1, g->partial_grads, &of), g->recv_temporaries,
                                       &of);
    g->overflow = of;
}

// The split embedding's received rows per rank: from each of dp sources, at most the rows
// of its distinct tokens that meet this rank's slot of wte's bucket (slot_numel / width + 2
// rows meet a slot; a source has at most `tokens` distinct ones). zero1/split_embedding.c
// sizes its receive buffer with it.
static inline uint64_t zero1_split_recv_rows(int dp, uint64_t slot_numel, uint64_t width, uint64_t tokens) {
    uint64_t slot_rows = slot_numel / width + 2;
    return (uint64_t)dp * (slot_rows < tokens ? slot_rows : tokens);
}

// --split-embedding with `tokens` per micro-step per rank, rows of `width`, and wte's
// bucket of bucket_numel elements (its slot: bucket_numel / dp).
static inline void zero1_ledger_add_split(Zero1Ledger* g, uint64_t tokens, uint64_t width, uint64_t bucket_numel) {
    int of = g->overflow;
    uint64_t rows = zero1_ledger_add_(tokens, zero1_split_recv_rows(g->dp, bucket_numel / (uint64_t)g->dp, width,
                                                                    tokens), &of);
    g->split_rows = zero1_ledger_mul_(zero1_ledger_mul_(rows, width, &of), 4, &of);
    g->total_zero1 = zero1_ledger_add_(g->total_zero1, g->split_rows, &of);
    g->split_sent_max = zero1_ledger_mul_(zero1_ledger_mul_(tokens + (uint64_t)g->dp - 1, width, &of), 4, &of);
    g->overflow = of;
}

// The ledger of a built layout (instances groups of layout->dp ranks) with what the options
// add: fp32 accumulation's receive temporaries (sharded over more than one rank: the
// largest bucket), the split embedding's rows (split_param: the embedding's index, -1 none;
// `tokens` per micro-step per rank, rows of `width`), the DP-invariant mode's buffers
// (dp_invariant_micro_steps: its micro-steps a step; 0: off).
static inline Zero1Ledger zero1_ledger_of_layout(const Zero1Layout* L, int instances, int param_bytes, int grad_bytes,
                                                 int fp32_accumulation, int split_param, uint64_t tokens,
                                                 uint64_t width, int dp_invariant_micro_steps) {
    Zero1Ledger g = zero1_ledger_compute_instances(L->numel, L->dp, instances, param_bytes, grad_bytes);
    if (fp32_accumulation && L->dp > 1) zero1_ledger_add_recv_temporaries(&g, zero1_layout_largest_bucket(L));
    if (dp_invariant_micro_steps > 0) {
        zero1_ledger_add_dp_invariant(&g, dp_invariant_micro_steps, L->dp > 1 ? zero1_layout_largest_bucket(L) : 0);
    }
    if (split_param >= 0) {
        const Zero1Bucket* bucket = &L->buckets[L->params[split_param].bucket];
        zero1_ledger_add_split(&g, tokens, width, bucket->end - bucket->start);
    }
    return g;
}

// Muon's optimizer state in the layer-wise buffer (zero1/layout_layerwise.h): per element one
// fp32 momentum, and the fp32 master where params are bf16 (4 or 8 B), held under ZeRO-1 for
// the whole matrices a rank owns; most_owned: the elements of the rank that owns the most.
static inline void zero1_ledger_set_muon_state(Zero1Ledger* g, uint64_t most_owned) {
    int of = g->overflow;
    g->muon_state = 1;
    g->state_owned_numel = most_owned;
    g->total_replicated -= g->state_replicated;
    g->total_zero1 -= g->state_zero1;
    g->state_bytes = g->param_bytes >= 4 ? 4 : 8;
    g->state_replicated = zero1_ledger_mul_(g->numel, (uint64_t)g->state_bytes, &of);
    g->state_zero1 = zero1_ledger_mul_(most_owned, (uint64_t)g->state_bytes, &of);
    g->total_replicated = zero1_ledger_add_(g->total_replicated, g->state_replicated, &of);
    g->total_zero1 = zero1_ledger_add_(g->total_zero1, g->state_zero1, &of);
    g->overflow = of;
}

static inline Zero1Ledger zero1_ledger_compute(uint64_t numel, int dp, int param_bytes, int grad_bytes) {
    return zero1_ledger_compute_instances(numel, dp, 1, param_bytes, grad_bytes);
}

// Human-readable size: "237.42 MiB".
static inline const char* zero1_ledger_human_(uint64_t bytes, char* buf, size_t n) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, n, "%llu B", (unsigned long long)bytes);
    else snprintf(buf, n, "%.2f %s", v, units[u]);
    return buf;
}

static inline void zero1_ledger_row_(FILE* f, const char* what, uint64_t a, uint64_t b) {
    char ha[32], hb[32];
    fprintf(f, "  %-34s %16llu %12s %16llu %12s\n", what, (unsigned long long)a, zero1_ledger_human_(a, ha, sizeof(ha)),
            (unsigned long long)b, zero1_ledger_human_(b, hb, sizeof(hb)));
}

// Prints the ledger as a two-column table (replicated vs ZeRO-1), bytes per rank.
static inline void zero1_ledger_print(FILE* f, const Zero1Ledger* g) {
    const char* pdt = g->param_bytes == 2 ? "bf16" : g->param_bytes == 4 ? "fp32" : "?";
    const char* gdt = g->grad_bytes == 4 ? "fp32" : g->grad_bytes == 2 ? "bf16" : "?";
    if (g->overflow) {
        fprintf(f, "  (byte counts exceed 64 bits for numel %llu; ledger not shown)\n", (unsigned long long)g->numel);
        return;
    }
    if (g->muon_state) {
        fprintf(f, "  per rank, DP=%d, numel=%llu (padded); Muon's state on the whole matrices a rank owns: at most "
                   "%llu elements (shard numel/DP = %llu)\n", g->dp, (unsigned long long)g->numel,
                (unsigned long long)g->state_owned_numel, (unsigned long long)g->owned_numel);
    } else if (g->instances == 1) {
        fprintf(f, "  per rank, DP=%d, numel=%llu (padded), owned by each rank under ZeRO-1: %llu = numel/DP\n", g->dp,
                (unsigned long long)g->numel, (unsigned long long)g->owned_numel);
    } else {
        fprintf(f,
                "  per rank, DP=%d as %d instances of %d ranks, numel=%llu (padded), owned by each rank under ZeRO-1: "
                "%llu = numel/%d\n",
                g->dp * g->instances, g->instances, g->dp, (unsigned long long)g->numel,
                (unsigned long long)g->owned_numel, g->dp);
    }
    fprintf(f, "  %-34s %29s %29s\n", "", "replicated (bytes)", "ZeRO-1 (bytes)");
    char label[64];
    snprintf(label, sizeof(label), "param buffer (%s, %d B/elem)", pdt, g->param_bytes);
    zero1_ledger_row_(f, label, g->param_buffer, g->param_buffer);
    snprintf(label, sizeof(label), "grad buffer (%s, %d B/elem)", gdt, g->grad_bytes);
    zero1_ledger_row_(f, label, g->grad_buffer, g->grad_buffer);
    const char* state = g->muon_state ? (g->state_bytes == 8 ? "fp32 master+momentum" : "fp32 momentum")
                                      : (g->state_bytes == 12 ? "fp32 master+m+v" : "fp32 m+v");
    snprintf(label, sizeof(label), "%s (%d B/elem)", state, g->state_bytes);
    zero1_ledger_row_(f, label, g->state_replicated, g->state_zero1);
    if (g->partial_grads) {
        snprintf(label, sizeof(label), "dp-inv. partial grads (log2 k = %d)", g->partial_levels);
        zero1_ledger_row_(f, label, 0, g->partial_grads);
    }
    if (g->recv_temporaries) {
        zero1_ledger_row_(f, g->dp_invariant ? "dp-inv. recv temporaries (2 fp32)" : "fp32-acc. recv temporaries (2 slots)",
                          0, g->recv_temporaries);
    }
    if (g->split_rows) zero1_ledger_row_(f, "split-emb. rows (compact + received)", 0, g->split_rows);
    zero1_ledger_row_(f, "total", g->total_replicated, g->total_zero1);
    fprintf(f, "  sent per rank per step (ring):\n");
    snprintf(label, sizeof(label), "grads (%s)", gdt);
    fprintf(f, "  %-34s %16llu %12s %16llu %12s\n", label, (unsigned long long)g->sent_all_reduce, "all-reduce",
            (unsigned long long)g->sent_reduce_scatter, g->recv_temporaries ? "all-to-all" : "reduce-scat.");
    snprintf(label, sizeof(label), "params (%s)", pdt);
    fprintf(f, "  %-34s %16llu %12s %16llu %12s\n", label, 0ULL, "-", (unsigned long long)g->sent_all_gather,
            "all-gather");
    if (g->instances > 1) {
        snprintf(label, sizeof(label), "grad shard (%s) across instances", g->recv_temporaries ? "fp32" : gdt);
        fprintf(f, "  %-34s %16llu %12s %16llu %12s\n", label, 0ULL, "-",
                (unsigned long long)g->sent_cross_all_reduce, "all-reduce");
    }
    if (g->split_sent_max) {  // an upper bound: the rows of the step's distinct tokens
        fprintf(f, "  %-34s %16llu %12s %16llu %12s\n", "wte encoder rows (fp32), at most", 0ULL, "-",
                (unsigned long long)g->split_sent_max, "all-to-all-v");
    }
    zero1_ledger_row_(f, "total sent", g->sent_all_reduce, g->sent_zero1);
    if (g->instances > 1) {
        char h[32];
        snprintf(label, sizeof(label), "  inside a group of %d", g->dp);
        uint64_t inside = g->sent_zero1 - g->sent_cross_all_reduce;
        fprintf(f, "  %-34s %29s %16llu %12s\n", label, "", (unsigned long long)inside,
                zero1_ledger_human_(inside, h, sizeof(h)));
        snprintf(label, sizeof(label), "  across %d instances", g->instances);
        fprintf(f, "  %-34s %29s %16llu %12s\n", label, "", (unsigned long long)g->sent_cross_all_reduce,
                zero1_ledger_human_(g->sent_cross_all_reduce, h, sizeof(h)));
    }
}

#ifdef __cplusplus
}
#endif
#endif
