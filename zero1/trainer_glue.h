/*
 * zero1/trainer_glue.h: plugs the ZeRO-1 runtime into the CPU trainer's GPT-2.
 *
 * It describes the model to the runtime (sizes, weight decay, two gradient contributions
 * for the tied wte, which forward block first reads each tensor), binds the model's
 * tensor views into the runtime's buffers, and turns the model's hooks into runtime
 * calls: wait for gathers before a block, count finished gradients, poke progress at
 * layer boundaries, and record the layer timeline for --trace.
 * Forward blocks for the runtime: 0 = embeddings, 1..L = transformer blocks,
 * L+1 = final LayerNorm + classifier (which reads wte, already gathered for block 0).
 */
#ifndef ZERO1_TRAINER_GLUE_H
#define ZERO1_TRAINER_GLUE_H

#include <mpi.h>
#include <sys/resource.h>

#include "llmc/cli.h"
#include "llmc/gpt2_cpu.h"
#include "llmc/utils.h"
#include "zero1/comm.h"
#include "zero1/device_ops.h"
#include "zero1/ledger.h"
#include "zero1/runtime.h"
#include "zero1/trace.h"

typedef struct {
    Zero1Runtime* rt;
    Zero1Comm* comm;
    Zero1Tracer* tracer;
    const char* trace_file;
    GPT2* model;
    int rank, world, zero_stage;
    double block_start_us;
} Zero1Glue;

static const char* glue_param_name(void* ctx, int p, char* buf, size_t n) {
    return gpt2_tensor_name((const GPT2Config*)ctx, p, buf, n);
}

static void glue_forward_begin(void* ctx, int block) {
    Zero1Glue* g = (Zero1Glue*)ctx;
    zero1_forward_block(g->rt, block + 1);
    g->block_start_us = zero1_now_us();
}

static void glue_forward_end(void* ctx, int block) {
    Zero1Glue* g = (Zero1Glue*)ctx;
    zero1_trace(g->tracer, TRACE_COMPUTE, g->block_start_us, zero1_now_us(), "forward %d", block);
}

static void glue_backward_begin(void* ctx, int block) {
    Zero1Glue* g = (Zero1Glue*)ctx;
    zero1_poke(g->rt);
    g->block_start_us = zero1_now_us();
}

static void glue_backward_end(void* ctx, int block) {
    Zero1Glue* g = (Zero1Glue*)ctx;
    zero1_trace(g->tracer, TRACE_COMPUTE, g->block_start_us, zero1_now_us(), "backward %d", block);
    zero1_poke(g->rt);
}

static void glue_grad_done(void* ctx, int tensor) { zero1_grad_done(((Zero1Glue*)ctx)->rt, tensor); }

static Zero1Glue* zero1_glue_create(const TrainConfig* cfg, GPT2* model, int rank, int world) {
    Zero1Glue* g = (Zero1Glue*)callocCheck(1, sizeof(Zero1Glue));
    const GPT2Config* c = &model->config;
    int NT = model->num_tensors, L = c->num_layers;
    size_t* numels = (size_t*)mallocCheck(NT * sizeof(size_t));
    int* decays = (int*)mallocCheck(NT * sizeof(int));
    int* contributions = (int*)mallocCheck(NT * sizeof(int));
    int* first_block = (int*)mallocCheck(NT * sizeof(int));
    for (int i = 0; i < NT; i++) {
        numels[i] = gpt2_tensor_numel(c, i);
        decays[i] = gpt2_tensor_decays(c, i);
        contributions[i] = i == gpt2_idx_wte() ? 2 : 1;  // classifier and encoder both write dwte
        first_block[i] = gpt2_tensor_layer(c, i) + 1;
    }
    Zero1ModelSpec spec = {NT, numels, decays, contributions, first_block, L + 2, glue_param_name, (void*)c};
    Zero1Options opt;
    memset(&opt, 0, sizeof(opt));
    opt.zero_stage = cfg->zero_stage;
    opt.bucket_size = cfg->bucket_size;
    opt.pad_busbw = cfg->pad_busbw;
    opt.shared_embedding = -1;
    opt.overlap_grad_reduce = cfg->overlap_grad_reduce;
    opt.overlap_param_gather = cfg->overlap_param_gather;
    opt.check_nan = cfg->check_nan;
    opt.param_dtype = cfg->param_dtype == DTYPE_BF16 ? ZERO1_BF16 : ZERO1_FP32;
    opt.grad_dtype = cfg->grad_dtype == DTYPE_BF16 ? ZERO1_BF16 : ZERO1_FP32;
    opt.beta1 = cfg->beta1;
    opt.beta2 = cfg->beta2;
    opt.eps = cfg->eps;
    opt.weight_decay = cfg->weight_decay;
    opt.grad_clip = cfg->grad_clip;
    g->comm = world > 1 ? zero1_comm_mpi_create() : zero1_comm_single_create();
    g->tracer = cfg->trace_file ? zero1_tracer_create(rank) : NULL;
    g->trace_file = cfg->trace_file;
    char err[256];
    g->rt = zero1_runtime_create(&opt, &spec, g->comm, &zero1_device_cpu, g->tracer, err, sizeof(err));
    if (!g->rt) fatal("zero1: %s", err);
    free(numels);
    free(decays);
    free(contributions);
    free(first_block);
    g->model = model;
    g->rank = rank;
    g->world = world;
    g->zero_stage = cfg->zero_stage;
    size_t* offsets = (size_t*)mallocCheck(NT * sizeof(size_t));
    for (int i = 0; i < NT; i++) offsets[i] = zero1_param_offset(g->rt, i);
    gpt2_bind_buffers(model, zero1_compute_params(g->rt), zero1_grad_buffer(g->rt), offsets);
    free(offsets);
    ModelHooks hooks = {g, glue_forward_begin, glue_forward_end, glue_backward_begin, glue_backward_end,
                        glue_grad_done};
    model->hooks = hooks;
    return g;
}

static void zero1_glue_after_load(Zero1Glue* g) { zero1_after_load(g->rt); }
static void zero1_glue_begin_step(Zero1Glue* g, int step) { zero1_begin_step(g->rt, step); }
static void zero1_glue_begin_micro_step(Zero1Glue* g, int is_last) { zero1_begin_micro_step(g->rt, is_last); }
static void zero1_glue_sync_params(Zero1Glue* g) { zero1_sync_params(g->rt); }

static void zero1_glue_finish_step(Zero1Glue* g, int step, float lr, float* norm, double* blocked_ms) {
    *norm = zero1_finish_step(g->rt, step, lr, blocked_ms);
}

// Rank 0: the bucket table and the per-rank memory ledger of this run.
static void zero1_glue_print_start(Zero1Glue* g, const TrainConfig* cfg) {
    if (g->rank != 0) return;
    const Zero1Layout* lay = zero1_layout(g->rt);
    printf("zero1: %s, DP=%d, %d bucket%s (bucket_size %s%zu), param %s, grad reduce %s, overlap grad %s / param %s\n",
           g->zero_stage == 1 ? "ZeRO-1 sharded optimizer" : "replicated optimizer (bucketed all-reduce)", g->world,
           lay->num_buckets, lay->num_buckets == 1 ? "" : "s", lay->bucket_size ? "" : "none ", lay->bucket_size,
           cfg->param_dtype == DTYPE_BF16 ? "bf16" : "fp32", cfg->grad_dtype == DTYPE_BF16 ? "bf16" : "fp32",
           cfg->overlap_grad_reduce ? "on" : "off", cfg->overlap_param_gather ? "on" : "off");
    printf("zero1: bucket      start        end   unpadded   padding  params\n");
    for (int b = 0; b < lay->num_buckets; b++) {
        const Zero1Bucket* bk = &lay->buckets[b];
        printf("zero1: %6d %10zu %10zu %10zu %9zu  %d..%d\n", b, bk->start, bk->end, bk->numel_unpadded,
               bk->end - bk->start - bk->numel_unpadded, bk->first_param, bk->last_param);
    }
    size_t params = gpt2_num_parameters(&g->model->config);
    printf("zero1: buffer %zu elements for %zu parameters (padding and alignment %.3f%%)\n", lay->numel, params,
           100.0 * (double)(lay->numel - params) / (double)lay->numel);
    Zero1Ledger ledger = zero1_ledger_compute(lay->numel, g->world, cfg->param_dtype == DTYPE_BF16 ? 2 : 4,
                                              cfg->grad_dtype == DTYPE_BF16 ? 2 : 4);
    zero1_ledger_print(stdout, &ledger);
}

// Every rank's measured optimizer state and peak memory, printed by rank 0; the trace files.
static void zero1_glue_print_end(Zero1Glue* g) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double mine[3] = {(double)zero1_state_bytes(g->rt), (double)zero1_owned_numel(g->rt), (double)ru.ru_maxrss * 1024.0};
    double* all = (double*)mallocCheck((size_t)g->world * 3 * sizeof(double));
    MPI_Gather(mine, 3, MPI_DOUBLE, all, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (g->rank == 0) {
        printf("zero1: rank  owned elements  optimizer state bytes  bytes/element  peak RSS MiB\n");
        double owned_total = 0.0;
        for (int r = 0; r < g->world; r++) {
            double* row = all + 3 * r;
            owned_total += row[1];
            printf("zero1: %4d %15.0f %22.0f %14.1f %13.1f\n", r, row[1], row[0], row[1] > 0 ? row[0] / row[1] : 0.0,
                   row[2] / (1024.0 * 1024.0));
        }
        printf("zero1: owned elements over all ranks %.0f (buffer %zu)\n", owned_total,
               g->zero_stage == 1 || g->world == 1 ? zero1_layout(g->rt)->numel : zero1_layout(g->rt)->numel * g->world);
    }
    free(all);
    if (g->tracer) {
        char path[PATH_MAX_LEN];
        const char* f = g->trace_file;
        size_t len = strlen(f);
        if (len > 5 && strcmp(f + len - 5, ".json") == 0) len -= 5;
        path_format(path, sizeof(path), "%.*s.rank%d.json", (int)len, f, g->rank);
        if (zero1_tracer_write(g->tracer, path) != 0) fatal("cannot write trace %s", path);
        if (g->rank == 0) printf("zero1: trace written to %.*s.rank*.json\n", (int)len, f);
    }
}

static void zero1_glue_destroy(Zero1Glue* g) {
    zero1_runtime_destroy(g->rt);
    g->comm->destroy(g->comm);
    zero1_tracer_destroy(g->tracer);
    free(g);
}

#endif
