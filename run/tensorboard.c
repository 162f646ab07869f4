// run/tensorboard.c: what run/tensorboard.h declares.
#include "run/tensorboard.h"

#include <dirent.h>
#include <sys/time.h>
#include <time.h>

#include "run/crc32c.h"

#define TB_PREFIX "events.out.tfevents."
#define TB_MAX_EVENT 4096  // bytes of one Event: a step line's scalars fit many times over

// TFRecord's masked CRC: a CRC of data that holds CRCs is itself a poor check, so it is rotated and offset.
static uint32_t tb_masked_crc(const void* data, size_t n) {
    uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// ---------------------------------------------------------------------------- protobuf, the few fields used

typedef struct {
    unsigned char* p;
    size_t n, cap;
} TbBuf;

static void tb_byte(TbBuf* b, unsigned char c) {
    if (b->n == b->cap) fatal("tensorboard: an event over %zu bytes", b->cap);
    b->p[b->n++] = c;
}
static void tb_varint(TbBuf* b, uint64_t v) {
    do {
        tb_byte(b, (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
        v >>= 7;
    } while (v);
}
static void tb_fixed(TbBuf* b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) tb_byte(b, (unsigned char)(v >> (8 * i)));
}
static void tb_bytes(TbBuf* b, int field, const void* data, size_t n) {  // wire type 2
    tb_varint(b, (uint64_t)field << 3 | 2);
    tb_varint(b, n);
    for (size_t i = 0; i < n; i++) tb_byte(b, ((const unsigned char*)data)[i]);
}

// Event{wall_time = 1, step = 2, file_version = 3 | summary = 5}; Summary{repeated Value value = 1};
// Value{tag = 1, simple_value = 2}.
static size_t tb_event(unsigned char* out, size_t cap, int step, const char* file_version, const TbScalar* v, int n) {
    TbBuf e = {out, 0, cap};
    struct timeval now;
    gettimeofday(&now, NULL);
    double wall = (double)now.tv_sec + 1e-6 * (double)now.tv_usec;
    uint64_t bits;
    memcpy(&bits, &wall, sizeof(bits));
    tb_varint(&e, 1 << 3 | 1);
    tb_fixed(&e, bits, 8);
    tb_varint(&e, 2 << 3 | 0);
    tb_varint(&e, (uint64_t)(int64_t)step);
    if (file_version) tb_bytes(&e, 3, file_version, strlen(file_version));
    unsigned char summary_bytes[TB_MAX_EVENT], value_bytes[512];
    TbBuf summary = {summary_bytes, 0, sizeof(summary_bytes)};
    for (int i = 0; i < n; i++) {
        TbBuf value = {value_bytes, 0, sizeof(value_bytes)};
        tb_bytes(&value, 1, v[i].tag, strlen(v[i].tag));
        float f = (float)v[i].value;
        uint32_t fbits;
        memcpy(&fbits, &f, sizeof(fbits));
        tb_varint(&value, 2 << 3 | 5);
        tb_fixed(&value, fbits, 4);
        tb_bytes(&summary, 1, value.p, value.n);
    }
    if (n > 0) tb_bytes(&e, 5, summary.p, summary.n);
    return e.n;
}

// Reading: a varint at *p (below end); 0 when it runs past end.
static int tb_read_varint(const unsigned char** p, const unsigned char* end, uint64_t* v) {
    *v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        unsigned char c = *(*p)++;
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return 1;
    }
    return 0;
}

// The next field of a message: its number, and for wire type 2 its bytes; 0 at the end or on bad bytes.
static int tb_next_field(const unsigned char** p, const unsigned char* end, int* field, uint64_t* varint,
                         const unsigned char** bytes, size_t* n) {
    uint64_t key;
    if (*p >= end || !tb_read_varint(p, end, &key)) return 0;
    *field = (int)(key >> 3);
    switch (key & 7) {
        case 0: return tb_read_varint(p, end, varint);
        case 1: case 5: {
            size_t w = (key & 7) == 1 ? 8 : 4;
            if ((size_t)(end - *p) < w) return 0;
            *p += w;
            return 1;
        }
        case 2:
            if (!tb_read_varint(p, end, varint) || *varint > (uint64_t)(end - *p)) return 0;
            *bytes = *p;
            *n = (size_t)*varint;
            *p += *n;
            return 1;
        default: return 0;
    }
}

// An Event's step and its first scalar's tag (into tag; "" when it has none).
static void tb_event_step_tag(const unsigned char* p, const unsigned char* end, long long* step, char* tag, size_t tn) {
    int field;
    uint64_t v = 0;
    const unsigned char* b = NULL;
    size_t n = 0;
    *step = 0;
    tag[0] = '\0';
    while (tb_next_field(&p, end, &field, &v, &b, &n)) {
        if (field == 2) *step = (long long)v;
        if (field != 5 || tag[0]) continue;
        const unsigned char *sp = b, *send = b + n;
        while (!tag[0] && tb_next_field(&sp, send, &field, &v, &b, &n)) {
            if (field != 1) continue;
            const unsigned char *vp = b, *vend = b + n;
            while (tb_next_field(&vp, vend, &field, &v, &b, &n)) {
                if (field == 1) {
                    snprintf(tag, tn, "%.*s", (int)(n < tn ? n : tn - 1), (const char*)b);
                    break;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------- a resumed run's older files

int tensorboard_tag_at_step_start(const char* tag) {
    return strncmp(tag, "val/", 4) == 0 || strncmp(tag, "eval/", 5) == 0;
}

// The records of path that a run starting at start_step keeps: path is rewritten without
// the others (or removed when no scalar is left). A cut or corrupt record ends what is kept.
static void tb_drop_repeated(const char* path, int start_step) {
    FILE* f = fopenOwnCheck(path, "rb");
    long size = file_size_of(f, path);
    unsigned char* data = (unsigned char*)mallocCheck((size_t)size + 1);
    if (size > 0) freadCheck(data, 1, (size_t)size, f, path);
    fclose(f);
    size_t at = 0, kept_to = 0;
    int dropped = 0, scalars = 0, cut = 0;
    unsigned char* out = (unsigned char*)mallocCheck((size_t)size + 1);
    while (at < (size_t)size) {
        uint64_t len;
        uint32_t crc;
        if ((size_t)size - at < 12) { cut = 1; break; }
        memcpy(&len, data + at, 8);
        memcpy(&crc, data + at + 8, 4);
        if (crc != tb_masked_crc(data + at, 8) || len > (uint64_t)size - at - 16) { cut = 1; break; }
        memcpy(&crc, data + at + 12 + len, 4);
        if (crc != tb_masked_crc(data + at + 12, len)) { cut = 1; break; }
        long long step;
        char tag[128];
        tb_event_step_tag(data + at + 12, data + at + 12 + len, &step, tag, sizeof(tag));
        size_t record = 16 + (size_t)len;
        int repeated = tag[0] && (tensorboard_tag_at_step_start(tag) ? step >= start_step : step > start_step);
        if (repeated) dropped++;
        else {
            memcpy(out + kept_to, data + at, record);
            kept_to += record;
            scalars += tag[0] != '\0';
        }
        at += record;
    }
    if (dropped || cut) {
        if (scalars == 0) {
            if (unlink(path) != 0) fatal("cannot remove %s: %s", path, strerror(errno));
        } else {
            char tmp[PATH_MAX_LEN];
            path_format(tmp, sizeof(tmp), "%s.tmp", path);
            FILE* w = fopenOwnCheck(tmp, "wb");
            fwriteCheck(out, 1, kept_to, w, tmp);
            fcloseCheck(w, tmp);
            if (rename(tmp, path) != 0) fatal("cannot replace %s with %s: %s", path, tmp, strerror(errno));
        }
        printf("tensorboard: %s: dropped %d events after step %d, which this run logs again%s%s\n", path, dropped,
               start_step, cut ? "; a cut or corrupt record and what followed it" : "", scalars ? "" : " (removed)");
    }
    free(out);
    free(data);
}

// Every event file of dir, oldest first; a .tmp left by a rewrite cut short is removed.
static void tb_drop_repeated_in(const char* dir, int start_step) {
    DIR* d = opendir(dir);
    if (!d) fatal("cannot read the TensorBoard directory %s: %s", dir, strerror(errno));
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, TB_PREFIX, strlen(TB_PREFIX)) != 0) continue;
        char path[PATH_MAX_LEN];
        path_format(path, sizeof(path), "%s/%s", dir, e->d_name);
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0) {
            if (unlink(path) != 0) fatal("cannot remove %s: %s", path, strerror(errno));
            continue;
        }
        tb_drop_repeated(path, start_step);
    }
    closedir(d);
}

// ---------------------------------------------------------------------------- writing

static void tb_write_record(TensorBoard* tb, const unsigned char* data, size_t n) {
    if (!tb->active || tb->write_errno) return;  // after a failure, nothing more (the job is ending)
    unsigned char record[TB_MAX_EVENT + 16];
    uint64_t len = n;
    memcpy(record, &len, 8);
    uint32_t crc = tb_masked_crc(record, 8);
    memcpy(record + 8, &crc, 4);
    memcpy(record + 12, data, n);
    crc = tb_masked_crc(data, n);
    memcpy(record + 12 + n, &crc, 4);
    size_t done = 0, total = n + 16;
    while (done < total) {
        ssize_t w = write(tb->fd, record + done, total - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            tb->write_errno = w < 0 ? errno : ENOSPC;
            // Never a cut record: back to the last whole one (should this fail too, the reader stops at the cut).
            int cut_back = ftruncate(tb->fd, tb->size);
            (void)cut_back;
            return;
        }
        done += (size_t)w;
    }
    tb->size += (off_t)total;
}

void tensorboard_open(TensorBoard* tb, const char* dir, int start_step) {
    memset(tb, 0, sizeof(*tb));
    if (!dir) return;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) fatal("cannot create the TensorBoard directory %s: %s", dir, strerror(errno));
    tb_drop_repeated_in(dir, start_step);
    char host[256] = "host";
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    path_format(tb->path, sizeof(tb->path), "%s/" TB_PREFIX "%010ld.%s.%ld.0", dir, (long)time(NULL), host,
                (long)getpid());
    tb->fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (tb->fd < 0) fatal("cannot create %s: %s", tb->path, strerror(errno));
    tb->active = 1;
    unsigned char event[TB_MAX_EVENT];
    tb_write_record(tb, event, tb_event(event, sizeof(event), 0, "brain.Event:2", NULL, 0));
    tensorboard_check(tb);
}

void tensorboard_write(TensorBoard* tb, int step, const TbScalar* values, int n) {
    if (!tb->active) return;
    unsigned char event[TB_MAX_EVENT];
    tb_write_record(tb, event, tb_event(event, sizeof(event), step, NULL, values, n));
}

void tensorboard_check(const TensorBoard* tb) {
    if (tb->write_errno) {
        fatal("cannot write %s: %s (its last events are lost; free space and resume with -y 1)", tb->path,
              strerror(tb->write_errno));
    }
}

void tensorboard_close(TensorBoard* tb) {
    if (tb->active && close(tb->fd) != 0 && !tb->write_errno) tb->write_errno = errno;
    tb->active = 0;
    tensorboard_check(tb);
}
