/*
 * Outlier detection for -sl / -sg (llm.c's skip-update flags): the z-score of the step's
 * loss and of its grad norm against the last W values of each (--outlier-window, default
 * 128), and the decision to skip the update when either exceeds its threshold.
 *
 * Definitions (ours):
 *   z(x) = (x - mean) / std over the W values before x (population std), 0 when std is 0,
 *          NaN while fewer than W values are known: a new run never skips in its first W
 *          steps;
 *   skip = (-sl Z > 0 and z(loss) > Z) or (-sg Z > 0 and z(norm) > Z): one-sided, only a
 *          rise is an outlier.
 * Every finite step's value joins its window afterwards, a skipped one too, so that a
 * lasting change of level stops being an outlier after W steps instead of stopping
 * training. A NaN or infinity never joins (a step with one is skipped before it is compared:
 * run/step.h): it would make every later z-score NaN; nor does a loss spike's (run/spikes.h),
 * skipped there too. A window an older build saved
 * with them loads without them.
 * The sums run over the window in a fixed order, in double, so every rank (all see the
 * same all-reduced loss and norm) reaches the same decision, and a resumed run (the
 * windows are saved in checkpoints' state.txt) the straight run's.
 */
#ifndef RUN_OUTLIERS_H
#define RUN_OUTLIERS_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OUTLIER_MAX_WINDOW 1024

typedef struct {
    int size;                            // W
    int count;                           // values pushed so far (saturates at W)
    int next;                            // where the next value goes (the oldest, once full)
    double values[OUTLIER_MAX_WINDOW];
} OutlierWindow;

typedef struct {
    OutlierWindow loss, norm;            // -sl/-sg's windows
    OutlierWindow good_loss, good_norm;  // the spike detector's history of good steps (run/spikes.h)
} OutlierState;

void outlier_state_init(OutlierState* s, int size);

// One window: empty with W = size (clamped to 1..OUTLIER_MAX_WINDOW); the i-th oldest value
// (0 <= i < count); a finite x joins (the oldest leaves once full), a non-finite one never.
void outlier_window_init(OutlierWindow* w, int size);
double outlier_window_value(const OutlierWindow* w, int i);
void outlier_window_push(OutlierWindow* w, double x);

// The step's decision (thresholds <= 0 are off); both windows then take the step's values.
int outlier_step(OutlierState* s, double loss, double norm, float loss_z_max, float norm_z_max,
                 double* z_loss, double* z_norm);

// state.txt's text of a window: "W:COUNT" then its values oldest first, each as a C99 hex
// float (%a: the exact bits), comma-separated.
void outlier_window_format(const OutlierWindow* w, FILE* f);

// The reverse, with the saved W; 0 on malformed text. *dropped: the non-finite values left
// out (an older build pushed those of non-finite steps).
int outlier_window_parse(const char* text, OutlierWindow* w, int* dropped);

// A window with W = size holding the newest values of w that fit (a resume with another
// --outlier-window).
OutlierWindow outlier_window_resized(const OutlierWindow* w, int size);

#ifdef __cplusplus
}
#endif
#endif
