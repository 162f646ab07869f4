/*
 * gpt2_cost: predicts one GPU training step of the GPU trainer (train_gpt2.cu) from a FLOP
 * and byte count of its kernels (dev/cost/cost_model.h), before a GPU has measured it.
 *
 *   ./gpt2_cost --model d12 -b 16 -t 1024 --path naive        the per-kernel table and the step
 *   ./gpt2_cost ... --gpu h200 --brief                        one line (scripts/gpu_check.sh)
 *   ./gpt2_cost ... --json                                    everything, as one JSON object
 *   ./gpt2_cost ... --profile P.jsonl --occupancy R.jsonl     with what was measured of the kernels
 *
 * Prints, for H100 SXM and H200 (989 TFLOP/s dense bf16 tensor cores and 67 TFLOP/s fp32
 * for both; 3.35 and 4.8 TB/s of HBM):
 *   - per kernel of one step: instances, FLOPs, HBM bytes (read + written), roofline time
 *     max(FLOPs / peak, bytes / bandwidth) and whether FLOPs or bytes bound it;
 *   - per step: the roofline time, and an "achievable" time with the tensor cores at
 *     --gemm-efficiency of peak in cuBLASLt GEMMs (default 0.7: large bf16 GEMMs reach
 *     about 70%), --flash-efficiency in our flash-attention tiles (default 0.35: WMMA
 *     compiles to mma.sync, with which FlashAttention-2 reaches about 35% of an H100's
 *     peak; our kernels are unlikely to do better), --cudnn-efficiency in cuDNN's attention
 *     (default 0.6, an assumption: not measured here), --bandwidth-efficiency (default 0.8)
 *     of the HBM bandwidth, plus --launch-us (default 2) per kernel launch; tokens/s per
 *     GPU and MFU = tokens/s x model FLOPs per token / 989
 *     TFLOP/s, the model FLOPs per token being 6N + 6LCT (llm.c's definition: N parameters,
 *     the causal half of attention), whatever the kernels recompute. --profile FILE (the CPU
 *     layer's CUDA_CPU_PROFILE of a BF16 test_kernels_cuda) and --occupancy FILE (the compiler
 *     report's JSON Lines, dev/test/check_compiler_report.py --json) replace assumptions of
 *     the achievable time by measurements for the kernels they cover (cost_model.h's header);
 *     the table marks those rows (p: profile, c: compiler). For scale: llm.c
 *     reaches about 38% MFU on GPT-2 124M on H100s, so the achievable column, not the
 *     roofline, is the one to hold a measurement against;
 *   - communication of ZeRO-1 (-z 1) at DP 8, 16, ..., 1024: the reduce-scatter of the grads
 *     and the all-gather of the bf16 params, with the bytes each rank sends in a ring
 *     (zero1/ledger.h: (DP-1)/DP x the padded buffer of the zero1/layout.h layout x bytes per
 *     element), at --nvlink-gbs (default 370 GB/s: nccl-tests' bus bandwidth on 8 x H100)
 *     and --ib-gbs (default 50 GB/s: 400 Gb/s InfiniBand per GPU) of bus bandwidth, so
 *     time = sent bytes / bus bandwidth (+ --ring-latency-us per ring step, default 0: the
 *     model is bandwidth-only; at DP 1024 a 5 us latency would add about 5 ms per
 *     collective). Overlap, as zero1/runtime.c does it: each bucket's reduce-scatter
 *     starts once the backward of the lowest block contributing to it is done
 *     (zero1/bucket_timing.h), one collective at a time on the communication stream; what
 *     runs past the end of the backward is exposed. The all-gathers: the last bucket's goes
 *     out after its AdamW, each other one when the forward waits for the bucket after it;
 *     a forward block waits for its bucket. Exposed time is added to the step. The replicated
 *     optimizer (-z 0) all-reduces after the backward, all of it exposed. These tables use
 *     the achievable compute times. NCCL's use of SMs (slowing compute) is not modelled;
 *     NVLink beyond 8 GPUs assumes an NVLink switch system.
 * Every assumption of the kernel counts is in dev/cost/cost_model.h's header.
 * Errors: one `error:` line, exit 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev/cost/cost_model.h"
#include "llmc/gpt2_spec.h"
#include "run/files.h"
#include "tools/json.h"
#include "zero1/bucket_timing.h"
#include "llmc/muon.h"
#include "zero1/layout.h"
#include "zero1/layout_layerwise.h"
#include "zero1/ledger.h"

static const char* USAGE =
    "usage: gpt2_cost [--model dN|124M|350M|774M|1558M] [-b B] [-t T] [--max-seq T] [--vocab V]\n"
    "                 [--path naive|new] [--attention flash|naive|cudnn] [--fused-kernels 0|1] [-r 0|1]\n"
    "                 [--dp N] [-z 0|1] [--grad-dtype fp32|bf16] [--bucket-size N|none] [--gpu h100|h200]\n"
    "                 [--gemm-efficiency F] [--flash-efficiency F] [--cudnn-efficiency F]\n"
    "                 [--bandwidth-efficiency F] [--launch-us U]\n"
    "                 [--nvlink-gbs G] [--ib-gbs G] [--ring-latency-us U] [--json | --brief]\n"
    "                 [--profile FILE] [--occupancy FILE] [--optimizer adamw|muon [--muon-ns-bf16]]\n"
    "  --model          GPT-2 of depth N (d12 = 124M, d24 = 350M, d36 = 774M, d48 = 1558M), default d12\n"
    "  -b, -t           micro-batch per GPU and sequence length (default 16, 1024; T <= --max-seq)\n"
    "  --path           naive = --attention naive --fused-kernels 0 -r 0 (the reference kernels);\n"
    "                   new = --attention flash --fused-kernels 1 -r 1 (the GPU trainer's defaults)\n"
    "  --dp N           data-parallel ranks of the step summary (default 1; the DP table is 8..1024)\n"
    "  -z               1: ZeRO-1 (AdamW on numel/DP per rank), 0: replicated (default 1)\n"
    "  --grad-dtype     dtype of the gradient reduce-scatter / all-reduce (default fp32)\n"
    "  --bucket-size    ZeRO-1 bucket size in elements (default max(40e6, 1e6 x DP)); none: one bucket\n"
    "  --gpu            the GPU of --brief and of the step summary (default: both)\n"
    "  --brief          one line per GPU: predicted step ms, tokens/s and MFU, roofline and achievable\n"
    "  --*-efficiency   the achievable estimate's fractions of peak (defaults 0.7 GEMM, 0.35 flash,\n"
    "                   0.6 cuDNN, 0.8 bandwidth) and --launch-us per kernel launch (default 2)\n"
    "  --nvlink-gbs, --ib-gbs  bus bandwidths of the DP table (default 370, 50 GB/s);\n"
    "                   --ring-latency-us per ring step (default 0)\n"
    "  --profile FILE   the CPU layer's profile (CUDA_CPU_PROFILE=FILE of a BF16 test_kernels_cuda built with\n"
    "                   CUDA_CPU_TOOLS=1): bytes in whole sectors, the flash kernels' shared-memory wavefronts\n"
    "  --occupancy FILE the compiler report (check_compiler_report.py --json): blocks per SM, waves of blocks\n"
    "  --optimizer muon Newton-Schulz's FLOPs (5 quintic steps, Q, K, V apart) on the matrices the busiest rank\n"
    "                   owns at --dp (Megatron's layer-wise layout), in fp32 on CUDA cores, or with --muon-ns-bf16\n"
    "                   on tensor cores, at the GEMM efficiency, and their share of the step\n";

typedef struct {
    const char* model;
    int B, T, max_seq, vocab;
    GPT2Kernels kernels;
    int dp, zero_stage, grad_bytes;
    long long bucket_size;  // -1 default, 0 none
    int gpu;                // -1 both, else an index of COST_GPUS
    CostEfficiency eff;     // the achievable estimate
    double nvlink_gbs, ib_gbs, ring_latency_us;
    int json, brief;
    int muon, muon_ns_bf16;  // --optimizer muon: Newton-Schulz's cost
    GPT2Config cfg;
    const char *profile, *occupancy;  // the files of the measured inputs (NULL: none)
    CostMeasurements measured;
} Options;

// ---------------------------------------------------------------------------- measured inputs

// A template instance whose argument is a number other than m->instance (a flash kernel for
// other head sizes): not the model's.
static int other_instance(const CostMeasurements* m, const char* kernel) {
    const char* lt = strchr(kernel, '<');
    if (!lt) return 0;
    char* end = NULL;
    long n = strtol(lt + 1, &end, 10);
    return end != lt + 1 && *end == '>' && n != m->instance;
}

static CostMeasured* measured_entry(CostMeasurements* m, const char* kernel) {
    char base[64];
    snprintf(base, sizeof(base), "%.*s", (int)strcspn(kernel, "<"), kernel);  // a template's name alone
    for (int i = 0; i < m->n; i++) {
        if (strcmp(m->k[i].kernel, base) == 0) return &m->k[i];
    }
    if (m->n == COST_MAX_MEASURED) fatal("more than %d kernels in the measured inputs", COST_MAX_MEASURED);
    CostMeasured* x = &m->k[m->n++];
    memset(x, 0, sizeof(*x));
    snprintf(x->kernel, sizeof(x->kernel), "%s", base);
    return x;
}

static double json_number_of(const JsonValue* v, const char* key, const char* path, int line) {
    const JsonValue* x = json_get(v, key);
    if (!x || x->type != JSON_NUMBER) fatal("%s:%d: no number \"%s\"", path, line, key);
    return x->number;
}

// Calls each(object, line) for every line of the JSON Lines file path.
static void read_json_lines(const char* path, CostMeasurements* m,
                            void (*each)(CostMeasurements*, const JsonValue*, const char*, int)) {
    FILE* f = fopen(path, "r");
    if (!f) fatal("cannot read %s", path);
    char* text = NULL;
    size_t cap = 0;
    ssize_t n;
    for (int line = 1; (n = getline(&text, &cap, f)) > 0; line++) {
        if (strspn(text, " \t\r\n") == (size_t)n) continue;
        char what[300];
        snprintf(what, sizeof(what), "%s line %d", path, line);
        JsonValue v;
        json_parse(text, (size_t)n, what, &v);
        const JsonValue* k = json_get(&v, "kernel");
        if (!k || k->type != JSON_STRING) fatal("%s: no string \"kernel\"", what);
        each(m, &v, path, line);
        json_free(&v);
    }
    free(text);
    fclose(f);
}

static void profile_line(CostMeasurements* m, const JsonValue* v, const char* path, int line) {
    if (other_instance(m, json_get(v, "kernel")->string)) return;
    CostMeasured* x = measured_entry(m, json_get(v, "kernel")->string);
    x->profiled = 1;
    x->sectors = json_number_of(v, "global_load_sectors", path, line) + json_number_of(v, "global_store_sectors", path, line);
    x->ideal_sectors = json_number_of(v, "global_load_ideal_sectors", path, line) +
                       json_number_of(v, "global_store_ideal_sectors", path, line);
    x->wavefronts = json_number_of(v, "shared_load_wavefronts", path, line) +
                    json_number_of(v, "shared_store_wavefronts", path, line);
    x->wmma_flops = json_number_of(v, "wmma_flops", path, line);
}

// The BF16 rows (the trainer's default precision); blocks_per_sm is null where the launch's
// block is not known.
static void occupancy_line(CostMeasurements* m, const JsonValue* v, const char* path, int line) {
    const JsonValue* p = json_get(v, "precision");
    if (!p || p->type != JSON_STRING) fatal("%s:%d: no string \"precision\"", path, line);
    const JsonValue* b = json_get(v, "blocks_per_sm");
    if (strcmp(p->string, "BF16") != 0 || !b || b->type != JSON_NUMBER) return;
    if (other_instance(m, json_get(v, "kernel")->string)) return;
    measured_entry(m, json_get(v, "kernel")->string)->blocks_per_sm = (int)b->number;
}

static int parse_int(const char* flag, const char* v, int lo, int hi) {
    char* end = NULL;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < lo || x > hi) fatal("%s %s: expected an integer in %d..%d", flag, v, lo, hi);
    return (int)x;
}

static double parse_double(const char* flag, const char* v, double lo, double hi) {
    char* end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || !(x >= lo && x <= hi)) fatal("%s %s: expected a number in %g..%g", flag, v, lo, hi);
    return x;
}

static const char* model_descriptor(const char* m) {
    if (strcmp(m, "124M") == 0) return "d12";
    if (strcmp(m, "350M") == 0) return "d24";
    if (strcmp(m, "774M") == 0) return "d36";
    if (strcmp(m, "1558M") == 0) return "d48";
    return m;
}

static void parse_options(int argc, char** argv, Options* o) {
    memset(o, 0, sizeof(*o));
    o->model = "d12";
    o->B = 16;
    o->T = 1024;
    o->max_seq = 1024;
    o->vocab = 50257;
    o->kernels.attention = ATTENTION_FLASH;
    o->kernels.fused = 1;
    o->kernels.recompute_gelu = 1;
    o->dp = 1;
    o->zero_stage = 1;
    o->grad_bytes = 4;
    o->bucket_size = -1;
    o->gpu = -1;
    o->eff = (CostEfficiency){{0.7, 0.35, 0.6}, 0.8, 2.0, 1};
    o->nvlink_gbs = 370.0;
    o->ib_gbs = 50.0;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(USAGE, stdout);
            exit(0);
        }
        if (strcmp(a, "--json") == 0) { o->json = 1; continue; }
        if (strcmp(a, "--brief") == 0) { o->brief = 1; continue; }
        if (strcmp(a, "--muon-ns-bf16") == 0) { o->muon_ns_bf16 = 1; continue; }
        if (a[0] != '-') fatal("unexpected argument '%s' (gpt2_cost -h lists the options)", a);
        if (i + 1 >= argc) fatal("%s needs a value (gpt2_cost -h lists the options)", a);
        const char* v = argv[++i];
        if (strcmp(a, "--model") == 0) o->model = v;
        else if (strcmp(a, "-b") == 0) o->B = parse_int(a, v, 1, 1 << 20);
        else if (strcmp(a, "-t") == 0) o->T = parse_int(a, v, 1, 1 << 20);
        else if (strcmp(a, "--max-seq") == 0) o->max_seq = parse_int(a, v, 1, 1 << 20);
        else if (strcmp(a, "--vocab") == 0) o->vocab = parse_int(a, v, 1, 1 << 24);
        else if (strcmp(a, "--dp") == 0) o->dp = parse_int(a, v, 1, 1 << 20);
        else if (strcmp(a, "-z") == 0) o->zero_stage = parse_int(a, v, 0, 1);
        else if (strcmp(a, "--fused-kernels") == 0) o->kernels.fused = parse_int(a, v, 0, 1);
        else if (strcmp(a, "-r") == 0) o->kernels.recompute_gelu = parse_int(a, v, 0, 1);
        else if (strcmp(a, "--gemm-efficiency") == 0) o->eff.tensor[COST_EFF_GEMM] = parse_double(a, v, 0.01, 1);
        else if (strcmp(a, "--flash-efficiency") == 0) o->eff.tensor[COST_EFF_FLASH] = parse_double(a, v, 0.01, 1);
        else if (strcmp(a, "--cudnn-efficiency") == 0) o->eff.tensor[COST_EFF_CUDNN] = parse_double(a, v, 0.01, 1);
        else if (strcmp(a, "--bandwidth-efficiency") == 0) o->eff.bandwidth = parse_double(a, v, 0.01, 1);
        else if (strcmp(a, "--launch-us") == 0) o->eff.launch_us = parse_double(a, v, 0, 1e6);
        else if (strcmp(a, "--nvlink-gbs") == 0) o->nvlink_gbs = parse_double(a, v, 1e-6, 1e6);
        else if (strcmp(a, "--ib-gbs") == 0) o->ib_gbs = parse_double(a, v, 1e-6, 1e6);
        else if (strcmp(a, "--ring-latency-us") == 0) o->ring_latency_us = parse_double(a, v, 0, 1e6);
        else if (strcmp(a, "--profile") == 0) o->profile = v;
        else if (strcmp(a, "--optimizer") == 0) {
            if (strcmp(v, "adamw") != 0 && strcmp(v, "muon") != 0) fatal("--optimizer expects adamw or muon, got '%s'", v);
            o->muon = strcmp(v, "muon") == 0;
        }
        else if (strcmp(a, "--occupancy") == 0) o->occupancy = v;
        else if (strcmp(a, "--path") == 0) {
            if (strcmp(v, "naive") == 0) o->kernels = (GPT2Kernels){ATTENTION_NAIVE, 0, 0};
            else if (strcmp(v, "new") == 0) o->kernels = (GPT2Kernels){ATTENTION_FLASH, 1, 1};
            else fatal("--path %s: expected naive or new", v);
        } else if (strcmp(a, "--attention") == 0) {
            if (strcmp(v, "flash") == 0) o->kernels.attention = ATTENTION_FLASH;
            else if (strcmp(v, "naive") == 0) o->kernels.attention = ATTENTION_NAIVE;
            else if (strcmp(v, "cudnn") == 0) o->kernels.attention = ATTENTION_CUDNN;
            else fatal("--attention %s: expected flash, naive or cudnn", v);
        } else if (strcmp(a, "--grad-dtype") == 0) {
            if (strcmp(v, "fp32") == 0) o->grad_bytes = 4;
            else if (strcmp(v, "bf16") == 0) o->grad_bytes = 2;
            else fatal("--grad-dtype %s: expected fp32 or bf16", v);
        } else if (strcmp(a, "--bucket-size") == 0) {
            char err[256];
            if (zero1_parse_bucket_size(a, v, &o->bucket_size, err, sizeof(err)) != 0) fatal("%s", err);
        } else if (strcmp(a, "--gpu") == 0) {
            if (strcmp(v, "h100") == 0 || strcmp(v, "H100") == 0) o->gpu = 0;
            else if (strcmp(v, "h200") == 0 || strcmp(v, "H200") == 0) o->gpu = 1;
            else fatal("--gpu %s: expected h100 or h200", v);
        } else {
            fatal("unknown option %s (gpt2_cost -h lists the options)", a);
        }
    }
    if (o->json && o->brief) fatal("--json and --brief exclude each other");
    if (o->muon_ns_bf16 && !o->muon) fatal("--muon-ns-bf16 prices Newton-Schulz in bf16: add --optimizer muon");
    int rc = gpt2_config_from_descriptor(model_descriptor(o->model), o->vocab, o->max_seq, &o->cfg);
    if (rc != 0) {
        fatal("--model %s: expected dN (N in 1..%d), 124M, 350M, 774M or 1558M", o->model, GPT2_MAX_DESCRIPTOR_DEPTH);
    }
    if (o->T > o->max_seq) fatal("-t %d exceeds the model's maximum sequence length %d (--max-seq)", o->T, o->max_seq);
    o->measured.instance = o->cfg.channels / o->cfg.num_heads <= COST_FLASH_HS_SMALL ? COST_FLASH_HS_SMALL : 128;
    if (o->profile) read_json_lines(o->profile, &o->measured, profile_line);
    if (o->occupancy) read_json_lines(o->occupancy, &o->measured, occupancy_line);
}

static CostSetup setup_for(const Options* o, int dp, double opt_numel) {
    CostSetup s;
    memset(&s, 0, sizeof(s));
    s.cfg = o->cfg;
    s.B = o->B;
    s.T = o->T;
    s.kernels = o->kernels;
    s.act_bytes = 2;
    s.zero_stage = o->zero_stage;
    s.dp = dp;
    s.opt_numel = opt_numel;
    s.measured = o->profile || o->occupancy ? &o->measured : NULL;
    return s;
}

// ---------------------------------------------------------------------------- communication

typedef struct {
    int dp, buckets;
    double numel;             // the padded buffer (elements)
    double rs_s, ag_s, ar_s;  // whole-step times: ZeRO-1's reduce-scatter and all-gather, replicated all-reduce
    double exposed_rs_s[COST_NUM_GPUS], exposed_ag_s[COST_NUM_GPUS];
    double step_s[COST_NUM_GPUS], step_replicated_s[COST_NUM_GPUS];
} CommRow;

static Zero1Layout build_layout(const Options* o, int dp) {
    int n = gpt2_num_tensors(&o->cfg);
    size_t* numels = (size_t*)mallocCheck((size_t)n * sizeof(size_t));
    for (int i = 0; i < n; i++) numels[i] = gpt2_tensor_numel(&o->cfg, i);
    Zero1Layout L;
    char err[256];
    if (zero1_layout_build(&L, numels, n, dp, o->bucket_size, 0, -1, err, sizeof(err)) != 0) {
        fatal("zero1 layout at DP=%d: %s", dp, err);
    }
    free(numels);
    return L;
}

// Exposed reduce-scatter: buckets fire when their gradients are final, one at a time.
static double exposed_reduce_scatter(const Options* o, const Zero1Layout* L, const double* rs_bucket,
                                     const double* bwd_done_after, double bwd_total) {
    int nb = L->num_buckets;
    double comm_free = 0;
    // Fire order: by the time the backward reaches the bucket's lowest block (bucket 0,
    // the end of the model, first), ties in bucket order.
    int* order = (int*)mallocCheck((size_t)nb * sizeof(int));
    double* ready = (double*)mallocCheck((size_t)nb * sizeof(double));
    for (int b = 0; b < nb; b++) {
        int final_after, needed_by;
        zero1_bucket_timing(&o->cfg, 0, &L->buckets[b], &final_after, &needed_by);
        ready[b] = bwd_done_after[final_after + 1];
        order[b] = b;
    }
    for (int i = 1; i < nb; i++) {  // insertion sort, stable
        int x = order[i], j = i;
        while (j > 0 && ready[order[j - 1]] > ready[x]) { order[j] = order[j - 1]; j--; }
        order[j] = x;
    }
    for (int i = 0; i < nb; i++) {
        int b = order[i];
        double start = ready[b] > comm_free ? ready[b] : comm_free;
        comm_free = start + rs_bucket[b];
    }
    free(order);
    free(ready);
    return comm_free > bwd_total ? comm_free - bwd_total : 0;
}

// Exposed all-gather: how much later the forward ends than without waiting for params.
// t = 0 at the start of the AdamW updates; adam_bucket[b]: bucket b's update time; the
// updates run from the last bucket down (the order the forward reads them).
static double exposed_all_gather(const Options* o, const Zero1Layout* L, const double* ag_bucket,
                                 const double* adam_bucket, const double* fwd_block, double fwd_total) {
    int nb = L->num_buckets, nblocks = o->cfg.num_layers + 2;
    double* launch = (double*)mallocCheck((size_t)nb * sizeof(double));
    double* done = (double*)mallocCheck((size_t)nb * sizeof(double));
    int* needed_by = (int*)mallocCheck((size_t)nb * sizeof(int));
    for (int b = 0; b < nb; b++) {
        int final_after;
        zero1_bucket_timing(&o->cfg, 0, &L->buckets[b], &final_after, &needed_by[b]);
        launch[b] = -1;
        done[b] = -1;
    }
    double now = 0;
    for (int b = nb - 1; b >= 0; b--) now += adam_bucket[b];
    double comm_free = 0, fwd_start = now;
    launch[nb - 1] = adam_bucket[nb - 1];
    for (int blk = 0; blk < nblocks; blk++) {  // blocks -1..L
        for (int b = nb - 1; b >= 0; b--) {
            if (needed_by[b] != blk - 1 || done[b] >= 0) continue;
            if (launch[b] < 0) launch[b] = now;
            if (b > 0 && launch[b - 1] < 0) launch[b - 1] = now;  // the next bucket goes out behind it
            // serial on the communication stream, in the order the gathers were launched
            for (int q = nb - 1; q >= b; q--) {
                if (launch[q] < 0 || done[q] >= 0) continue;
                double start = launch[q] > comm_free ? launch[q] : comm_free;
                done[q] = comm_free = start + ag_bucket[q];
            }
            if (done[b] > now) now = done[b];
        }
        now += fwd_block[blk];
    }
    free(launch);
    free(done);
    free(needed_by);
    double exposed = now - fwd_start - fwd_total;
    return exposed > 0 ? exposed : 0;
}

static CommRow comm_row(const Options* o, int dp, double busbw_gbs) {
    CommRow r;
    memset(&r, 0, sizeof(r));
    Zero1Layout L = build_layout(o, dp);
    r.dp = dp;
    r.buckets = L.num_buckets;
    r.numel = (double)L.numel;
    Zero1Ledger g = zero1_ledger_compute(L.numel, dp, 2, o->grad_bytes);
    double bw = busbw_gbs * 1e9, lat = o->ring_latency_us * 1e-6;
    r.rs_s = (double)g.sent_reduce_scatter / bw + L.num_buckets * (dp - 1) * lat;
    r.ag_s = (double)g.sent_all_gather / bw + L.num_buckets * (dp - 1) * lat;
    r.ar_s = (double)g.sent_all_reduce / bw + 2 * (dp - 1) * lat;
    int nb = L.num_buckets, nblocks = o->cfg.num_layers + 2;
    double* rs_bucket = (double*)mallocCheck((size_t)nb * sizeof(double));
    double* ag_bucket = (double*)mallocCheck((size_t)nb * sizeof(double));
    double* adam_bucket = (double*)mallocCheck((size_t)nb * sizeof(double));
    double* fwd_block = (double*)mallocCheck((size_t)nblocks * sizeof(double));
    double* bwd_done_after = (double*)mallocCheck((size_t)(nblocks + 1) * sizeof(double));
    for (int b = 0; b < nb; b++) {
        double share = (double)(L.buckets[b].end - L.buckets[b].start) / r.numel;
        rs_bucket[b] = (double)g.sent_reduce_scatter / bw * share + (dp - 1) * lat;
        ag_bucket[b] = (double)g.sent_all_gather / bw * share + (dp - 1) * lat;
    }
    for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
        const CostGPU* gpu = &COST_GPUS[gi];
        CostList list;
        CostSetup s = setup_for(o, dp, r.numel);
        cost_model_kernels(&s, &list);
        CostTotals fwd, bwd, opt, all;
        cost_totals(&s, &list, COST_FWD, gpu, &o->eff, &fwd);
        cost_totals(&s, &list, COST_BWD, gpu, &o->eff, &bwd);
        cost_totals(&s, &list, COST_OPT, gpu, &o->eff, &opt);
        cost_totals(&s, &list, -1, gpu, &o->eff, &all);
        // bwd_done_after[block + 1]: backward time elapsed once block's backward is done
        double t = 0;
        for (int blk = o->cfg.num_layers; blk >= -1; blk--) {
            t += cost_block_time(&s, &list, COST_BWD, blk, gpu, &o->eff);
            bwd_done_after[blk + 1] = t;
        }
        for (int blk = -1; blk <= o->cfg.num_layers; blk++) {
            fwd_block[blk + 1] = cost_block_time(&s, &list, COST_FWD, blk, gpu, &o->eff);
        }
        // AdamW's share of the optimizer time, per bucket (by owned elements)
        for (int b = 0; b < nb; b++) {
            adam_bucket[b] = opt.achievable_s * (double)(L.buckets[b].end - L.buckets[b].start) / r.numel;
        }
        r.exposed_rs_s[gi] = dp > 1 ? exposed_reduce_scatter(o, &L, rs_bucket, bwd_done_after, bwd.achievable_s) : 0;
        r.exposed_ag_s[gi] =
            dp > 1 ? exposed_all_gather(o, &L, ag_bucket, adam_bucket, fwd_block, fwd.achievable_s) : 0;
        r.step_s[gi] = all.achievable_s + r.exposed_rs_s[gi] + r.exposed_ag_s[gi];
        CostSetup rep = setup_for(o, dp, (double)gpt2_num_parameters(&o->cfg));
        rep.zero_stage = 0;
        CostList rep_list;
        cost_model_kernels(&rep, &rep_list);
        CostTotals rep_all;
        cost_totals(&rep, &rep_list, -1, gpu, &o->eff, &rep_all);
        r.step_replicated_s[gi] = rep_all.achievable_s + (dp > 1 ? r.ar_s : 0);
    }
    free(rs_bucket);
    free(ag_bucket);
    free(adam_bucket);
    free(fwd_block);
    free(bwd_done_after);
    zero1_layout_free(&L);
    return r;
}

// ---------------------------------------------------------------------------- output

static const char* PHASE_NAMES[] = {"fwd", "bwd", "opt"};

static double tokens(const Options* o) { return (double)o->B * o->T; }

static double mfu(const Options* o, double step_s, const CostGPU* g) {
    return tokens(o) * cost_model_flops_per_token(&o->cfg, o->T) / step_s / (g->tensor_core_tflops * 1e12);
}

static const char* path_name(const GPT2Kernels* k) {
    if (k->attention == ATTENTION_NAIVE && !k->fused && !k->recompute_gelu) return "naive";
    if (k->attention == ATTENTION_FLASH && k->fused && k->recompute_gelu) return "new";
    return "mixed";
}

static int gpu_selected(const Options* o, int gi) { return o->gpu < 0 || o->gpu == gi; }

// The single-GPU (or --dp) step: the optimizer's share follows --dp and -z.
static void step_setup(const Options* o, CostSetup* s, CostList* list) {
    double numel = (double)gpt2_num_parameters(&o->cfg);
    if (o->zero_stage == 1 && o->dp > 1) {
        Zero1Layout L = build_layout(o, o->dp);
        numel = (double)L.numel;
        zero1_layout_free(&L);
    }
    *s = setup_for(o, o->dp, numel);
    cost_model_kernels(s, list);
}

static void print_brief(const Options* o) {
    CostSetup s;
    CostList list;
    step_setup(o, &s, &list);
    for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
        if (!gpu_selected(o, gi)) continue;
        const CostGPU* g = &COST_GPUS[gi];
        CostTotals t;
        cost_totals(&s, &list, -1, g, &o->eff, &t);
        printf("predicted %s path=%s roofline_ms=%.2f roofline_tok_s=%.0f roofline_mfu=%.4f achievable_ms=%.2f "
               "achievable_tok_s=%.0f achievable_mfu=%.4f\n",
               g->name, path_name(&o->kernels), t.roofline_s * 1e3, tokens(o) / t.roofline_s, mfu(o, t.roofline_s, g),
               t.achievable_s * 1e3, tokens(o) / t.achievable_s, mfu(o, t.achievable_s, g));
    }
}

// Which inputs of the achievable time were measured, and for which kernels (the rest assumed).
static void print_measured_inputs(const Options* o) {
    if (!o->profile && !o->occupancy) {
        printf("measured inputs: none (the efficiencies below are all assumed; --profile, --occupancy)\n");
        return;
    }
    CostSetup s;
    CostList list;
    step_setup(o, &s, &list);
    int prof = 0, comp = 0, shared = 0;
    for (int i = 0; i < list.n; i++) {
        prof += (list.k[i].measured & COST_MEASURED_PROFILE) != 0;
        comp += (list.k[i].measured & COST_MEASURED_COMPILER) != 0;
        shared += list.k[i].shared_wavefronts > 0;
    }
    if (o->profile) {
        printf("measured: %s (the CPU layer's profiler): whole-sector bytes of %d rows, shared-memory wavefronts of %d\n",
               o->profile, prof, shared);
    }
    if (o->occupancy) printf("measured: %s (the real compiler): blocks per SM of %d rows\n", o->occupancy, comp);
    printf("assumed: the fractions of peak below, and everything of the rows without a mark\n");
}

// ---------------------------------------------------------------------------- Muon

// Newton-Schulz per step with --optimizer muon: the FLOPs over all matrices, and those of the
// rank that owns the most (its layer-wise shards at DP dp, whole matrices), which sets the time.
typedef struct {
    double total_flops, busiest_flops;
    int busiest_rank;
} MuonCost;

static MuonCost muon_cost(const Options* o, int dp) {
    const GPT2Config* c = &o->cfg;
    int n = gpt2_num_tensors(c);
    size_t* numels = (size_t*)mallocCheck((size_t)n * sizeof(size_t));
    int* is_muon = (int*)callocCheck(n, sizeof(int));
    double* rank_flops = (double*)callocCheck(dp, sizeof(double));
    for (int i = 0; i < n; i++) {
        numels[i] = gpt2_tensor_numel(c, i);
        is_muon[i] = gpt2_tensor_is_hidden_matrix(c, i);
    }
    Zero1Layout L;
    char err[256];
    long long bucket_size = zero1_ddp_bucket_size(o->bucket_size, dp, 1);
    if (zero1_run_layout_build(&L, numels, is_muon, n, dp, bucket_size, 0, -1, err, sizeof(err)) != 0) {
        fatal("zero1 layout at DP=%d: %s", dp, err);
    }
    MuonCost m = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        if (!is_muon[i]) continue;
        int rows, cols, parts = gpt2_matrix_is_qkv(c, i) ? 3 : 1;  // Q, K, V apart (the default split)
        gpt2_matrix_shape(c, i, &rows, &cols);
        double f = parts * muon_ns_flops(rows / parts, cols, 5);
        const Zero1Bucket* bk = &L.buckets[L.params[i].bucket];
        size_t shard = (bk->end - bk->start) / (size_t)dp;
        int owner = o->zero_stage == 1 ? (int)((L.params[i].start - bk->start) / shard) : 0;
        rank_flops[owner] += f;
        m.total_flops += f;
    }
    for (int r = 0; r < dp; r++) {
        if (rank_flops[r] > m.busiest_flops) {
            m.busiest_flops = rank_flops[r];
            m.busiest_rank = r;
        }
    }
    zero1_layout_free(&L);
    free(rank_flops);
    free(is_muon);
    free(numels);
    return m;
}

// Seconds of Newton-Schulz on g: fp32 GEMMs on CUDA cores (no TF32, as llmc/muon.cuh runs
// them), or bf16 on tensor cores, at the GEMMs' achievable fraction of peak.
static double muon_seconds(const Options* o, double flops, const CostGPU* g) {
    double peak = o->muon_ns_bf16 ? g->tensor_core_tflops : g->fp32_tflops;
    return flops / (peak * 1e12 * o->eff.tensor[COST_EFF_GEMM]);
}

static void print_muon(const Options* o) {
    MuonCost m = muon_cost(o, o->dp);
    printf("\nMuon (--optimizer muon): Newton-Schulz, 5 steps, Q, K, V apart, %s: %.1f GFLOP per step over all "
           "matrices;\n  the busiest rank (%d of DP=%d, -z %d) owns %.1f GFLOP of them\n",
           o->muon_ns_bf16 ? "bf16 on tensor cores (--muon-ns-bf16)" : "fp32 on CUDA cores", m.total_flops / 1e9,
           m.busiest_rank, o->dp, o->zero_stage, m.busiest_flops / 1e9);
    CostSetup s;
    CostList list;
    step_setup(o, &s, &list);
    for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
        if (!gpu_selected(o, gi)) continue;
        CostTotals t;
        cost_totals(&s, &list, -1, &COST_GPUS[gi], &o->eff, &t);
        double ns = muon_seconds(o, m.busiest_flops, &COST_GPUS[gi]);
        printf("  %s: %.2f ms at %.0f%% of peak = %.1f%% of the achievable compute step (%.2f ms) with it added\n",
               COST_GPUS[gi].name, ns * 1e3, 100 * o->eff.tensor[COST_EFF_GEMM], 100 * ns / (t.achievable_s + ns),
               (t.achievable_s + ns) * 1e3);
    }
}

static void print_text(const Options* o) {
    const GPT2Config* c = &o->cfg;
    CostSetup s;
    CostList list;
    step_setup(o, &s, &list);
    size_t N = gpt2_num_parameters(c);
    double fpt = cost_model_flops_per_token(c, o->T);
    printf("gpt2_cost: GPT-2 %s (L=%d C=%d NH=%d Vp=%d, N=%zu parameters), B=%d T=%d, DP=%d, -z %d, bf16 activations\n",
           model_descriptor(o->model), c->num_layers, c->channels, c->num_heads, c->padded_vocab_size, N, o->B, o->T,
           o->dp, o->zero_stage);
    printf("path %s: --attention %s --fused-kernels %d -r %d\n", path_name(&o->kernels),
           attention_kind_name(o->kernels.attention), o->kernels.fused, o->kernels.recompute_gelu);
    printf("PREDICTED (a FLOP and byte count, dev/cost/cost_model.h; no GPU has measured it yet)\n");
    print_measured_inputs(o);
    printf("\nper kernel, one step (xN: instances per step; GFLOP and GB per step; us: roofline time per step, and\n"
           "achievable on the H100; in: measured inputs, p profile, c compiler)\n");
    printf("%-5s %-42s %4s %10s %9s %10s %10s %6s %9s %-2s\n", "phase", "kernel", "xN", "GFLOP", "GB", "H100 us",
           "H200 us", "bound", "achv us", "in");
    for (int i = 0; i < list.n; i++) {
        const CostKernel* k = &list.k[i];
        double m = cost_kernel_count(&s, k);
        double flops = k->tc_flops + k->cc_flops;
        // bound on H100: which of the two roofline terms is larger
        const CostGPU* h = &COST_GPUS[0];
        double ct = k->tc_flops / (h->tensor_core_tflops * 1e12) + k->cc_flops / (h->fp32_tflops * 1e12);
        double mt = k->bytes / (h->hbm_tbs * 1e12);
        printf("%-5s %-42s %4.0f %10.2f %9.3f %10.1f %10.1f %6s %9.1f %c%c\n", PHASE_NAMES[k->phase], k->name, m,
               m * flops / 1e9, m * k->bytes / 1e9, m * cost_kernel_roofline(k, &COST_GPUS[0]) * 1e6,
               m * cost_kernel_roofline(k, &COST_GPUS[1]) * 1e6, ct > mt ? "FLOPs" : "bytes",
               m * cost_kernel_time(k, h, &o->eff) * 1e6, k->measured & COST_MEASURED_PROFILE ? 'p' : ' ',
               k->measured & COST_MEASURED_COMPILER ? 'c' : ' ');
    }
    printf("\nper step%s:\n", o->dp > 1 ? " (compute only; communication below)" : "");
    for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
        if (!gpu_selected(o, gi)) continue;
        const CostGPU* g = &COST_GPUS[gi];
        CostTotals ph[3], t;
        for (int p = 0; p < 3; p++) cost_totals(&s, &list, p, g, &o->eff, &ph[p]);
        cost_totals(&s, &list, -1, g, &o->eff, &t);
        printf("  %s (%.0f TFLOP/s bf16, %.0f TFLOP/s fp32, %.2f TB/s): %.1f GFLOP on tensor cores + %.1f GFLOP fp32, "
               "%.2f GB, %.0f launches\n",
               g->name, g->tensor_core_tflops, g->fp32_tflops, g->hbm_tbs, t.tc_flops / 1e9, t.cc_flops / 1e9,
               t.bytes / 1e9, t.launches);
        printf("    roofline    %8.2f ms (fwd %.2f, bwd %.2f, opt %.2f)  %9.0f tok/s  MFU %5.1f%%  HFU %5.1f%%\n",
               t.roofline_s * 1e3, ph[0].roofline_s * 1e3, ph[1].roofline_s * 1e3, ph[2].roofline_s * 1e3,
               tokens(o) / t.roofline_s, 100 * mfu(o, t.roofline_s, g),
               100 * t.tc_flops / t.roofline_s / (g->tensor_core_tflops * 1e12));
        printf("    achievable  %8.2f ms (fwd %.2f, bwd %.2f, opt %.2f)  %9.0f tok/s  MFU %5.1f%%\n",
               t.achievable_s * 1e3, ph[0].achievable_s * 1e3, ph[1].achievable_s * 1e3, ph[2].achievable_s * 1e3,
               tokens(o) / t.achievable_s, 100 * mfu(o, t.achievable_s, g));
    }
    printf("  model FLOPs per token 6N + 6LCT = %.4e (MFU = tok/s x that / 989 TFLOP/s; HFU counts the FLOPs the\n"
           "  kernels execute on tensor cores, recomputation and the full naive T x T square included)\n"
           "  achievable: tensor cores at %.0f%% of peak in GEMMs, %.0f%% in our flash tiles, %.0f%% in cuDNN;\n"
           "  %.0f%% of bandwidth; %.1f us per launch. For scale: llm.c measures about 38%% MFU at 124M on H100s\n",
           fpt, 100 * o->eff.tensor[COST_EFF_GEMM], 100 * o->eff.tensor[COST_EFF_FLASH],
           100 * o->eff.tensor[COST_EFF_CUDNN], 100 * o->eff.bandwidth, o->eff.launch_us);

    printf("\ncommunication per step: ZeRO-1's reduce-scatter (%s grads) and all-gather (bf16 params), ring,\n"
           "bus bandwidth NVLink %.0f GB/s, InfiniBand %.0f GB/s; exposed = not hidden by the backward / the next\n"
           "forward (achievable compute); repl. = -z 0's all-reduce after the backward, all exposed. Step ms and\n"
           "MFU include the exposed time. Ring latency %.1f us per step.\n",
           o->grad_bytes == 2 ? "bf16" : "fp32", o->nvlink_gbs, o->ib_gbs, o->ring_latency_us);
    printf("%5s %-6s %3s %8s %8s", "DP", "link", "bkt", "RS ms", "AG ms");
    for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
        printf(" | %s %8s %8s %6s %9s", COST_GPUS[gi].name, "exposed", "step ms", "MFU", "repl. ms");
    }
    printf("\n");
    for (int dp = 8; dp <= 1024; dp *= 2) {
        for (int link = 0; link < 2; link++) {
            CommRow r = comm_row(o, dp, link == 0 ? o->nvlink_gbs : o->ib_gbs);
            printf("%5d %-6s %3d %8.2f %8.2f", dp, link == 0 ? "NVLink" : "IB", r.buckets, r.rs_s * 1e3, r.ag_s * 1e3);
            for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
                printf(" |      %8.2f %8.2f %5.1f%% %9.2f", (r.exposed_rs_s[gi] + r.exposed_ag_s[gi]) * 1e3,
                       r.step_s[gi] * 1e3, 100 * mfu(o, r.step_s[gi], &COST_GPUS[gi]), r.step_replicated_s[gi] * 1e3);
            }
            printf("\n");
        }
    }
}

static void print_json(const Options* o) {
    const GPT2Config* c = &o->cfg;
    CostSetup s;
    CostList list;
    step_setup(o, &s, &list);
    printf("{\"model\":\"%s\",\"L\":%d,\"C\":%d,\"NH\":%d,\"V\":%d,\"Vp\":%d,\"maxT\":%d,\"N\":%zu,\"B\":%d,\"T\":%d,"
           "\"dp\":%d,\"zero_stage\":%d,\"grad_bytes\":%d,\"attention\":\"%s\",\"fused\":%d,\"recompute\":%d,"
           "\"opt_numel\":%.0f,\"flash_tiles\":[%d,%d,%d],\"model_flops_per_token\":%.17g,",
           model_descriptor(o->model), c->num_layers, c->channels, c->num_heads, c->vocab_size, c->padded_vocab_size,
           c->max_seq_len, gpt2_num_parameters(c), o->B, o->T, o->dp, o->zero_stage, o->grad_bytes,
           attention_kind_name(o->kernels.attention), o->kernels.fused, o->kernels.recompute_gelu, s.opt_numel,
           COST_FLASH_FWD_ROWS, COST_FLASH_FWD_COLS, COST_FLASH_BWD_TILE, cost_model_flops_per_token(c, o->T));
    printf("\"gemm_efficiency\":%g,\"flash_efficiency\":%g,\"cudnn_efficiency\":%g,\"bandwidth_efficiency\":%g,"
           "\"launch_us\":%g,\"kernels\":[",
           o->eff.tensor[COST_EFF_GEMM], o->eff.tensor[COST_EFF_FLASH], o->eff.tensor[COST_EFF_CUDNN], o->eff.bandwidth,
           o->eff.launch_us);
    for (int i = 0; i < list.n; i++) {
        const CostKernel* k = &list.k[i];
        printf("%s{\"name\":\"%s\",\"phase\":\"%s\",\"block\":%d,\"per_layer\":%d,\"count\":%.0f,\"tc_flops\":%.17g,"
               "\"cc_flops\":%.17g,\"bytes\":%.17g,\"launches\":%.0f,\"eff_class\":%d,\"covers\":\"%s\",\"grid\":%.0f,"
               "\"sector_factor\":%.17g,\"shared_wavefronts\":%.17g,\"blocks_per_sm\":%d,\"measured\":%u,"
               "\"roofline_s\":{",
               i ? "," : "", k->name, PHASE_NAMES[k->phase], k->block, k->per_layer, cost_kernel_count(&s, k),
               k->tc_flops, k->cc_flops, k->bytes, k->launches, k->eff_class, k->covers, k->grid, k->sector_factor,
               k->shared_wavefronts, k->blocks_per_sm, k->measured);
        for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
            printf("%s\"%s\":%.17g", gi ? "," : "", COST_GPUS[gi].name, cost_kernel_roofline(k, &COST_GPUS[gi]));
        }
        printf("},\"achievable_s\":{");
        for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
            printf("%s\"%s\":%.17g", gi ? "," : "", COST_GPUS[gi].name, cost_kernel_time(k, &COST_GPUS[gi], &o->eff));
        }
        printf("}}");
    }
    printf("],\"step\":{");
    for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
        const CostGPU* g = &COST_GPUS[gi];
        CostTotals t;
        cost_totals(&s, &list, -1, g, &o->eff, &t);
        printf("%s\"%s\":{\"tensor_core_tflops\":%g,\"fp32_tflops\":%g,\"hbm_tbs\":%g,\"sms\":%d,\"tc_flops\":%.17g,"
               "\"cc_flops\":%.17g,\"bytes\":%.17g,\"launches\":%.0f,\"roofline_s\":%.17g,\"achievable_s\":%.17g,"
               "\"roofline_tok_s\":%.17g,\"achievable_tok_s\":%.17g,\"roofline_mfu\":%.17g,\"achievable_mfu\":%.17g}",
               gi ? "," : "", g->name, g->tensor_core_tflops, g->fp32_tflops, g->hbm_tbs, g->sms, t.tc_flops, t.cc_flops,
               t.bytes, t.launches, t.roofline_s, t.achievable_s, tokens(o) / t.roofline_s,
               tokens(o) / t.achievable_s, mfu(o, t.roofline_s, g), mfu(o, t.achievable_s, g));
    }
    printf("},\"comm\":[");
    int first = 1;
    for (int dp = 8; dp <= 1024; dp *= 2) {
        for (int link = 0; link < 2; link++) {
            double bw = link == 0 ? o->nvlink_gbs : o->ib_gbs;
            CommRow r = comm_row(o, dp, bw);
            printf("%s{\"dp\":%d,\"link\":\"%s\",\"busbw_gbs\":%g,\"buckets\":%d,\"numel\":%.0f,\"rs_s\":%.17g,"
                   "\"ag_s\":%.17g,\"ar_s\":%.17g",
                   first ? "" : ",", dp, link == 0 ? "nvlink" : "ib", bw, r.buckets, r.numel, r.rs_s, r.ag_s, r.ar_s);
            for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
                printf(",\"%s\":{\"exposed_rs_s\":%.17g,\"exposed_ag_s\":%.17g,\"step_s\":%.17g,"
                       "\"step_replicated_s\":%.17g}",
                       COST_GPUS[gi].name, r.exposed_rs_s[gi], r.exposed_ag_s[gi], r.step_s[gi],
                       r.step_replicated_s[gi]);
            }
            printf("}");
            first = 0;
        }
    }
    printf("]");
    if (o->muon) {
        MuonCost m = muon_cost(o, o->dp);
        printf(",\"muon\":{\"ns_bf16\":%d,\"total_flops\":%.17g,\"busiest_flops\":%.17g,\"busiest_rank\":%d,\"seconds\":{",
               o->muon_ns_bf16, m.total_flops, m.busiest_flops, m.busiest_rank);
        for (int gi = 0; gi < COST_NUM_GPUS; gi++) {
            printf("%s\"%s\":%.17g", gi ? "," : "", COST_GPUS[gi].name, muon_seconds(o, m.busiest_flops, &COST_GPUS[gi]));
        }
        printf("}}");
    }
    printf("}\n");
}

int main(int argc, char** argv) {
    Options o;
    parse_options(argc, argv, &o);
    if (o.brief) print_brief(&o);
    else if (o.json) print_json(&o);
    else print_text(&o);
    if (o.muon && !o.json && !o.brief) print_muon(&o);
    return 0;
}
