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
 * llmc/train_loop.h): it would make every later z-score NaN. A window an older build saved
 * with them loads without them.
 * The sums run over the window in a fixed order, in double, so every rank (all see the
 * same all-reduced loss and norm) reaches the same decision, and a resumed run (the
 * windows are saved in checkpoints' state.txt) the straight run's.
 */
#ifndef LLMC_OUTLIERS_H
#define LLMC_OUTLIERS_H

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
    OutlierWindow loss, norm;
} OutlierState;

static inline void outlier_window_init(OutlierWindow* w, int size) {
    memset(w, 0, sizeof(*w));
    w->size = size < 1 ? 1 : size > OUTLIER_MAX_WINDOW ? OUTLIER_MAX_WINDOW : size;
}

static inline void outlier_state_init(OutlierState* s, int size) {
    outlier_window_init(&s->loss, size);
    outlier_window_init(&s->norm, size);
}

// The i-th oldest value (0 <= i < count).
static inline double outlier_value(const OutlierWindow* w, int i) {
    int first = w->count < w->size ? 0 : w->next;
    return w->values[(first + i) % w->size];
}

static inline double outlier_z(const OutlierWindow* w, double x) {
    if (w->count < w->size) return NAN;
    double sum = 0.0;
    for (int i = 0; i < w->size; i++) sum += outlier_value(w, i);
    double mean = sum / w->size, var = 0.0;
    for (int i = 0; i < w->size; i++) var += (outlier_value(w, i) - mean) * (outlier_value(w, i) - mean);
    double std = sqrt(var / w->size);
    return std > 0.0 ? (x - mean) / std : 0.0;
}

static inline void outlier_push(OutlierWindow* w, double x) {
    if (!isfinite(x)) return;
    w->values[w->next] = x;
    w->next = (w->next + 1) % w->size;
    if (w->count < w->size) w->count++;
}

// The step's decision (thresholds <= 0 are off); both windows then take the step's values.
static inline int outlier_step(OutlierState* s, double loss, double norm, float loss_z_max, float norm_z_max,
                               double* z_loss, double* z_norm) {
    *z_loss = outlier_z(&s->loss, loss);
    *z_norm = outlier_z(&s->norm, norm);
    int skip = (loss_z_max > 0.0f && *z_loss > loss_z_max) || (norm_z_max > 0.0f && *z_norm > norm_z_max);
    outlier_push(&s->loss, loss);
    outlier_push(&s->norm, norm);
    return skip;
}

// state.txt's text of a window: "W:COUNT" then its values oldest first, each as a C99 hex
// float (%a: the exact bits), comma-separated.
static inline void outlier_window_format(const OutlierWindow* w, FILE* f) {
    fprintf(f, "%d:%d", w->size, w->count);
    for (int i = 0; i < w->count; i++) fprintf(f, ",%a", outlier_value(w, i));
}

// The reverse, with the saved W; 0 on malformed text. *dropped: the non-finite values left
// out (an older build pushed those of non-finite steps).
static inline int outlier_window_parse(const char* text, OutlierWindow* w, int* dropped) {
    int size, count, used;
    if (sscanf(text, "%d:%d%n", &size, &count, &used) != 2 || size < 1 || size > OUTLIER_MAX_WINDOW || count < 0 ||
        count > size) {
        return 0;
    }
    outlier_window_init(w, size);
    const char* p = text + used;
    *dropped = 0;
    for (int i = 0; i < count; i++) {
        char* end = NULL;
        if (*p != ',') return 0;
        double v = strtod(p + 1, &end);
        if (end == p + 1) return 0;
        *dropped += !isfinite(v);
        outlier_push(w, v);
        p = end;
    }
    return *p == '\0';
}

// A window with W = size holding the newest values of w that fit (a resume with another
// --outlier-window).
static inline OutlierWindow outlier_window_resized(const OutlierWindow* w, int size) {
    OutlierWindow out;
    outlier_window_init(&out, size);
    for (int i = w->count > out.size ? w->count - out.size : 0; i < w->count; i++) outlier_push(&out, outlier_value(w, i));
    return out;
}

#ifdef __cplusplus
}
#endif
#endif
