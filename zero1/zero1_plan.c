/*
 * zero1_plan: prints the ZeRO-1 buffer layout of a model (bucket table, padding,
 * per-rank memory ledger, bytes sent per step) and, with --json, the whole layout and
 * every rank's four views as one JSON object. See docs/zero1.md, "zero1_plan".
 *
 * Exit codes: 0 ok, 2 bad arguments (usage on stderr), 1 out of memory.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/gpt2_spec.h"
#include "zero1/bucket_timing.h"
#include "zero1/layout.h"
#include "zero1/layout_layerwise.h"
#include "zero1/ledger.h"
#include "zero1/plan.h"
#include "zero1/shards.h"

static const char* USAGE =
    "usage: zero1_plan (--numels a,b,c | --model dN [--vocab V] [--max-seq T] [--heads H])\n"
    "                  [--dp N] [--instances K] [--bucket-size N|none] [--no-overlap-grad-reduce] [--pad-busbw]\n"
    "                  [--shared-embedding I|none]\n"
    "                  [--grad-dtype fp32|bf16] [--fp32-accumulation] [--average-in-collective]\n"
    "                  [--split-embedding [--tokens P]] [--dp-invariant [--accumulation K]] [--json] [--shards]\n"
    "                  [--optimizer adamw|muon [--wpe adamw|muon] [--matrices i,j,...]]\n"
    "       zero1_plan --batch FILE   (one argument list per line; prints one JSON per line)\n"
    "  --numels a,b,c       parameter sizes in definition order (each >= 1)\n"
    "  --model dN           GPT-2 of depth N in canonical order (wte, wpe, layers, lnf);\n"
    "                       --vocab V (default 50257, padded to a multiple of 128),\n"
    "                       --max-seq T (default 1024), --heads H (default C/64)\n"
    "  --dp N               data-parallel size (default 1)\n"
    "  --instances K        distributed-optimizer instances: K groups of N/K ranks, each sharding\n"
    "                       the state (the layout's DP is N/K), shards all-reduced across groups\n"
    "  --bucket-size N|none bucket size in elements (default max(40000000, 1000000*DP), DP all the\n"
    "                       ranks, instances included, as Megatron's DDP); none = one bucket\n"
    "  --no-overlap-grad-reduce  the trainers' flag: one bucket, as Megatron without overlap\n"
    "  --pad-busbw          pad buckets to lcm(DP,128,65536) instead of lcm(DP,128)\n"
    "  --shared-embedding I give parameter I a bucket of its own (default none; Megatron\n"
    "                       does this only for a tied embedding split across pipeline stages)\n"
    "  --grad-dtype T       dtype of the gradient reduction (default fp32)\n"
    "  --fp32-accumulation  (--grad-dtype bf16) bf16 on the wire, fp32 sums: each bucket an\n"
    "                       all-to-all into one of two receive temporaries\n"
    "  --average-in-collective  the reductions average (ncclAvg) instead of a 1/DP pre-scale\n"
    "  --split-embedding    (--model) wte in a bucket of its own, reduced as soon as the\n"
    "                       classifier's backward is done; its encoder rows exchanged sparsely,\n"
    "                       --tokens P per micro-step per rank (default 16384 = 16 x 1024)\n"
    "  --dp-invariant       (power-of-two DP) fp32 all-to-all summed pairwise, log2(K) partial\n"
    "                       grad buffers for --accumulation K micro-steps (a power of two, default 1)\n"
    "  --json               print one JSON object instead of tables\n"
    "  --shards             include every (rank, bucket) shard and its four views\n"
    "  --optimizer O        adamw (default): one element-wise buffer; muon: Muon's matrices in a\n"
    "                       layer-wise buffer (each whole in one rank's shard), the rest in an\n"
    "                       element-wise AdamW buffer, as Megatron's LayerWiseDistributedOptimizer\n"
    "  --wpe W              (muon, --model) wpe's optimizer: adamw (default) or muon (Megatron's)\n"
    "  --matrices i,j,...   (muon, --numels) the indices of the Muon matrices, or none\n";

static int plan_error(char* err, size_t n, const char* fmt, const char* a, const char* b) {
    snprintf(err, n, fmt, a, b);
    return -1;
}

// Strict unsigned decimal: digits only, no sign, no overflow.
static int parse_u64(const char* s, unsigned long long* out) {
    if (s == NULL || *s < '0' || *s > '9') return 0;
    errno = 0;
    char* end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') return 0;
    *out = v;
    return 1;
}

static int parse_int_range(const char* s, int lo, int hi, int* out) {
    unsigned long long v;
    if (!parse_u64(s, &v) || v < (unsigned long long)lo || v > (unsigned long long)hi) return 0;
    *out = (int)v;
    return 1;
}

// Parses a comma-separated list of integers >= min_value into a new array. Returns 0 or -1.
static int parse_list(const char* flag, const char* s, unsigned long long min_value, size_t** out, int* count,
                      char* err, size_t n) {
    int k = 1;
    for (const char* p = s; *p; p++) k += (*p == ',');
    free(*out);
    *out = (size_t*)calloc((size_t)k, sizeof(size_t));
    char* copy = strdup(s);
    if (*out == NULL || copy == NULL) {
        free(copy);
        return plan_error(err, n, "out of memory%s%s", "", "");
    }
    int ok = 1;
    char* cursor = copy;
    for (k = 0;;) {
        char* comma = strchr(cursor, ',');
        if (comma) *comma = '\0';
        unsigned long long v;
        if (!parse_u64(cursor, &v) || v < min_value || v > (unsigned long long)SIZE_MAX) { ok = 0; break; }
        (*out)[k++] = (size_t)v;
        if (!comma) break;
        cursor = comma + 1;
    }
    free(copy);
    *count = k;
    if (!ok) return plan_error(err, n, min_value ? "%s wants positive integers separated by commas, got '%s'"
                                                 : "%s wants integers >= 0 separated by commas, got '%s'", flag, s);
    return 0;
}

// The value after the last `flag` in argv, or "1" (the default of --dp and --instances).
static const char* argv_value(int argc, char** argv, const char* flag) {
    const char* v = "1";
    for (int i = 0; i + 1 < argc; i++) {
        if (strcmp(argv[i], flag) == 0) v = argv[i + 1];
    }
    return v;
}

// What --optimizer muon refuses, and the flags that only it takes. Returns 0 or -1.
static int muon_options(PlanOptions* o, int numels, const char* matrices, const char* wpe, char* err, size_t n) {
    if (!o->muon && (matrices || wpe))
        return plan_error(err, n, "%s is for --optimizer muon%s", matrices ? "--matrices" : "--wpe", "");
    if (!o->muon) return 0;
    if (o->instances > 1)  // layer_wise_optimizer.py:456-467
        return plan_error(err, n, "--optimizer muon refuses --instances > 1: Megatron's layer-wise optimizer supports "
                                  "no distributed-optimizer instances (each matrix has one owner in all the ranks)%s%s",
                          "", "");
    if (numels && !matrices)
        return plan_error(err, n, "--optimizer muon with --numels needs --matrices (which parameters are Muon's)%s%s",
                          "", "");
    if (!numels && matrices)
        return plan_error(err, n, "--matrices is for --numels: with --model Muon takes every layer's qkvw, attprojw, "
                                  "fcw and fcprojw%s%s", "", "");
    if (numels && wpe) return plan_error(err, n, "--wpe is for --model (GPT-2's wpe)%s%s", "", "");
    o->wpe_muon = wpe && strcmp(wpe, "muon") == 0;
    return 0;
}

// --matrices: is_muon from a list of parameter indices. Returns 0 or -1.
static int mark_matrices(PlanOptions* o, const char* list, char* err, size_t n) {
    size_t* indices = NULL;
    int count = 0, rc = strcmp(list, "none") == 0 ? 0 : parse_list("--matrices", list, 0, &indices, &count, err, n);
    o->is_muon = (int*)calloc((size_t)o->num_params, sizeof(int));
    if (rc == 0 && o->is_muon == NULL) rc = plan_error(err, n, "out of memory%s%s", "", "");
    for (int k = 0; k < count && rc == 0; k++) {
        if (indices[k] >= (size_t)o->num_params) {
            snprintf(err, n, "--matrices: index %zu is outside 0..%d", indices[k], o->num_params - 1);
            rc = -1;
        } else {
            o->is_muon[indices[k]] = 1;
        }
    }
    free(indices);
    return rc;
}

// GPT-2's Muon matrices: every layer's qkvw, attprojw, fcw, fcprojw; wpe with --wpe muon.
// (megatron-core routes wpe, 2-D and not tagged an embedding, to Muon; the issue keeps it in AdamW.)
static int mark_gpt2_matrices(PlanOptions* o, char* err, size_t n) {
    o->is_muon = (int*)calloc((size_t)o->num_params, sizeof(int));
    if (o->is_muon == NULL) return plan_error(err, n, "out of memory%s%s", "", "");
    for (int i = 0; i < o->num_params; i++) {
        int layer = gpt2_tensor_layer(&o->cfg, i);
        o->is_muon[i] = layer >= 0 && layer < o->cfg.num_layers && gpt2_tensor_decays(&o->cfg, i);
    }
    o->is_muon[gpt2_idx_wpe()] = o->wpe_muon;
    return 0;
}

// Parses argv[0..argc) (no program name). Returns 0 or -1 with a message.
static int parse_plan_args(int argc, char** argv, PlanOptions* o, char* err, size_t n) {
    memset(o, 0, sizeof(*o));
    o->vocab = 50257;
    o->max_seq = 1024;
    o->dp = 1;
    o->instances = 1;
    o->bucket_size = -1;
    o->overlap_grad_reduce = 1;
    o->shared_embedding = -1;
    o->grad_bytes = 4;
    o->tokens = 16 * 1024;
    o->accumulation = 1;
    const char* numels_arg = NULL;
    const char* matrices_arg = NULL;
    const char* wpe_arg = NULL;
    for (int i = 0; i < argc; i++) {
        const char* a = argv[i];
        int has_value = i + 1 < argc;
        const char* v = has_value ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { o->help = 1; continue; }
        if (strcmp(a, "--pad-busbw") == 0) { o->pad_busbw = 1; continue; }
        if (strcmp(a, "--no-overlap-grad-reduce") == 0) { o->overlap_grad_reduce = 0; continue; }
        if (strcmp(a, "--json") == 0) { o->json = 1; continue; }
        if (strcmp(a, "--shards") == 0) { o->shards = 1; continue; }
        if (strcmp(a, "--split-embedding") == 0) { o->split_embedding = 1; continue; }
        if (strcmp(a, "--fp32-accumulation") == 0) { o->fp32_accumulation = 1; continue; }
        if (strcmp(a, "--average-in-collective") == 0) { o->average_in_collective = 1; continue; }
        if (strcmp(a, "--dp-invariant") == 0) { o->dp_invariant = 1; continue; }
        int takes_value = strcmp(a, "--numels") == 0 || strcmp(a, "--model") == 0 || strcmp(a, "--vocab") == 0 ||
                          strcmp(a, "--max-seq") == 0 || strcmp(a, "--heads") == 0 || strcmp(a, "--dp") == 0 ||
                          strcmp(a, "--instances") == 0 ||
                          strcmp(a, "--bucket-size") == 0 || strcmp(a, "--shared-embedding") == 0 ||
                          strcmp(a, "--batch") == 0 || strcmp(a, "--grad-dtype") == 0 || strcmp(a, "--tokens") == 0 ||
                          strcmp(a, "--accumulation") == 0 || strcmp(a, "--optimizer") == 0 ||
                          strcmp(a, "--wpe") == 0 || strcmp(a, "--matrices") == 0;
        if (!takes_value) return plan_error(err, n, "unknown argument '%s'%s", a, "");
        if (!has_value) return plan_error(err, n, "%s needs a value%s", a, "");
        i++;
        if (strcmp(a, "--numels") == 0) numels_arg = v;
        else if (strcmp(a, "--model") == 0) o->model = v;
        else if (strcmp(a, "--batch") == 0) o->batch_file = v;
        else if (strcmp(a, "--matrices") == 0) matrices_arg = v;
        else if (strcmp(a, "--wpe") == 0) {
            if (strcmp(v, "adamw") != 0 && strcmp(v, "muon") != 0)
                return plan_error(err, n, "bad --wpe '%s' (adamw or muon)%s", v, "");
            wpe_arg = v;
        } else if (strcmp(a, "--optimizer") == 0) {
            if (strcmp(v, "adamw") != 0 && strcmp(v, "muon") != 0)
                return plan_error(err, n, "bad --optimizer '%s' (adamw or muon)%s", v, "");
            o->muon = strcmp(v, "muon") == 0;
        }
        else if (strcmp(a, "--vocab") == 0) {
            if (!parse_int_range(v, 1, 1 << 30, &o->vocab)) return plan_error(err, n, "bad --vocab '%s'%s", v, "");
        } else if (strcmp(a, "--max-seq") == 0) {
            if (!parse_int_range(v, 1, 1 << 30, &o->max_seq)) return plan_error(err, n, "bad --max-seq '%s'%s", v, "");
        } else if (strcmp(a, "--heads") == 0) {
            if (!parse_int_range(v, 1, 1 << 20, &o->heads)) return plan_error(err, n, "bad --heads '%s'%s", v, "");
        } else if (strcmp(a, "--dp") == 0) {
            if (!parse_int_range(v, 1, 1 << 24, &o->dp)) return plan_error(err, n, "bad --dp '%s' (1..16777216)%s", v, "");
        } else if (strcmp(a, "--instances") == 0) {
            if (!parse_int_range(v, 1, 1 << 24, &o->instances))
                return plan_error(err, n, "bad --instances '%s' (1..16777216)%s", v, "");
        } else if (strcmp(a, "--bucket-size") == 0) {
            if (zero1_parse_bucket_size(a, v, &o->bucket_size, err, n) != 0) return -1;
        } else if (strcmp(a, "--grad-dtype") == 0) {
            if (strcmp(v, "fp32") == 0) o->grad_bytes = 4;
            else if (strcmp(v, "bf16") == 0) o->grad_bytes = 2;
            else return plan_error(err, n, "bad --grad-dtype '%s' (fp32 or bf16)%s", v, "");
        } else if (strcmp(a, "--accumulation") == 0) {
            if (!parse_int_range(v, 1, 1 << 30, &o->accumulation) || (o->accumulation & (o->accumulation - 1)))
                return plan_error(err, n, "bad --accumulation '%s' (a power of two)%s", v, "");
        } else if (strcmp(a, "--tokens") == 0) {
            if (!parse_int_range(v, 1, 1 << 30, &o->tokens)) return plan_error(err, n, "bad --tokens '%s'%s", v, "");
        } else if (strcmp(a, "--shared-embedding") == 0) {
            if (strcmp(v, "none") == 0) o->shared_embedding = -1;
            else if (!parse_int_range(v, 0, 1 << 30, &o->shared_embedding))
                return plan_error(err, n, "bad --shared-embedding '%s' (index or none)%s", v, "");
        }
    }
    if (o->help || o->batch_file) return 0;
    if (o->dp % o->instances != 0)
        return plan_error(err, n, "--instances must divide --dp into equal groups (got --dp %s --instances %s)",
                          argv_value(argc, argv, "--dp"), argv_value(argc, argv, "--instances"));
    if ((numels_arg == NULL) == (o->model == NULL))
        return plan_error(err, n, "give exactly one of --numels and --model%s%s", "", "");
    if (o->split_embedding && !o->model) return plan_error(err, n, "--split-embedding needs --model%s%s", "", "");
    if (o->split_embedding) o->shared_embedding = 0;  // wte gets a bucket of its own, as in the trainers
    if (o->fp32_accumulation && o->grad_bytes != 2)
        return plan_error(err, n, "--fp32-accumulation needs --grad-dtype bf16%s%s", "", "");
    if (o->dp_invariant && (o->grad_bytes != 4 || o->average_in_collective || o->split_embedding || o->instances > 1 ||
                            (o->dp & (o->dp - 1))))
        return plan_error(err, n, "--dp-invariant needs a power-of-two --dp with fp32 grads and none of "
                                  "--average-in-collective, --split-embedding, --instances%s%s", "", "");
    if (muon_options(o, numels_arg != NULL, matrices_arg, wpe_arg, err, n) != 0) return -1;
    if (numels_arg) {
        if (parse_list("--numels", numels_arg, 1, &o->numels, &o->num_params, err, n) != 0) return -1;
        return o->muon ? mark_matrices(o, matrices_arg, err, n) : 0;
    }
    if (gpt2_config_from_descriptor(o->model, o->vocab, o->max_seq, &o->cfg) != 0)
        return plan_error(err, n, "bad --model '%s' (want dN, e.g. d12)%s", o->model, "");
    if (o->heads > 0) {
        if (o->cfg.channels % o->heads != 0) return plan_error(err, n, "--heads must divide the channels%s%s", "", "");
        o->cfg.num_heads = o->heads;
    }
    o->num_params = gpt2_num_tensors(&o->cfg);
    o->numels = (size_t*)calloc((size_t)o->num_params, sizeof(size_t));
    if (o->numels == NULL) return plan_error(err, n, "out of memory%s%s", "", "");
    for (int i = 0; i < o->num_params; i++) o->numels[i] = gpt2_tensor_numel(&o->cfg, i);
    return o->muon ? mark_gpt2_matrices(o, err, n) : 0;
}

// ---------------------------------------------------------------------------- timing

// When a bucket's collectives can start (zero1/bucket_timing.h), its params as model indices:
// a buffer's bucket holds a run of its params, which spans the model indices between its
// first and last (the other buffer's params there sit in the same blocks).
static void bucket_timing(const PlanOptions* o, const PlanBuffer* B, const Zero1Bucket* k, int* grads_final_after,
                          int* needed_by) {
    Zero1Bucket in_model = *k;
    in_model.first_param = plan_model_index(B, k->first_param);
    in_model.last_param = plan_model_index(B, k->last_param);
    zero1_bucket_timing(&o->cfg, o->split_embedding && B->split_param >= 0, &in_model, grads_final_after, needed_by);
}

static const char* block_name(const PlanOptions* o, int block, char* buf, size_t n) {
    if (block < 0) snprintf(buf, n, "embeddings");
    else if (block == o->cfg.num_layers) snprintf(buf, n, "lnf+classifier");
    else snprintf(buf, n, "h%d", block);
    return buf;
}

static int zero1_plan_log2(int power_of_two) {
    int l = 0;
    while ((1 << l) < power_of_two) l++;
    return l;
}

Zero1Ledger plan_ledger(const PlanOptions* o, const PlanBuffer* B, int param_bytes) {
    Zero1Ledger g = zero1_ledger_of_layout(B->layout, o->instances, param_bytes, o->grad_bytes, o->fp32_accumulation,
                                           o->split_embedding ? B->split_param : -1, (uint64_t)o->tokens,
                                           (uint64_t)o->cfg.channels, o->dp_invariant ? o->accumulation : 0);
    if (B->layerwise) zero1_ledger_set_muon_state(&g, zero1_layerwise_most_owned(B->layout));
    return g;
}

// ---------------------------------------------------------------------------- JSON

static void json_range(FILE* f, const char* key, Zero1Range r) {
    fprintf(f, "\"%s\":[%zu,%zu]", key, r.start, r.end);
}

static void json_ledger(FILE* f, const Zero1Ledger* g) {
    fprintf(f,
            "{\"param_bytes\":%d,\"grad_bytes\":%d,\"state_bytes\":%d,\"owned_numel\":%llu,"
            "\"param_buffer\":%llu,\"grad_buffer\":%llu,\"state_replicated\":%llu,\"state_zero1\":%llu,"
            "\"total_replicated\":%llu,\"total_zero1\":%llu,\"sent_all_reduce\":%llu,"
            "\"sent_reduce_scatter\":%llu,\"sent_all_gather\":%llu,\"sent_cross_all_reduce\":%llu,"
            "\"sent_zero1\":%llu,\"recv_temporaries\":%llu,\"split_rows\":%llu,\"split_sent_max\":%llu,"
            "\"partial_grads\":%llu,\"overflow\":%s}",
            g->param_bytes, g->grad_bytes, g->state_bytes, (unsigned long long)g->owned_numel,
            (unsigned long long)g->param_buffer, (unsigned long long)g->grad_buffer,
            (unsigned long long)g->state_replicated, (unsigned long long)g->state_zero1,
            (unsigned long long)g->total_replicated, (unsigned long long)g->total_zero1,
            (unsigned long long)g->sent_all_reduce, (unsigned long long)g->sent_reduce_scatter,
            (unsigned long long)g->sent_all_gather, (unsigned long long)g->sent_cross_all_reduce,
            (unsigned long long)g->sent_zero1, (unsigned long long)g->recv_temporaries,
            (unsigned long long)g->split_rows, (unsigned long long)g->split_sent_max,
            (unsigned long long)g->partial_grads, g->overflow ? "true" : "false");
}

// The layer-wise buffer's ranks: the matrices each owns (model indices, definition order),
// their elements and the rest of its shards (padding).
static void json_layerwise_ranks(FILE* f, const PlanBuffer* B) {
    const Zero1Layout* L = B->layout;
    fprintf(f, ",\"ranks\":[");
    for (int r = 0; r < L->dp; r++) {
        size_t mine = 0;
        fprintf(f, "%s{\"rank\":%d,\"params\":[", r ? "," : "", r);
        for (int p = 0, k = 0; p < L->num_params; p++) {
            if (zero1_layerwise_owner(L, p) != r) continue;
            fprintf(f, "%s%d", k++ ? "," : "", plan_model_index(B, p));
            mine += L->params[p].end - L->params[p].start;
        }
        fprintf(f, "],\"param_numel\":%zu,\"padding\":%zu}", mine, L->numel / (size_t)L->dp - mine);
    }
    fputc(']', f);
}

static int json_shards(FILE* f, const PlanBuffer* B, char* err, size_t n) {
    const Zero1Layout* L = B->layout;
    fprintf(f, ",\"shards\":[");
    for (int r = 0; r < L->dp; r++) {
        Zero1RankShards S;
        if (zero1_shards_build(&S, L, r, err, n) != 0) return -1;
        for (int b = 0; b < S.num_buckets; b++) {
            const Zero1BucketShard* bs = &S.buckets[b];
            fprintf(f, "%s{\"rank\":%d,\"bucket\":%d,\"start\":%zu,\"end\":%zu,\"params\":[", (r || b) ? "," : "", r,
                    b, bs->shard.start, bs->shard.end);
            for (int v = 0; v < bs->num_views; v++) {
                const Zero1ParamView* pv = &bs->views[v];
                fprintf(f, "%s{\"index\":%d,", v ? "," : "", plan_model_index(B, pv->param));
                json_range(f, "gbuf_world", pv->gbuf_world);
                fputc(',', f);
                json_range(f, "gbuf_world_in_bucket", pv->gbuf_world_in_bucket);
                fputc(',', f);
                json_range(f, "gbuf_local", pv->gbuf_local);
                fputc(',', f);
                json_range(f, "param", pv->param_range);
                fputc('}', f);
            }
            fprintf(f, "]}");
        }
        zero1_shards_free(&S);
    }
    fprintf(f, "]");
    return 0;
}

int plan_print_buffer_json(FILE* f, const PlanOptions* o, const PlanBuffer* B, char* err, size_t n) {
    const Zero1Layout* L = B->layout;
    int instances = o->instances;
    fputc('{', f);
    if (B->optimizer) fprintf(f, "\"optimizer\":\"%s\",", B->optimizer);
    fprintf(f, "\"dp\":%d,\"instances\":%d,\"group_size\":%d,\"bucket_size\":", L->dp * instances, instances, L->dp);
    if (L->bucket_size == 0) fprintf(f, "null");
    else fprintf(f, "%zu", L->bucket_size);
    fprintf(f, ",\"grad_dtype\":\"%s\",\"fp32_accumulation\":%s,\"average_in_collective\":%s,\"split_embedding\":%s,"
               "\"tokens\":%d,\"dp_invariant\":%s,\"accumulation\":%d", o->grad_bytes == 2 ? "bf16" : "fp32",
            o->fp32_accumulation ? "true" : "false", o->average_in_collective ? "true" : "false",
            o->split_embedding ? "true" : "false", o->tokens, o->dp_invariant ? "true" : "false", o->accumulation);
    fprintf(f, ",\"overlap_grad_reduce\":%s,\"pad_busbw\":%s,\"shared_embedding\":",
            o->overlap_grad_reduce ? "true" : "false", L->pad_busbw ? "true" : "false");
    if (L->shared_embedding < 0) fprintf(f, "null");
    else fprintf(f, "%d", plan_model_index(B, L->shared_embedding));
    fprintf(f, ",\"bucket_divisor\":%zu,", zero1_bucket_divisor(L->dp, L->pad_busbw));
    if (B->layerwise) fprintf(f, "\"shard_divisor\":%zu,", zero1_layerwise_shard_divisor(L->dp, L->pad_busbw));
    fprintf(f, "\"numel\":%zu,\"numel_unpadded\":%zu,\"buckets\":[", L->numel, L->numel_unpadded);
    for (int b = 0; b < L->num_buckets; b++) {
        const Zero1Bucket* k = &L->buckets[b];
        fprintf(f, "%s{\"start\":%zu,\"end\":%zu,\"numel_unpadded\":%zu,\"first_param\":%d,\"last_param\":%d",
                b ? "," : "", k->start, k->end, k->numel_unpadded, plan_model_index(B, k->first_param),
                plan_model_index(B, k->last_param));
        if (B->layerwise) fprintf(f, ",\"shard_size\":%zu", (k->end - k->start) / (size_t)L->dp);
        if (o->model) {
            int final_after, needed_by;
            bucket_timing(o, B, k, &final_after, &needed_by);
            fprintf(f, ",\"grads_final_after_backward_of\":%d,\"params_needed_by_forward_of\":%d", final_after,
                    needed_by);
        }
        fputc('}', f);
    }
    fprintf(f, "],\"params\":[");
    for (int i = 0; i < L->num_params; i++) {
        const Zero1ParamPlace* p = &L->params[i];
        fprintf(f, "%s{\"index\":%d,\"start\":%zu,\"end\":%zu,\"bucket\":%d", i ? "," : "", plan_model_index(B, i),
                p->start, p->end, p->bucket);
        if (B->layerwise) fprintf(f, ",\"owner\":%d", zero1_layerwise_owner(L, i));
        fputc('}', f);
    }
    fprintf(f, "],\"ledger\":{\"bf16_params\":");
    Zero1Ledger g = plan_ledger(o, B, 2);
    json_ledger(f, &g);
    fprintf(f, ",\"fp32_params\":");
    g = plan_ledger(o, B, 4);
    json_ledger(f, &g);
    fprintf(f, "}");
    if (B->layerwise) json_layerwise_ranks(f, B);
    if (o->shards && json_shards(f, B, err, n) != 0) return -1;
    fputc('}', f);
    return 0;
}

// ---------------------------------------------------------------------------- text

const char* plan_param_name(const PlanOptions* o, int model_index, char* buf, size_t n) {
    if (o->model) return gpt2_tensor_name(&o->cfg, model_index, buf, n);
    snprintf(buf, n, "p%d", model_index);
    return buf;
}

static const char* buffer_param_name(const PlanOptions* o, const PlanBuffer* B, int p, char* buf, size_t n) {
    return plan_param_name(o, plan_model_index(B, p), buf, n);
}

void plan_print_bucket_table(FILE* f, const PlanOptions* o, const PlanBuffer* B) {
    const Zero1Layout* L = B->layout;
    fprintf(f, "%-6s %14s %14s %14s %14s %10s %12s  %s\n", "bucket", "start", "end", "unpadded", "padded",
            "padding", "shard/rank", B->layerwise ? "matrices (backprop order)" : "parameters (buffer order)");
    for (int b = 0; b < L->num_buckets; b++) {
        const Zero1Bucket* k = &L->buckets[b];
        size_t padded = k->end - k->start;
        char first[64], last[64];
        buffer_param_name(o, B, k->last_param, last, sizeof(last));
        buffer_param_name(o, B, k->first_param, first, sizeof(first));
        fprintf(f, "%-6d %14zu %14zu %14zu %14zu %10zu %12zu  ", b, k->start, k->end, k->numel_unpadded, padded,
                padded - k->numel_unpadded, padded / (size_t)L->dp);
        if (k->first_param == k->last_param) fprintf(f, "%s\n", first);
        else fprintf(f, "%s .. %s (%d)\n", last, first, k->last_param - k->first_param + 1);
    }
    size_t sum_numels = 0;
    for (int i = 0; i < L->num_params; i++) sum_numels += L->params[i].end - L->params[i].start;
    size_t pad = L->numel - sum_numels;
    if (B->layerwise) {  // a layer-wise bucket's numel_unpadded is its matrices' sum: all padding is the shards'
        fprintf(f, "total: numel %zu (padded), %zu in matrices, padding %zu elements = %.4f%% (starts aligned to %d, "
                   "shards to %zu, and the shards' imbalance)\n\n", L->numel, sum_numels, pad,
                100.0 * (double)pad / (double)L->numel, ZERO1_PARAM_START_ALIGN,
                zero1_layerwise_shard_divisor(L->dp, L->pad_busbw));
        return;
    }
    fprintf(f, "total: numel %zu (padded), %zu in parameters, padding %zu elements = %.4f%% "
               "(start alignment %zu, bucket ends %zu)\n\n",
            L->numel, sum_numels, pad, 100.0 * (double)pad / (double)L->numel, L->numel_unpadded - sum_numels,
            L->numel - L->numel_unpadded);
}

void plan_print_timing(FILE* f, const PlanOptions* o, const PlanBuffer* B) {
    const Zero1Layout* L = B->layout;
    fprintf(f, "when each bucket's collectives can start (from step 2; step 1 learns the gradient counts and "
               "fires every bucket at its finish)%s:\n",
            o->split_embedding && B->split_param >= 0
                ? ", wte split (its encoder rows go sparsely after the embeddings' backward)" : "");
    fprintf(f, "%-6s %-34s %s\n", "bucket", "gradient reduction: after backward of", "all-gather: before forward of");
    for (int b = 0; b < L->num_buckets; b++) {
        int final_after, needed_by;
        char a[32], c[32];
        bucket_timing(o, B, &L->buckets[b], &final_after, &needed_by);
        fprintf(f, "%-6d %-34s %s\n", b, block_name(o, final_after, a, sizeof(a)), block_name(o, needed_by, c, sizeof(c)));
    }
    fprintf(f, "\n");
}

void plan_print_ledger_legend(FILE* f, const PlanOptions* o) {
    fprintf(f, "\nledger: replicated = param buffer + grad buffer + optimizer state on all numel elements;\n"
               "ZeRO-1 = same buffers + optimizer state on numel/DP owned elements. Sent per rank (ring):\n"
               "all-reduce 2(DP-1)/DP*numel*grad_bytes; reduce-scatter (DP-1)/DP*numel*grad_bytes\n"
               "+ all-gather (DP-1)/DP*numel*param_bytes.\n");
    if (o->instances > 1) {
        fprintf(f, "instances: DP above is a group's; the replicated column all-reduces over all %d ranks, and each\n"
                   "rank all-reduces its numel/DP owned elements across the %d groups: 2(K-1)/K*owned*grad_bytes.\n",
                o->dp, o->instances);
    }
}

int plan_print_shards(FILE* f, const PlanOptions* o, const PlanBuffer* B, char* err, size_t n) {
    const Zero1Layout* L = B->layout;
    char name[64];
    fprintf(f, "\nshards (world = buffer offsets, local = offsets in the rank's shard, param = in the tensor):\n");
    for (int r = 0; r < L->dp; r++) {
        Zero1RankShards S;
        if (zero1_shards_build(&S, L, r, err, n) != 0) return -1;
        for (int b = 0; b < S.num_buckets; b++) {
            const Zero1BucketShard* bs = &S.buckets[b];
            fprintf(f, "rank %d bucket %d shard [%zu, %zu)%s\n", r, b, bs->shard.start, bs->shard.end,
                    bs->num_views == 0 ? " padding only" : "");
            for (int v = 0; v < bs->num_views; v++) {
                const Zero1ParamView* pv = &bs->views[v];
                fprintf(f, "    %-16s world [%zu, %zu) in-bucket [%zu, %zu) local [%zu, %zu) param [%zu, %zu)\n",
                        buffer_param_name(o, B, pv->param, name, sizeof(name)), pv->gbuf_world.start,
                        pv->gbuf_world.end, pv->gbuf_world_in_bucket.start, pv->gbuf_world_in_bucket.end,
                        pv->gbuf_local.start, pv->gbuf_local.end, pv->param_range.start, pv->param_range.end);
            }
        }
        zero1_shards_free(&S);
    }
    return 0;
}

void plan_print_model(FILE* f, const PlanOptions* o) {
    if (o->model) {
        const GPT2Config* c = &o->cfg;
        fprintf(f, "model GPT-2 %s: V=%d Vp=%d maxT=%d L=%d NH=%d C=%d, %d tensors, %zu parameters\n", o->model,
                c->vocab_size, c->padded_vocab_size, c->max_seq_len, c->num_layers, c->num_heads, c->channels,
                o->num_params, gpt2_num_parameters(c));
    } else {
        size_t total = 0;
        for (int i = 0; i < o->num_params; i++) total += o->numels[i];
        fprintf(f, "%d parameters from --numels, %zu elements\n", o->num_params, total);
    }
}

static int print_text(FILE* f, const PlanOptions* o, const PlanBuffer* B, char* err, size_t n) {
    const Zero1Layout* L = B->layout;
    plan_print_model(f, o);
    char name[64];
    if (o->instances > 1) {
        fprintf(f, "DP=%d as %d distributed-optimizer instances of %d ranks: the layout and shards below are a "
                   "group's (DP=%d)\n", o->dp, o->instances, L->dp, L->dp);
    }
    fprintf(f, "DP=%d  bucket_size=", L->dp);
    if (L->bucket_size == 0 && o->overlap_grad_reduce) fprintf(f, "none (one bucket)");
    else if (L->bucket_size == 0) fprintf(f, "none (one bucket without overlap, as in Megatron)");
    else if (o->bucket_size >= 0) fprintf(f, "%zu elements", L->bucket_size);
    else if (o->instances > 1) fprintf(f, "%zu elements (default max(40e6, 1e6*DP), DP all %d ranks)", L->bucket_size, o->dp);
    else fprintf(f, "%zu elements (default max(40e6, 1e6*DP))", L->bucket_size);
    fprintf(f, "  pad_busbw=%s  shared_embedding=", L->pad_busbw ? "on" : "off");
    if (L->shared_embedding < 0) fprintf(f, "none\n");
    else fprintf(f, "%d (%s)\n", L->shared_embedding, plan_param_name(o, L->shared_embedding, name, sizeof(name)));
    if (!o->overlap_grad_reduce && o->bucket_size > 0) fprintf(f, "note: --bucket-size %lld is not used\n", o->bucket_size);
    fprintf(f, "layout: reverse definition order, param starts aligned to %d elements, bucket ends padded to %s=%zu\n\n",
            ZERO1_PARAM_START_ALIGN, L->pad_busbw ? "lcm(DP,128,65536)" : "lcm(DP,128)",
            zero1_bucket_divisor(L->dp, L->pad_busbw));
    plan_print_bucket_table(f, o, B);
    if (o->model) plan_print_timing(f, o, B);
    const char* gdt = o->grad_bytes == 2 ? "bf16" : "fp32";
    if (o->fp32_accumulation) {
        fprintf(f, "fp32 accumulation: each bucket's bf16 slices go by all-to-all into one of two receive temporaries "
                   "and are summed in fp32; a bucket's exchange starts once the one fired before it is done (at most "
                   "two temporaries in use)\n");
    }
    if (o->average_in_collective) {
        fprintf(f, "average in the collective: the reductions average (ncclAvg; MPI scales the result as it moves "
                   "it) instead of a 1/DP pre-scale; no byte count changes\n");
    }
    if (o->split_embedding) {
        fprintf(f, "split embedding: wte's encoder rows of the last micro-step (at most %d tokens per rank) go by a "
                   "sparse all-to-all-v after the embeddings' backward\n", o->tokens);
    }
    if (o->dp_invariant) {
        fprintf(f, "DP-invariant: %d micro-step%s a step folded pairwise into %d partial grad buffer%s; each bucket's "
                   "fp32 slices go by all-to-all (the fp32 reduce-scatter's bytes) and are summed as the same tree\n",
                o->accumulation, o->accumulation == 1 ? "" : "s", zero1_plan_log2(o->accumulation),
                zero1_plan_log2(o->accumulation) == 1 ? "" : "s");
    }
    if (o->fp32_accumulation || o->average_in_collective || o->split_embedding || o->dp_invariant) fprintf(f, "\n");
    fprintf(f, "memory and communication, bf16 params + %s grads (GPU default):\n", gdt);
    Zero1Ledger g = plan_ledger(o, B, 2);
    zero1_ledger_print(f, &g);
    fprintf(f, "\nmemory and communication, fp32 params + %s grads (CPU fp32; master == params):\n", gdt);
    g = plan_ledger(o, B, 4);
    zero1_ledger_print(f, &g);
    plan_print_ledger_legend(f, o);
    return o->shards ? plan_print_shards(f, o, B, err, n) : 0;
}

// ---------------------------------------------------------------------------- main

// Builds and prints one plan. Returns the exit code.
static int run_plan(PlanOptions* o, int force_json) {
    if (o->muon) return plan_muon_run(o, o->json || force_json);
    char err[512] = {0};
    Zero1Layout L;
    long long bucket_size = zero1_ddp_bucket_size(o->bucket_size, o->dp, o->overlap_grad_reduce);
    if (zero1_layout_build(&L, o->numels, o->num_params, o->dp / o->instances, bucket_size, o->pad_busbw,
                           o->shared_embedding, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    PlanBuffer B = {&L, NULL, NULL, 0, o->split_embedding ? gpt2_idx_wte() : -1};
    int rc = (o->json || force_json) ? plan_print_buffer_json(stdout, o, &B, err, sizeof(err))
                                     : print_text(stdout, o, &B, err, sizeof(err));
    if (rc == 0 && (o->json || force_json)) fputc('\n', stdout);
    zero1_layout_free(&L);
    if (rc != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    return 0;
}

static void plan_options_free(PlanOptions* o) {
    free(o->numels);
    free(o->is_muon);
}

#define MAX_BATCH_ARGS 64

static int run_batch(const char* path) {
    FILE* f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "error: cannot open batch file '%s': %s\n", path, strerror(errno));
        return 2;
    }
    char* line = NULL;
    size_t cap = 0;
    long line_no = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &cap, f) >= 0) {
        line_no++;
        char* args[MAX_BATCH_ARGS];
        int argc = 0;
        for (char* tok = strtok(line, " \t\r\n"); tok != NULL; tok = strtok(NULL, " \t\r\n")) {
            if (argc == MAX_BATCH_ARGS) {
                fprintf(stderr, "error: %s:%ld: more than %d arguments\n", path, line_no, MAX_BATCH_ARGS);
                rc = 2;
                break;
            }
            args[argc++] = tok;
        }
        if (rc != 0 || argc == 0 || args[0][0] == '#') continue;
        PlanOptions o;
        char err[512];
        if (parse_plan_args(argc, args, &o, err, sizeof(err)) != 0 || o.help || o.batch_file) {
            fprintf(stderr, "error: %s:%ld: %s\n", path, line_no,
                    (o.help || o.batch_file) ? "--help/--batch are not allowed in a batch line" : err);
            rc = 2;
        } else {
            rc = run_plan(&o, 1);
        }
        plan_options_free(&o);
    }
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

int main(int argc, char** argv) {
    PlanOptions o;
    char err[512];
    if (parse_plan_args(argc - 1, argv + 1, &o, err, sizeof(err)) != 0) {
        fprintf(stderr, "error: %s\n%s", err, USAGE);
        plan_options_free(&o);
        return 2;
    }
    if (o.help) {
        fputs(USAGE, stdout);
        plan_options_free(&o);
        return 0;
    }
    int rc = o.batch_file ? run_batch(o.batch_file) : run_plan(&o, 0);
    if (rc == 2 && !o.batch_file) fputs(USAGE, stderr);  // the arguments parsed but make no layout
    plan_options_free(&o);
    return rc;
}
