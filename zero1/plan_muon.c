/*
 * zero1/plan_muon.c: zero1_plan --optimizer muon. Two buffers (zero1/layout_layerwise.h): the
 * AdamW parameters element-wise as without Muon, Muon's matrices layer-wise, each whole in the
 * shard of the one rank that updates it. Prints them as text, or as one JSON object whose
 * "buffers" holds each buffer in --optimizer adamw's format plus "optimizer". See docs/zero1.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero1/layout_layerwise.h"
#include "zero1/plan.h"

// The non-empty buffers in DDP's order (that of their first parameters; GPT-2: AdamW's, wte
// first). Returns how many.
static int plan_buffers(const PlanOptions* o, const Zero1FullLayout* F, PlanBuffer out[2]) {
    PlanBuffer adamw = {&F->adamw, F->adamw_param, "adamw", 0, o->split_embedding ? 0 : -1};  // wte: AdamW's first
    PlanBuffer muon = {&F->layerwise, F->layerwise_param, "muon", 1, -1};
    int n = 0, muon_first = F->layerwise.num_params > 0 && F->layerwise_param[0] == 0;
    if (muon_first) out[n++] = muon;
    if (F->adamw.num_params > 0) out[n++] = adamw;
    if (!muon_first && F->layerwise.num_params > 0) out[n++] = muon;
    return n;
}

static int print_json(FILE* f, const PlanOptions* o, const PlanBuffer* B, int n, char* err, size_t err_len) {
    fprintf(f, "{\"optimizer\":\"muon\",\"dp\":%d,\"wpe\":", o->dp);
    if (o->model) fprintf(f, "\"%s\"", o->wpe_muon ? "muon" : "adamw");
    else fprintf(f, "null");
    fprintf(f, ",\"buffers\":[");
    for (int k = 0; k < n; k++) {
        if (k) fputc(',', f);
        if (plan_print_buffer_json(f, o, &B[k], err, err_len) != 0) return -1;
    }
    fprintf(f, "]}\n");
    return 0;
}

// ---------------------------------------------------------------------------- text

static size_t buffer_param_numel(const Zero1Layout* L) {
    size_t n = 0;
    for (int p = 0; p < L->num_params; p++) n += L->params[p].end - L->params[p].start;
    return n;
}

static void print_routing(FILE* f, const PlanOptions* o, const Zero1FullLayout* F) {
    plan_print_model(f, o);
    fprintf(f, "optimizer muon: Muon takes %d matrices, %zu elements%s; AdamW the other %d parameters, %zu "
               "elements%s\n", F->layerwise.num_params, buffer_param_numel(&F->layerwise),
            !o->model ? "" : o->wpe_muon ? " (every layer's qkvw attprojw fcw fcprojw, and wpe)"
                                         : " (every layer's qkvw attprojw fcw fcprojw)",
            F->adamw.num_params, buffer_param_numel(&F->adamw),
            !o->model ? "" : o->wpe_muon ? " (wte, biases, LayerNorms)" : " (wte, wpe, biases, LayerNorms)");
    if (o->model && !o->wpe_muon)
        fprintf(f, "note: megatron-core routes wpe (2-D, not tagged an embedding) to Muon; --wpe muon does so\n");
    fprintf(f, "DP=%d  bucket_size=", o->dp);
    const Zero1Layout* L = F->adamw.num_params ? &F->adamw : &F->layerwise;
    if (L->bucket_size == 0) fprintf(f, "none (one bucket per buffer)");
    else fprintf(f, "%zu elements%s", L->bucket_size, o->bucket_size < 0 ? " (default max(40e6, 1e6*DP))" : "");
    fprintf(f, "  pad_busbw=%s\n\n", o->pad_busbw ? "on" : "off");
}

// Each bucket's shards and the matrices in them, in place order.
static void print_layerwise_shards(FILE* f, const PlanOptions* o, const PlanBuffer* B) {
    const Zero1Layout* L = B->layout;
    char name[64];
    for (int b = 0; b < L->num_buckets; b++) {
        const Zero1Bucket* k = &L->buckets[b];
        size_t shard = (k->end - k->start) / (size_t)L->dp;
        fprintf(f, "bucket %d, %d shards of %zu:\n", b, L->dp, shard);
        for (int r = 0; r < L->dp; r++) {
            size_t lo = k->start + (size_t)r * shard, used = 0;
            fprintf(f, "  rank %-3d [%zu, %zu):", r, lo, lo + shard);
            for (size_t at = lo;;) {  // the shard's matrices by start
                int next = -1;
                for (int p = k->first_param; p <= k->last_param; p++) {
                    size_t s = L->params[p].start;
                    if (s >= at && s < lo + shard && (next < 0 || s < L->params[next].start)) next = p;
                }
                if (next < 0) break;
                fprintf(f, " %s", plan_param_name(o, plan_model_index(B, next), name, sizeof(name)));
                used += L->params[next].end - L->params[next].start;
                at = L->params[next].end;
            }
            fprintf(f, "%s  (%zu in matrices, %zu padding)\n", used ? "" : " -", used, shard - used);
        }
    }
    fprintf(f, "\n");
}

// The matrices each rank owns, and what owning them whole costs against an even split.
static void print_owners(FILE* f, const PlanOptions* o, const PlanBuffer* B) {
    const Zero1Layout* L = B->layout;
    int* owned = (int*)calloc((size_t)L->num_params, sizeof(int));
    if (owned == NULL) return;
    char name[64];
    size_t least = (size_t)-1, most = 0, total = buffer_param_numel(L);
    fprintf(f, "matrices each rank owns (gets whole summed gradients of, runs Muon on, all-gathers):\n");
    for (int r = 0; r < L->dp; r++) {
        int n = zero1_layerwise_owned(L, r, owned);
        size_t mine = 0;
        for (int k = 0; k < n; k++) mine += L->params[owned[k]].end - L->params[owned[k]].start;
        fprintf(f, "  rank %-3d %3d matrices %12zu elements:", r, n, mine);
        for (int k = 0; k < n; k++) fprintf(f, " %s", plan_param_name(o, plan_model_index(B, owned[k]), name, sizeof(name)));
        fprintf(f, "\n");
        if (mine < least) least = mine;
        if (mine > most) most = mine;
    }
    double mean = (double)total / L->dp;
    fprintf(f, "imbalance: owned elements per rank %zu to %zu, mean %.0f: the largest holds %.2f%% more Muon state "
               "than an even split (%.0f B more with bf16 params, 8 B/elem)\n\n", least, most, mean,
            mean > 0 ? 100.0 * ((double)most / mean - 1.0) : 0.0, 8.0 * ((double)most - mean));
    free(owned);
}

static void print_ledgers(FILE* f, const PlanOptions* o, const PlanBuffer* B, int n, int param_bytes) {
    const char* gdt = o->grad_bytes == 2 ? "bf16" : "fp32";
    uint64_t replicated = 0, zero1 = 0, sent_replicated = 0, sent_zero1 = 0;
    fprintf(f, "memory and communication, %s params + %s grads (%s):\n", param_bytes == 2 ? "bf16" : "fp32", gdt,
            param_bytes == 2 ? "GPU default" : "CPU fp32; master == params");
    for (int k = 0; k < n; k++) {
        Zero1Ledger g = plan_ledger(o, &B[k], param_bytes);
        fprintf(f, " %s buffer:\n", B[k].layerwise ? "Muon (layer-wise)" : "AdamW (element-wise)");
        zero1_ledger_print(f, &g);
        replicated += g.total_replicated;
        zero1 += g.total_zero1;
        sent_replicated += g.sent_all_reduce;
        sent_zero1 += g.sent_zero1;
    }
    fprintf(f, " both buffers, per rank: memory %llu B replicated, %llu B ZeRO-1 (the rank that owns the most); "
               "sent per step %llu B replicated, %llu B ZeRO-1\n\n", (unsigned long long)replicated,
            (unsigned long long)zero1, (unsigned long long)sent_replicated, (unsigned long long)sent_zero1);
}

static int print_text(FILE* f, const PlanOptions* o, const Zero1FullLayout* F, const PlanBuffer* B, int n,
                      char* err, size_t err_len) {
    print_routing(f, o, F);
    for (int k = 0; k < n; k++) {
        const Zero1Layout* L = B[k].layout;
        if (B[k].layerwise) {
            fprintf(f, "Muon buffer, layer-wise: backprop order in chunks of >= max(bucket_size, 0.9 x DP x largest "
                       "matrix), each packed whole into DP shards (largest first, to the least-loaded shard), "
                       "starts aligned to %d, shards padded to lcm(64, %s/DP)=%zu\n", ZERO1_PARAM_START_ALIGN,
                    L->pad_busbw ? "lcm(DP,128,65536)" : "lcm(DP,128)",
                    zero1_layerwise_shard_divisor(L->dp, L->pad_busbw));
        } else {
            fprintf(f, "AdamW buffer, element-wise: reverse definition order, param starts aligned to %d elements, "
                       "bucket ends padded to %s=%zu%s\n", ZERO1_PARAM_START_ALIGN,
                    L->pad_busbw ? "lcm(DP,128,65536)" : "lcm(DP,128)", zero1_bucket_divisor(L->dp, L->pad_busbw),
                    L->shared_embedding >= 0 ? ", the shared embedding in a bucket of its own" : "");
        }
        plan_print_bucket_table(f, o, &B[k]);
        if (B[k].layerwise) {
            print_layerwise_shards(f, o, &B[k]);
            print_owners(f, o, &B[k]);
        }
        if (o->model) plan_print_timing(f, o, &B[k]);
    }
    print_ledgers(f, o, B, n, 2);
    print_ledgers(f, o, B, n, 4);
    fprintf(f, "ledger (below) per buffer; Muon's state (one fp32 momentum per element, and the "
               "fp32 master with bf16 params) lives on the matrices a rank owns, not on numel/DP.\n");
    plan_print_ledger_legend(f, o);
    for (int k = 0; k < n && o->shards; k++) {
        fprintf(f, "\n%s buffer", B[k].layerwise ? "Muon (layer-wise)" : "AdamW (element-wise)");
        if (plan_print_shards(f, o, &B[k], err, err_len) != 0) return -1;
    }
    return 0;
}

int plan_muon_run(const PlanOptions* o, int json) {
    char err[512] = {0};
    Zero1FullLayout F;
    long long bucket_size = zero1_ddp_bucket_size(o->bucket_size, o->dp, o->overlap_grad_reduce);
    if (zero1_full_layout_build(&F, o->numels, o->is_muon, o->num_params, o->dp, bucket_size, o->pad_busbw,
                                o->shared_embedding, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    PlanBuffer B[2];
    int n = plan_buffers(o, &F, B);
    int rc = json ? print_json(stdout, o, B, n, err, sizeof(err)) : print_text(stdout, o, &F, B, n, err, sizeof(err));
    zero1_full_layout_free(&F);
    if (rc != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    return 0;
}
