/*
 * Learning-rate schedule: linear warmup, then cosine decay from lr to lr * final_fraction
 * at the last step (final_fraction = 1 gives a constant rate after warmup).
 */
#ifndef LLMC_SCHEDULE_H
#define LLMC_SCHEDULE_H

#include <math.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline float lr_at_step(float lr, int warmup_steps, float final_fraction, int step, int total_steps) {
    if (step < warmup_steps) return lr * (float)(step + 1) / (float)warmup_steps;
    if (total_steps <= warmup_steps) return lr;
    float progress = (float)(step - warmup_steps) / (float)(total_steps - warmup_steps);
    if (progress > 1.0f) progress = 1.0f;
    float cosine = 0.5f * (1.0f + cosf(3.14159265358979f * progress));  // 1 -> 0
    float min_lr = lr * final_fraction;
    return min_lr + (lr - min_lr) * cosine;
}

#ifdef __cplusplus
}
#endif
#endif
