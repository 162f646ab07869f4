// run/metrics.c: what run/metrics.h declares.
#include "run/metrics.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "run/mpi_wait.h"
#include "run/tensorboard.h"

void metrics_set_peak(Metrics* m, double flops_per_s, const char* what) {
    m->peak_flops = flops_per_s;
    snprintf(m->peak_what, sizeof(m->peak_what), "%s", what);
}

void metrics_set_device(Metrics* m, size_t (*device_bytes)(void* ctx), void* ctx) {
    m->device_bytes = device_bytes;
    m->device_ctx = ctx;
}

double metrics_host_peak_mib(void) {
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
    return (double)u.ru_maxrss / 1024.0;  // Linux: KiB, the VmHWM of /proc/self/status
}

static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

RankSpread rank_spread(const double* v, int n) {
    RankSpread s = {v[0], v[0], v[0], 0};
    double* sorted = (double*)mallocCheck((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) {
        sorted[i] = v[i];
        if (v[i] > s.max) {
            s.max = v[i];
            s.max_rank = i;
        }
        if (v[i] < s.min) s.min = v[i];
    }
    qsort(sorted, (size_t)n, sizeof(double), compare_doubles);
    s.median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    free(sorted);
    return s;
}

// FIG_STOP: run/preempt.h's request, agreed in the same collective (no other one per step).
enum { FIG_BUSY, FIG_COMM, FIG_HOST, FIG_DEVICE, FIG_STOP, NUM_FIGS };

// MPI_DOUBLE_INT's layout: a value and the rank that has it.
typedef struct {
    double value;
    int rank;
} ValueRank;

// The max over the ranks of busy time, host and device memory, with the rank of each.
static void metrics_maxloc(const double* mine, int rank, int step, double* max, int* busy_rank) {
    ValueRank v[4] = {{mine[FIG_BUSY], rank}, {mine[FIG_HOST], rank}, {mine[FIG_DEVICE], rank}, {mine[FIG_STOP], rank}};
    MPI_Request request;
    mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, v, 4, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "step metrics all-reduce", step);
    max[FIG_BUSY] = v[0].value;
    max[FIG_HOST] = v[1].value;
    max[FIG_DEVICE] = v[2].value;
    max[FIG_STOP] = v[3].value;
    *busy_rank = v[0].rank;
}

// A straggler step: every rank's figures, in place of the all-reduce.
static void metrics_gather(StepMetrics* out, const double* mine, int step, int world, double* max) {
    double* all = (double*)mallocCheck((size_t)world * NUM_FIGS * sizeof(double));
    double* col = (double*)mallocCheck((size_t)world * sizeof(double));
    mpi_allgather_deadline(mine, all, NUM_FIGS, MPI_DOUBLE, "straggler all-gather", step);
    for (int f = 0; f < NUM_FIGS; f++) {
        for (int r = 0; r < world; r++) col[r] = all[r * NUM_FIGS + f];
        RankSpread s = rank_spread(col, world);
        max[f] = s.max;
        if (f == FIG_BUSY) out->busy = s;
        if (f == FIG_COMM) out->comm = s;
    }
    out->has_spread = 1;
    free(col);
    free(all);
}

void metrics_step(Metrics* m, StepMetrics* out, int step, double step_ms, double comm_ms, long long tokens,
                  int rank, int world, int stop) {
    memset(out, 0, sizeof(*out));
    if (m->device_bytes) {
        double now = (double)m->device_bytes(m->device_ctx);
        if (now > m->device_peak_bytes) m->device_peak_bytes = now;
    }
    double busy = step_ms > comm_ms ? step_ms - comm_ms : 0.0;
    double mine[NUM_FIGS] = {busy, comm_ms, metrics_host_peak_mib(),
                             m->device_bytes ? m->device_peak_bytes / (1 << 20) : -1.0, (double)stop};
    double max[NUM_FIGS];
    int gather = m->straggler_every > 0 && step % m->straggler_every == 0;
    if (gather) {
        metrics_gather(out, mine, step, world, max);
        out->slow_rank = out->busy.max_rank;
    } else {
        metrics_maxloc(mine, rank, step, max, &out->slow_rank);
    }
    out->stop = (int)max[FIG_STOP];
    out->slow_ms = max[FIG_BUSY];
    out->host_mib = max[FIG_HOST];
    out->device_mib = max[FIG_DEVICE];
    out->comm_ms = comm_ms;
    out->tokens_per_s = tokens / (step_ms / 1e3);
    out->mfu_percent = m->peak_flops > 0 ? 100.0 * out->tokens_per_s * m->flops_per_token / (world * m->peak_flops)
                                         : -1.0;
}

void metrics_format_line(const StepMetrics* s, char* buf, size_t n) {
    char mfu[32] = "", device[48] = "";
    if (s->mfu_percent >= 0) snprintf(mfu, sizeof(mfu), " | MFU %.1f%%", s->mfu_percent);
    if (s->device_mib >= 0) snprintf(device, sizeof(device), " | device mem %.0f MiB", s->device_mib);
    snprintf(buf, n, "%s | host mem %.0f MiB%s | slowest rank %d %.1f ms", mfu, s->host_mib, device, s->slow_rank,
             s->slow_ms);
}

void metrics_format_log(const StepMetrics* s, char* buf, size_t n) {
    char mfu[32] = "", device[32] = "";
    if (s->mfu_percent >= 0) snprintf(mfu, sizeof(mfu), " mfu:%.3f", s->mfu_percent);
    if (s->device_mib >= 0) snprintf(device, sizeof(device), " gmem:%.1f", s->device_mib);
    snprintf(buf, n, " tps:%.0f%s comm:%.3f mem:%.1f%s slow:%.3f@%d", s->tokens_per_s, mfu, s->comm_ms, s->host_mib,
             device, s->slow_ms, s->slow_rank);
}

void metrics_format_spread(const StepMetrics* s, int step, char* buf, size_t n) {
    snprintf(buf, n, "s:%d busy_ms:%.3f/%.3f/%.3f@%d comm_ms:%.3f/%.3f/%.3f@%d\n", step, s->busy.min,
             s->busy.median, s->busy.max, s->busy.max_rank, s->comm.min, s->comm.median, s->comm.max,
             s->comm.max_rank);
}

int metrics_scalars(const StepMetrics* s, float loss, float grad_norm, float lr, double step_ms, int skipped,
                    TbScalar* out) {
    int n = 0;
    out[n++] = (TbScalar){"train/loss", loss};
    out[n++] = (TbScalar){"train/grad_norm", grad_norm};
    out[n++] = (TbScalar){"train/lr", lr};
    out[n++] = (TbScalar){"train/step_ms", step_ms};
    out[n++] = (TbScalar){"train/skipped", skipped};
    out[n++] = (TbScalar){"perf/tokens_per_s", s->tokens_per_s};
    if (s->mfu_percent >= 0) out[n++] = (TbScalar){"perf/mfu_percent", s->mfu_percent};
    out[n++] = (TbScalar){"perf/comm_wait_ms", s->comm_ms};
    out[n++] = (TbScalar){"memory/host_peak_mib", s->host_mib};
    if (s->device_mib >= 0) out[n++] = (TbScalar){"memory/device_peak_mib", s->device_mib};
    out[n++] = (TbScalar){"straggler/slowest_busy_ms", s->slow_ms};
    out[n++] = (TbScalar){"straggler/slowest_rank", s->slow_rank};
    if (s->has_spread) {
        out[n++] = (TbScalar){"straggler/busy_ms_min", s->busy.min};
        out[n++] = (TbScalar){"straggler/busy_ms_median", s->busy.median};
        out[n++] = (TbScalar){"straggler/busy_ms_max", s->busy.max};
        out[n++] = (TbScalar){"straggler/busy_max_rank", s->busy.max_rank};
        out[n++] = (TbScalar){"straggler/comm_ms_min", s->comm.min};
        out[n++] = (TbScalar){"straggler/comm_ms_median", s->comm.median};
        out[n++] = (TbScalar){"straggler/comm_ms_max", s->comm.max};
        out[n++] = (TbScalar){"straggler/comm_max_rank", s->comm.max_rank};
    }
    return n;
}
