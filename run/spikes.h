/*
 * The loss-spike detector: a step whose loss or grad norm jumps far above the run's recent
 * good steps is skipped like a non-finite one (run/step.h's gate), and a run that keeps
 * spiking stops, naming the last checkpoint that a good step vouched for
 * (docs/training.md, "Loss spikes", owns the rule's why and its measured margins).
 *
 * The rule (ours; Megatron's --check-for-spiky-loss and OLMo-core's SkipStepOptimizer
 * are the references the doc compares with):
 *   ref(x)  = the median of the last W good steps' values (--spike-window, default 16):
 *             robust to one odd step, and known from the second step on;
 *   spike   = loss > F * ref(loss) (--spike-loss-factor, default 2)
 *             or grad norm > G * ref(norm) (--spike-norm-factor, default 10);
 *             a factor of 0 turns its check off; no check before the first good step.
 *   good    = a step neither a spike nor non-finite: only its values join the history,
 *             so a run that blew up never learns its new level as normal.
 *   streak  = steps in a row each a spike or non-finite; more than --max-spike-steps
 *             spikes (default 3) in one streak stop the run.
 * Every rank sees the same all-reduced loss and norm, and the median is exact, so all
 * ranks decide alike; the history and the streak are saved in checkpoints' state.txt.
 */
#ifndef RUN_SPIKES_H
#define RUN_SPIKES_H

#include "run/outliers.h"

#ifdef __cplusplus
extern "C" {
#endif

// The longest --spike-window (state.txt stays small: run/checkpoint.h's CHECKPOINT_TEXT_MAX).
#define SPIKE_MAX_WINDOW 128

// What made a step a spike, in StepResult.spike.
enum { SPIKE_LOSS = 1, SPIKE_NORM = 2 };

// The good-step history (OutlierState's good_loss, good_norm) empty, W = window.
void spike_history_init(OutlierState* s, int window);

// The median of a window's values; NaN when it is empty.
double spike_reference(const OutlierWindow* w);

// The step's SPIKE_* bits for a finite loss and norm, and their ratios to the references
// (NaN before the first good step). A step that is no spike joins the history.
int spike_check(OutlierState* s, double loss, double norm, float loss_factor, float norm_factor,
                double* loss_ratio, double* norm_ratio);

// The streak of bad steps, and the checkpoint to go back to.
typedef struct {
    int steps;     // steps in the open streak (0: none open)
    int spikes;    // spike steps among them
    int first;     // the streak's first step, 1-based (0: none open)
    int vouched;   // newest checkpoint whose weights a later good step's loss measured (0: none)
} SpikeStreak;

// After step `step` (1-based): bad (a spike or non-finite), spike (a spike), and
// last_checkpoint, the newest checkpoint saved before this step. A good step closes the
// streak and vouches for last_checkpoint: step N's loss is that of the weights after N-1.
void spike_streak_step(SpikeStreak* s, int step, int bad, int spike, int last_checkpoint);

// More than max_spikes spikes in the open streak: one error naming the streak, the step's
// values and the vouched checkpoint in output_dir (or that there is none), exit 1.
void spike_stop_if_diverged(const SpikeStreak* s, int max_spikes, int step, double loss, double norm,
                            double loss_ratio, double norm_ratio, const char* output_dir);

#ifdef __cplusplus
}
#endif
#endif
