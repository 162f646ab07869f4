// run/spikes.c: what run/spikes.h declares.
#include "run/spikes.h"

#include "run/checkpoint.h"

void spike_history_init(OutlierState* s, int window) {
    outlier_window_init(&s->good_loss, window);
    outlier_window_init(&s->good_norm, window);
}

double spike_reference(const OutlierWindow* w) {
    if (w->count == 0) return NAN;
    double v[OUTLIER_MAX_WINDOW];
    for (int i = 0; i < w->count; i++) {  // insertion sort: W is small
        double x = outlier_window_value(w, i);
        int j = i;
        for (; j > 0 && v[j - 1] > x; j--) v[j] = v[j - 1];
        v[j] = x;
    }
    int mid = w->count / 2;
    return w->count % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

// x / ref; NaN when there is no (positive) reference yet.
static double spike_ratio(const OutlierWindow* w, double x) {
    double ref = spike_reference(w);
    return ref > 0.0 ? x / ref : NAN;
}

int spike_check(OutlierState* s, double loss, double norm, float loss_factor, float norm_factor,
                double* loss_ratio, double* norm_ratio) {
    *loss_ratio = spike_ratio(&s->good_loss, loss);
    *norm_ratio = spike_ratio(&s->good_norm, norm);
    int spike = (loss_factor > 0.0f && *loss_ratio > loss_factor ? SPIKE_LOSS : 0) |
                (norm_factor > 0.0f && *norm_ratio > norm_factor ? SPIKE_NORM : 0);
    if (!spike) {
        outlier_window_push(&s->good_loss, loss);
        outlier_window_push(&s->good_norm, norm);
    }
    return spike;
}

void spike_streak_step(SpikeStreak* s, int step, int bad, int spike, int last_checkpoint) {
    if (!bad) {
        s->steps = s->spikes = s->first = 0;
        s->vouched = last_checkpoint;
        return;
    }
    if (s->steps++ == 0) s->first = step;
    s->spikes += spike != 0;
}

void spike_stop_if_diverged(const SpikeStreak* s, int max_spikes, int step, double loss, double norm,
                            double loss_ratio, double norm_ratio, const char* output_dir) {
    if (s->spikes <= max_spikes) return;
    char where[PATH_MAX_LEN + 256];
    if (s->vouched > 0 && output_dir) {
        char path[PATH_MAX_LEN];
        checkpoint_path(path, sizeof(path), output_dir, s->vouched, 0);
        snprintf(where, sizeof(where),
                 "the last checkpoint before the spikes began is %s (a later good step's loss measured its weights; "
                 "the newer ones hold the weights that spiked): move the newer ones out of %s, then resume with -y 1 "
                 "--allow-resume-change and a lower -l", path, output_dir);
    } else {
        snprintf(where, sizeof(where), "no checkpoint holds weights from before the spikes began: start again with a "
                 "lower -l (or a longer warmup, -u)%s", output_dir ? " and --start-over" : "");
    }
    fatal("loss spike: %d spike steps in %d steps in a row, %d to %d, more than --max-spike-steps %d (step %d: "
          "loss %g, %.3gx the median of the recent good steps; grad norm %g, %.3gx): the run has diverged and stops; "
          "those updates were skipped; %s", s->spikes, s->steps, s->first, step, max_spikes, step, loss, loss_ratio,
          norm, norm_ratio, where);
}
