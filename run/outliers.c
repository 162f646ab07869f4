// run/outliers.c: what run/outliers.h declares.
#include "run/outliers.h"

void outlier_window_init(OutlierWindow* w, int size) {
    memset(w, 0, sizeof(*w));
    w->size = size < 1 ? 1 : size > OUTLIER_MAX_WINDOW ? OUTLIER_MAX_WINDOW : size;
}

void outlier_state_init(OutlierState* s, int size) {
    outlier_window_init(&s->loss, size);
    outlier_window_init(&s->norm, size);
}

double outlier_window_value(const OutlierWindow* w, int i) {
    int first = w->count < w->size ? 0 : w->next;
    return w->values[(first + i) % w->size];
}

static double outlier_z(const OutlierWindow* w, double x) {
    if (w->count < w->size) return NAN;
    double sum = 0.0;
    for (int i = 0; i < w->size; i++) sum += outlier_window_value(w, i);
    double mean = sum / w->size, var = 0.0;
    for (int i = 0; i < w->size; i++) var += (outlier_window_value(w, i) - mean) * (outlier_window_value(w, i) - mean);
    double std = sqrt(var / w->size);
    return std > 0.0 ? (x - mean) / std : 0.0;
}

void outlier_window_push(OutlierWindow* w, double x) {
    if (!isfinite(x)) return;
    w->values[w->next] = x;
    w->next = (w->next + 1) % w->size;
    if (w->count < w->size) w->count++;
}

int outlier_step(OutlierState* s, double loss, double norm, float loss_z_max, float norm_z_max,
                 double* z_loss, double* z_norm) {
    *z_loss = outlier_z(&s->loss, loss);
    *z_norm = outlier_z(&s->norm, norm);
    int skip = (loss_z_max > 0.0f && *z_loss > loss_z_max) || (norm_z_max > 0.0f && *z_norm > norm_z_max);
    outlier_window_push(&s->loss, loss);
    outlier_window_push(&s->norm, norm);
    return skip;
}

void outlier_window_format(const OutlierWindow* w, FILE* f) {
    fprintf(f, "%d:%d", w->size, w->count);
    for (int i = 0; i < w->count; i++) fprintf(f, ",%a", outlier_window_value(w, i));
}

int outlier_window_parse(const char* text, OutlierWindow* w, int* dropped) {
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
        outlier_window_push(w, v);
        p = end;
    }
    return *p == '\0';
}

OutlierWindow outlier_window_resized(const OutlierWindow* w, int size) {
    OutlierWindow out;
    outlier_window_init(&out, size);
    for (int i = w->count > out.size ? w->count - out.size : 0; i < w->count; i++) outlier_window_push(&out, outlier_window_value(w, i));
    return out;
}
