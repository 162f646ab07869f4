// run/seams.c: each seam of run/seams.h calls on run_seams where a test build set it.
#include "run/seams.h"

#include <stddef.h>

const RunSeams* run_seams = NULL;

void seam_stop_at(const char* point, long n, const char* where) {
    if (run_seams) run_seams->stop_at(point, n, where);
}
void seam_stop_in_wait(const char* what) {
    if (run_seams) run_seams->stop_in_wait(what);
}
void seam_plant_faults(ModelHooks* hooks, void* trainer, SeamWriteGrad write_grad, SeamWriteLoss write_loss,
                       const TrainConfig* cfg, const GPT2Config* mc, int micro_steps, int rank, int world) {
    if (run_seams) run_seams->plant_faults(hooks, trainer, write_grad, write_loss, cfg, mc, micro_steps, rank, world);
}
void seam_begin_step(int step, BatchFn* batch, void** batch_ctx) {
    if (run_seams) run_seams->begin_step(step, batch, batch_ctx);
}
FILE* seam_data_trace(int rank) { return run_seams ? run_seams->data_trace(rank) : NULL; }
const char* seam_blas_corename(void) { return run_seams ? run_seams->blas_corename() : NULL; }
double seam_trace_clock_skew_us(int rank) { return run_seams ? run_seams->trace_clock_skew_us(rank) : 0.0; }
