// run/skip_batches.c: what run/skip_batches.h declares.
#include "run/skip_batches.h"

int skip_batches_parse_range(const char* text, int* from, int* to) {
    char* end = NULL;
    long a = strtol(text, &end, 10), b = a;
    if (end == text || a < 1 || a > INT_MAX) return 0;
    if (*end == '-') {
        const char* second = end + 1;
        b = strtol(second, &end, 10);
        if (end == second || b < a || b > INT_MAX) return 0;
    }
    if (*end != '\0') return 0;
    *from = (int)a;
    *to = (int)b;
    return 1;
}

int skip_batches_has(const SkipBatches* s, int from, int to) {
    for (int i = 0; i < s->count; i++)
        if (s->from[i] == from && s->to[i] == to) return 1;
    return 0;
}

void skip_batches_add(SkipBatches* s, int from, int to) {
    if (s->count == SKIP_BATCHES_KEPT) {  // the oldest drops out
        for (int i = 1; i < s->count; i++) {
            s->from[i - 1] = s->from[i];
            s->to[i - 1] = s->to[i];
        }
        s->count--;
    }
    s->from[s->count] = from;
    s->to[s->count] = to;
    s->count++;
}

void skip_batches_format(const SkipBatches* s, FILE* f) {
    if (s->count == 0) fputs("none", f);
    for (int i = 0; i < s->count; i++) fprintf(f, "%s%d-%d", i ? "," : "", s->from[i], s->to[i]);
}

int skip_batches_parse(const char* text, SkipBatches* s) {
    s->count = 0;
    if (strcmp(text, "none") == 0) return 1;
    char buf[SKIP_BATCHES_KEPT * 24];
    if (strlen(text) >= sizeof(buf)) return 0;
    strcpy(buf, text);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        int from, to;
        if (s->count == SKIP_BATCHES_KEPT || strchr(item, '-') == NULL || !skip_batches_parse_range(item, &from, &to)) {
            return 0;
        }
        skip_batches_add(s, from, to);
    }
    return s->count > 0;
}
