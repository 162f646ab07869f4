// run/seams.c: what run/seams.h declares: each seam calls on run_seams where a test build set it.
#include "run/seams.h"

#include <stddef.h>

#include "run/test_hooks.h"
#include "run/test_stop.h"

static const RunSeams TEMPORARY = {test_stop_at, test_stop_in_wait, test_hooks_install, test_hooks_begin_step};
const RunSeams* run_seams = &TEMPORARY;

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
