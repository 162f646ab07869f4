// zero1/device_cpu_muon.c: the CPU device's muon op (zero1/device_ops.h), apart from the other
// ops because Newton-Schulz needs OpenBLAS: the CPU builds link it, the GPU builds (whose
// device_cpu.o has no BLAS to call) leave the op NULL.
#include "llmc/muon_cpu.h"
#include "run/files.h"
#include "zero1/device_ops.h"

void zero1_device_cpu_muon(void* ctx, Zero1Stream st, const Zero1SpanList* spans, const Zero1MatrixShape* shapes,
                           float* params, float* master, const float* grads, float* momentum, const Zero1MuonStep* step,
                           const float* grad_scale) {
    if (step->ns_bf16) fatal("zero1: the CPU device runs Newton-Schulz in fp32 only (--muon-ns-bf16 is the GPU's)");
    if (spans->count == 0) return;
    MuonMatrix* list = (MuonMatrix*)mallocCheck((size_t)spans->count * sizeof(MuonMatrix));
    int max_rows = 1, max_cols = 1;
    for (int i = 0; i < spans->count; i++) {
        const Zero1Span* sp = &spans->host[i];
        Zero1MatrixShape sh = shapes[sp->param];
        if ((size_t)sh.rows * (size_t)sh.cols != sp->n) {
            fatal("zero1: Muon updates whole matrices, and a span of parameter %d holds %zu of its %d x %d elements",
                  sp->param, sp->n, sh.rows, sh.cols);
        }
        MuonMatrix m = {master ? master + sp->owned : params + sp->buffer, grads + sp->buffer, momentum + sp->owned,
                        sh.rows, sh.cols, sh.qkv};
        list[i] = m;
        if (sh.rows > max_rows) max_rows = sh.rows;
        if (sh.cols > max_cols) max_cols = sh.cols;
    }
    float* work = (float*)mallocCheck(muon_matrices_work_floats(max_rows, max_cols) * sizeof(float));
    muon_update_matrices(list, spans->count, step->lr, step->weight_decay, grad_scale[0], &step->config, work,
                         max_rows, max_cols);
    free(work);
    free(list);
}

