// run/dp_invariant.c: what run/dp_invariant.h declares.
#include "run/dp_invariant.h"

static int dp_invariant_power_of_two(int n) { return n >= 1 && (n & (n - 1)) == 0; }

void dp_invariant_check(const TrainConfig* cfg, int world, int micro_steps) {
    const char* why =
        cfg->zero_stage != 1 ? "-z 0 (the mode is ZeRO-1's; -z 1 at one rank is the replicated optimizer anyway)"
        : cfg->grad_dtype != DTYPE_FP32 ? "--grad-dtype bf16 (a bf16 reduction rounds each partial sum where it lies)"
        : cfg->average_in_collective ? "--average-in-collective (1/ranks would scale each split differently)"
        : cfg->split_embedding ? "--split-embedding (its sparse rows are summed in the order of the ranks)"
        : cfg->dist_opt_instances > 1 ? "--dist-opt-instances (the all-reduce across instances sums in its own order)"
        : cfg->overfit_single_batch ? "-a 1 (every rank would train on its own first batch)"
                                    : NULL;
    if (why) fatal("--dp-invariant cannot keep the same bits with %s", why);
    if (!dp_invariant_power_of_two(world) || !dp_invariant_power_of_two(micro_steps)) {
        fatal("--dp-invariant supports power-of-two ranks with power-of-two micro-steps (1, 2, 4, 8, ... of each, the "
              "same ranks x micro-steps and -b for every split); this run has %d ranks x %d micro-steps", world,
              micro_steps);
    }
}

float dp_invariant_loss(const float* micro_losses, int micro_steps, int world, int step) {
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
