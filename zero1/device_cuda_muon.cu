/*
 * zero1/device_cuda_muon.cu: the CUDA device's muon op (see zero1/device_cuda_muon.h).
 *
 * A span list's matrices are grouped by the shape Newton-Schulz sees (rows, cols, and whether
 * it is a third of a split qkvw, so that with every matrix on one rank the groups are the
 * replicated trainer's), in the order they first appear; each group runs llmc/muon.cuh's
 * steps with the grads at span.buffer and the momentum (and master) at span.owned. Span lists
 * are fixed for a run, so a plan is made once per list and found again by its contents.
 * Compiled with the exact flags of zero1/device_cuda.cu (no fast math, no fused multiply-adds).
 */
#include <string.h>

#include "llmc/muon.cuh"
#include "zero1/device_cuda_muon.h"

#define MUON_WORKSPACE_BYTES (32u << 20)  // cuda_libs' size: what Hopper's fastest kernels ask for

// A plan and what it was made for: the spans, their shapes, the settings, where the weights are.
typedef struct MuonListPlan {
    Zero1Span* spans;
    Zero1MatrixShape* shapes;  // of each span
    int count, bf16, weights_at_buffer;
    MuonConfig cfg;
    MuonPlan plan;
    struct MuonListPlan* next;
} MuonListPlan;

struct Zero1CudaMuon {
    MuonBlas blas;
    MuonListPlan* plans;
};

static int muon_plan_matches(const MuonListPlan* p, const Zero1SpanList* spans, const Zero1MatrixShape* shapes,
                             const Zero1MuonStep* step, int weights_at_buffer) {
    if (p->count != spans->count || p->bf16 != step->ns_bf16 || p->weights_at_buffer != weights_at_buffer) return 0;
    if (memcmp(&p->cfg, &step->config, sizeof(MuonConfig)) != 0) return 0;
    if (memcmp(p->spans, spans->host, (size_t)p->count * sizeof(Zero1Span)) != 0) return 0;
    for (int i = 0; i < p->count; i++) {
        if (memcmp(&p->shapes[i], &shapes[spans->host[i].param], sizeof(Zero1MatrixShape)) != 0) return 0;
    }
    return 1;
}

// The list's matrices, grouped; specs[] and their at[] are the caller's to free.
static int muon_group_spans(const Zero1SpanList* spans, const Zero1MatrixShape* shapes, const MuonConfig* cfg,
                            int weights_at_buffer, MuonGroupSpec* specs, int* is_qkv_part) {
    int num_groups = 0;
    for (int i = 0; i < spans->count; i++) {
        const Zero1Span* sp = &spans->host[i];
        Zero1MatrixShape sh = shapes[sp->param];
        if (sh.rows <= 0 || (size_t)sh.rows * (size_t)sh.cols != sp->n) {
            fatal("zero1 cuda: Muon updates whole matrices, and a span of parameter %d holds %zu of its %d x %d "
                  "elements", sp->param, sp->n, sh.rows, sh.cols);
        }
        int parts = sh.qkv && cfg->split_qkv ? 3 : 1, rows = sh.rows / parts;
        int g = 0;
        while (g < num_groups && !(specs[g].rows == rows && specs[g].cols == sh.cols && is_qkv_part[g] == (parts > 1))) g++;
        if (g == num_groups) {
            MuonGroupSpec fresh = {rows, sh.cols, 0, (MuonMatrixAt*)mallocCheck(3 * (size_t)spans->count * sizeof(MuonMatrixAt))};
            specs[g] = fresh;
            is_qkv_part[g] = parts > 1;
            num_groups++;
        }
        float scale = muon_scale_factor(cfg->scale, rows, sh.cols);
        for (int p = 0; p < parts; p++) {
            size_t part = (size_t)p * rows * sh.cols;
            MuonMatrixAt at = {sp->buffer + part, sp->owned + part, (weights_at_buffer ? sp->buffer : sp->owned) + part,
                               scale};
            ((MuonMatrixAt*)specs[g].at)[specs[g].count++] = at;
        }
    }
    return num_groups;
}

static MuonListPlan* muon_plan_for(Zero1CudaMuon* st, const Zero1SpanList* spans, const Zero1MatrixShape* shapes,
                                   const Zero1MuonStep* step, int weights_at_buffer, cudaStream_t stream) {
    for (MuonListPlan* p = st->plans; p; p = p->next) {
        if (muon_plan_matches(p, spans, shapes, step, weights_at_buffer)) return p;
    }
    MuonListPlan* p = (MuonListPlan*)callocCheck(1, sizeof(MuonListPlan));
    p->count = spans->count;
    p->bf16 = step->ns_bf16;
    p->weights_at_buffer = weights_at_buffer;
    p->cfg = step->config;
    p->spans = (Zero1Span*)mallocCheck((size_t)p->count * sizeof(Zero1Span));
    memcpy(p->spans, spans->host, (size_t)p->count * sizeof(Zero1Span));
    p->shapes = (Zero1MatrixShape*)mallocCheck((size_t)p->count * sizeof(Zero1MatrixShape));
    for (int i = 0; i < p->count; i++) p->shapes[i] = shapes[spans->host[i].param];
    MuonGroupSpec* specs = (MuonGroupSpec*)mallocCheck((size_t)p->count * sizeof(MuonGroupSpec));
    int* is_qkv_part = (int*)mallocCheck((size_t)p->count * sizeof(int));
    int num_groups = muon_group_spans(spans, shapes, &step->config, weights_at_buffer, specs, is_qkv_part);
    muon_plan_init(&p->plan, specs, num_groups, &step->config, step->ns_bf16, st->blas, stream);
    for (int g = 0; g < num_groups; g++) free((void*)specs[g].at);
    free(specs);
    free(is_qkv_part);
    p->next = st->plans;
    st->plans = p;
    return p;
}

void zero1_cuda_muon(Zero1CudaMuon** state, cudaStream_t s, const Zero1SpanList* spans, const Zero1MatrixShape* shapes,
                     float* params, float* master, const float* grads, float* momentum, const Zero1MuonStep* step,
                     const float* grad_scale) {
    if (spans->count == 0) return;
    if (*state == NULL) {
        Zero1CudaMuon* st = (Zero1CudaMuon*)callocCheck(1, sizeof(Zero1CudaMuon));
        cublasCheck(cublasLtCreate(&st->blas.lt));
        st->blas.workspace_size = MUON_WORKSPACE_BYTES;
        st->blas.workspace = cudaMallocCheck(st->blas.workspace_size);
        *state = st;
    }
    MuonListPlan* p = muon_plan_for(*state, spans, shapes, step, master == NULL, s);
    AdamWStep lr_wd;  // only lr and weight_decay are read: the params are not written here
    memset(&lr_wd, 0, sizeof(lr_wd));
    lr_wd.lr = step->lr;
    lr_wd.weight_decay = step->weight_decay;
    muon_plan_step(&p->plan, NULL, master ? master : params, grads, momentum, &lr_wd, grad_scale, s);
}

void zero1_cuda_muon_free(Zero1CudaMuon* st) {
    if (st == NULL) return;
    for (MuonListPlan* p = st->plans; p;) {
        MuonListPlan* next = p->next;
        muon_plan_free(&p->plan);
        free(p->spans);
        free(p->shapes);
        free(p);
        p = next;
    }
    cudaCheck(cudaFree(st->blas.workspace));
    cublasCheck(cublasLtDestroy(st->blas.lt));
    free(st);
}
