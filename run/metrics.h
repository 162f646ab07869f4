/*
 * What each step line and main.log report beyond the loss (run/run.c's run_step_end): the
 * tokens per second, the MFU, the wait on communication, the peak memory over the ranks,
 * and the rank the others waited for; every --straggler-every steps the spread over the
 * ranks of their busy and comm-wait times (min, median, max and the rank of the max).
 *
 * A rank's busy time is its step's wall time less its comm wait: a slow rank is late to
 * every collective, so every rank's wall time is about the slowest one's and only the busy
 * time tells the ranks apart (Megatron's StragglerDetector times the compute for the same
 * reason). The figures over the ranks cost one small collective per step, under the
 * job's deadline (run/mpi_wait.h): an all-reduce of (value, rank) pairs with MPI_MAXLOC,
 * or on a straggler step an all-gather of every rank's figures in its place.
 *
 * MFU = tokens/s x model FLOPs per token (llmc/gpt2_spec.h) / (ranks x one rank's peak),
 * the peak the trainer sets: the GPU's dense peak for its precision (run/chip_peaks.h),
 * the CPU trainer's measured matmul rate; none, with the reason, where it cannot know one.
 */
#ifndef RUN_METRICS_H
#define RUN_METRICS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double min, median, max;  // the median of an even count: the mean of the middle two
    int max_rank;             // the lowest rank that has the max
} RankSpread;

// One step's figures, the same on rank 0's line, main.log and TensorBoard.
typedef struct {
    double tokens_per_s;   // the step's tokens over rank 0's step time
    double mfu_percent;    // < 0: no peak to count against
    double comm_ms;        // rank 0's wait on communication
    double host_mib;       // peak resident host memory (VmHWM), the max over the ranks
    double device_mib;     // peak device memory in use, the max over the ranks; < 0: no device
    double slow_ms;        // the largest busy time over the ranks...
    int slow_rank;         // ...and its rank
    int stop;              // the largest of the ranks' stop requests (run/preempt.h), 0: none
    int has_spread;        // a --straggler-every step: the two below are set
    RankSpread busy, comm;
} StepMetrics;

typedef struct {
    double flops_per_token;   // llmc/gpt2_spec.h's, at the run's T
    double peak_flops;        // one rank's FLOP/s; 0: no MFU
    char peak_what[200];      // the peak named, or why there is none
    size_t (*device_bytes)(void* ctx);  // the device memory in use now (NULL: no device)
    void* device_ctx;
    double device_peak_bytes; // this rank's largest device_bytes so far
    int straggler_every;      // --straggler-every (0: never)
} Metrics;

// The trainer's peak (FLOP/s of one rank; 0: none, what says why) and its device memory
// counter, before run_start prints the header.
void metrics_set_peak(Metrics* m, double flops_per_s, const char* what);
void metrics_set_device(Metrics* m, size_t (*device_bytes)(void* ctx), void* ctx);

// This process's peak resident memory (VmHWM) in MiB.
double metrics_host_peak_mib(void);

// Every rank after step (1-based) took step_ms, comm_ms of it waiting on communication,
// for tokens tokens over all ranks (collective). Rank 0's figures in out.
void metrics_step(Metrics* m, StepMetrics* out, int step, double step_ms, double comm_ms, long long tokens,
                  int rank, int world, int stop);

// The min, median, max and the rank of the max of n values (rank order).
RankSpread rank_spread(const double* v, int n);

// What the step line adds after "comm wait": " | MFU 1.2% | mem 812 MiB | slowest rank 1 4.1 ms".
void metrics_format_line(const StepMetrics* s, char* buf, size_t n);
// What main.log's train line appends: " tps:... mfu:... comm:... mem:... gmem:... slow:<ms>@<rank>".
void metrics_format_log(const StepMetrics* s, char* buf, size_t n);
// A straggler step's own main.log line: "s:12 busy_ms:min/med/max@rank comm_ms:min/med/max@rank"
// (every word key:value, as the readers of llm.c's lines split them).
void metrics_format_spread(const StepMetrics* s, int step, char* buf, size_t n);

// The step's scalars for TensorBoard (run/tensorboard.h; docs/formats.md's tags): the
// train line's (loss, grad norm, lr, step ms, skipped) then these figures. Returns how many.
#define METRICS_MAX_SCALARS 24
typedef struct TbScalar TbScalar;
int metrics_scalars(const StepMetrics* s, float loss, float grad_norm, float lr, double step_ms, int skipped,
                    TbScalar* out);

#ifdef __cplusplus
}
#endif
#endif
