// run/step.c: what run/step.h declares.
#include "run/step.h"

#include <math.h>
#include <mpi.h>
#include <time.h>

#include "run/mpi_wait.h"
#include "run/spikes.h"

double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int step_gate_skip(void* ctx, float grad_norm) {
    StepGate* g = (StepGate*)ctx;
    StepResult* r = g->result;
    if (g->loss_now) r->loss = g->loss_now(g->loss_ctx);
    r->nonfinite = (isfinite(r->loss) ? 0 : STEP_NONFINITE_LOSS) | (isfinite(grad_norm) ? 0 : STEP_NONFINITE_NORM);
    if (r->nonfinite) {
        r->skipped = 1;
    } else if (g->state) {
        r->spike = spike_check(g->state, r->loss, grad_norm, g->spike_loss_factor, g->spike_norm_factor,
                               &r->loss_ratio, &r->norm_ratio);
        r->skipped = r->spike ? 1 : outlier_step(g->state, r->loss, grad_norm, g->loss_z_max, g->norm_z_max,
                                                 &r->z_loss, &r->z_norm);
    }
    return r->skipped;
}

const UpdateGate* step_gate_begin(StepGate* g, UpdateGate* gate, OutlierState* state, const TrainConfig* cfg,
                                  StepResult* r, float (*loss_now)(void*), void* loss_ctx) {
    *g = (StepGate){state, cfg->skip_loss_z, cfg->skip_norm_z, cfg->spike_loss_factor, cfg->spike_norm_factor,
                    loss_now, loss_ctx, r};
    r->z_loss = r->z_norm = r->loss_ratio = r->norm_ratio = NAN;
    r->spike = 0;
    *gate = (UpdateGate){step_gate_skip, g};
    return gate;
}

float step_loss_scale(const TrainConfig* cfg, int micro_steps, int world) {
    return 1.0f / ((float)cfg->B * cfg->T * micro_steps * (cfg->average_in_collective ? 1 : world));
}

float step_dp_invariant_loss(const float* micro_losses, int micro_steps, int world, int step) {
    int count = micro_steps * world;
    float* all = (float*)mallocCheck((size_t)count * sizeof(float));
    mpi_allgather_deadline(micro_losses, all, micro_steps, MPI_FLOAT, "loss all-gather", step);
    double level[32];
    int top = 0;
    for (int g = 0; g < count; g++) {
        double carry = all[g];
        for (int b = g; b & 1; b >>= 1) carry = level[--top] + carry;
        level[top++] = carry;
    }
    free(all);
    return (float)(level[0] / count);
}

void loader_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    DataLoader* d = (DataLoader*)ctx;
    dataloader_next_batch(d);
    *inputs = d->inputs;
    *targets = d->targets;
}

void fixed_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    DataLoader* d = (DataLoader*)ctx;
    *inputs = d->inputs;
    *targets = d->targets;
}

int all_ranks_equal(uint64_t mine, int world) {
    uint64_t* all = (uint64_t*)mallocCheck((size_t)world * sizeof(uint64_t));
    mpi_allgather_deadline(&mine, all, 1, MPI_UINT64_T, "replica check", -1);
    int same = 1;
    for (int r = 0; r < world; r++) same &= all[r] == all[0];
    free(all);
    return same;
}
