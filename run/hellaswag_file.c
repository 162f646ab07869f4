// run/hellaswag_file.c: what run/hellaswag_file.h declares.
#include "run/hellaswag_file.h"

int hellaswag_row_positions(const HellaswagItem* it, int j) { return it->ctx_len + it->end_len[j] - 1; }

// Reads the item starting at stream[*at] (n uint16 in all) into it; advances *at past it.
static void hellaswag_parse_item(const char* path, const uint16_t* stream, size_t n, size_t* at, int k,
                                 int vocab_size, HellaswagItem* it) {
    size_t p = *at;
    if (n - p < HELLASWAG_ITEM_FIELDS) fatal("%s: truncated: item %d ends after %zu bytes of its fields", path, k, 2 * (n - p));
    if (stream[p] != HELLASWAG_ITEM_START) {
        fatal("%s: item %d does not start with the delimiter %d (found %d at byte %zu): not an eval file, or corrupt",
              path, k, HELLASWAG_ITEM_START, stream[p], 1024 + 2 * p);
    }
    size_t bytes = stream[p + 1];
    if (bytes % 2 != 0 || bytes < 2 * HELLASWAG_ITEM_FIELDS) {
        fatal("%s: item %d: byte count %zu is not an even number of at least %d", path, k, bytes, 2 * HELLASWAG_ITEM_FIELDS);
    }
    size_t end = p + bytes / 2;
    if (end > n) fatal("%s: truncated: item %d says %zu bytes but %zu remain", path, k, bytes, 2 * (n - p));
    it->index = stream[p + 2];
    it->label = stream[p + 3];
    int completions = stream[p + 4];
    if (completions != HELLASWAG_COMPLETIONS) {
        fatal("%s: item %d has %d completions; this eval takes %d", path, k, completions, HELLASWAG_COMPLETIONS);
    }
    if (it->label >= completions) fatal("%s: item %d: label %d is not below its %d completions", path, k, it->label, completions);
    size_t q = p + 5;
    // The context, then each completion: a length (at least 1: every row needs a context
    // position to predict from, and a mean over no tokens is undefined), then its tokens.
    for (int j = -1; j < HELLASWAG_COMPLETIONS; j++) {
        const char* what = j < 0 ? "context" : "completion";
        if (q >= end) fatal("%s: item %d ends before its %s %d (byte count %zu too small)", path, k, what, j < 0 ? 0 : j, bytes);
        size_t len = stream[q++];
        if (len == 0) fatal("%s: item %d: %s %d is empty", path, k, what, j < 0 ? 0 : j);
        if (len > end - q) fatal("%s: item %d: %s %d of %zu tokens runs past the item's %zu bytes", path, k, what, j < 0 ? 0 : j, len, bytes);
        for (size_t t = q; t < q + len; t++) {
            if (stream[t] >= vocab_size) {
                fatal("%s: item %d: token %d in its %s is not below the model's vocabulary size %d", path, k, stream[t], what,
                      vocab_size);
            }
        }
        if (j < 0) {
            it->ctx = stream + q;
            it->ctx_len = (int)len;
        } else {
            it->end[j] = stream + q;
            it->end_len[j] = (int)len;
        }
        q += len;
    }
    if (q != end) fatal("%s: item %d: its fields end at byte %zu of its %zu", path, k, 2 * (q - p), bytes);
    *at = end;
}

void hellaswag_read(HellaswagSet* s, const char* path, int vocab_size) {
    memset(s, 0, sizeof(*s));
    path_format(s->path, sizeof(s->path), "%s", path);
    struct stat st;  // stat, not a trial open: opening a FIFO would wait for a writer forever
    if (stat(path, &st) != 0 && errno == ENOENT) {
        fatal("HellaSwag eval file '%s' does not exist: make it with llm.c's dev/data/hellaswag.py (it writes "
              "hellaswag_val.bin), or pass --hellaswag-file data/tinyshakespeare_hellaswag.bin, the small set `make "
              "data` builds", path);
    }
    FILE* f = fopenCheck(path, "rb");  // names a directory, a FIFO, a permission problem
    long size = file_size_of(f, path);
    if (size < 1024) fatal("%s: %ld bytes, shorter than the 1024-byte header of an eval file", path, size);
    int32_t header[256];
    freadCheck(header, sizeof(int32_t), 256, f, path);
    if (header[0] != HELLASWAG_MAGIC) {
        fatal("%s: bad magic %d (an eval file has %d; is it a token shard or a model?)", path, header[0], HELLASWAG_MAGIC);
    }
    field_range_check(path, "header field version", header[1], HELLASWAG_VERSION, HELLASWAG_VERSION);
    s->num_items = (int)field_range_check(path, "header field items", header[2], 1, HELLASWAG_MAX_ITEMS);
    size_t body = (size_t)size - 1024;
    if (body % 2 != 0) fatal("%s: %zu bytes after the header, not a whole number of uint16", path, body);
    size_t n = body / 2;
    s->stream = (uint16_t*)mallocCheck(body > 0 ? body : 1);
    freadCheck(s->stream, sizeof(uint16_t), n, f, path);
    fclose(f);
    s->items = (HellaswagItem*)callocCheck((size_t)s->num_items, sizeof(HellaswagItem));
    size_t at = 0;
    for (int k = 0; k < s->num_items; k++) hellaswag_parse_item(path, s->stream, n, &at, k, vocab_size, &s->items[k]);
    if (at != n) fatal("%s: %zu bytes after its %d items (the header says %d items)", path, 2 * (n - at), s->num_items, s->num_items);
}

void hellaswag_check_fits(const HellaswagSet* s, int T) {
    for (int k = 0; k < s->num_items; k++) {
        const HellaswagItem* it = &s->items[k];
        for (int j = 0; j < HELLASWAG_COMPLETIONS; j++) {
            int need = hellaswag_row_positions(it, j);
            if (need > T) {
                fatal("%s: item %d (index %d), completion %d needs %d positions (context %d + completion %d - 1) but "
                      "-t is %d: train with a larger -t or use a file of shorter items", s->path, k, it->index, j, need,
                      it->ctx_len, it->end_len[j], T);
            }
        }
    }
}

void hellaswag_free(HellaswagSet* s) {
    free(s->items);
    free(s->stream);
    s->items = NULL;
    s->stream = NULL;
}

// An item's size in the file, in bytes (its byte-count field).
static size_t hellaswag_item_bytes(const HellaswagItem* it) {
    size_t u16 = HELLASWAG_ITEM_FIELDS + (size_t)it->ctx_len;
    for (int j = 0; j < HELLASWAG_COMPLETIONS; j++) u16 += 1 + (size_t)it->end_len[j];
    return 2 * u16;
}

void hellaswag_write(const char* path, const HellaswagItem* items, int n) {
    if (n < 1 || n > HELLASWAG_MAX_ITEMS) fatal("%s: %d items; an eval file holds 1..%d", path, n, HELLASWAG_MAX_ITEMS);
    int32_t header[256] = {0};
    header[0] = HELLASWAG_MAGIC;
    header[1] = HELLASWAG_VERSION;
    header[2] = n;
    for (int k = 0; k < n; k++) {  // the longest item: the header holds it
        size_t bytes = hellaswag_item_bytes(&items[k]);
        if (bytes > 65534) fatal("%s: item %d is %zu bytes; the format's byte count is a uint16", path, k, bytes);
        if ((int32_t)bytes > header[3]) header[3] = (int32_t)bytes;
    }
    FILE* f = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int32_t), 256, f, path);
    for (int k = 0; k < n; k++) {
        const HellaswagItem* it = &items[k];
        uint16_t fields[HELLASWAG_ITEM_FIELDS] = {HELLASWAG_ITEM_START, (uint16_t)hellaswag_item_bytes(it), (uint16_t)it->index,
                                                  (uint16_t)it->label, HELLASWAG_COMPLETIONS, (uint16_t)it->ctx_len};
        fwriteCheck(fields, sizeof(uint16_t), HELLASWAG_ITEM_FIELDS, f, path);
        fwriteCheck(it->ctx, sizeof(uint16_t), (size_t)it->ctx_len, f, path);
        for (int j = 0; j < HELLASWAG_COMPLETIONS; j++) {
            uint16_t len = (uint16_t)it->end_len[j];
            fwriteCheck(&len, sizeof(uint16_t), 1, f, path);
            fwriteCheck(it->end[j], sizeof(uint16_t), (size_t)it->end_len[j], f, path);
        }
    }
    fcloseCheck(f, path);
}
