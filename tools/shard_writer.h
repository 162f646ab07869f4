/*
 * Writes llm.c token shards as a stream of ids, and their manifest; shared by the data
 * tools (tools/prepro_text.c, tools/prepro_corpus.c).
 *
 *   ShardWriter w;
 *   shard_writer_init(&w, dir, name, shard_tokens, val_tokens, numbered, vocab_size);
 *   shard_writer_push(&w, ids, n);        // any number of times, in corpus order
 *   shard_writer_finish(&w);              // closes the last shard
 *   shard_writer_write_manifest(&w, tool, extra);   // DIR/NAME_manifest.txt, last
 *
 * The first val_tokens ids are the val split, the rest train, and each split is cut into
 * shards of at most shard_tokens ids (a document may straddle two shards, as in llm.c).
 * Names: numbered, NAME_val_000000.bin, NAME_train_000001.bin, ... (one index over both
 * splits, so val is shard 0 as llm.c's FineWeb shards have it, and no empty shard is
 * written); unnumbered, exactly NAME_val.bin and NAME_train.bin, either possibly empty
 * (prepro_text's one-file splits, shard_tokens unlimited).
 *
 * A shard is written to NAME....bin.tmp with a placeholder header, its count filled in
 * when it is complete; it keeps that name until the whole corpus is written, so that no
 * name a trainer's glob (NAME_train_*.bin) matches exists before the corpus does. Then the
 * commit: the manifest is written and renamed into place first, the shards after it. A
 * process killed at any moment (kill -9 included) thus leaves either temporaries only, or
 * a manifest with its shards, some possibly still under their temporary names: the
 * trainer refuses that (run/shard_manifest.h: a shard of the manifest is missing) and
 * prepro_corpus's next run removes it. Each shard's CRC32C is computed as the ids stream
 * through (the header's CRC combined with the body's), so the manifest costs no second
 * read. shard_writer_abandon() removes this writer's temporaries, and during the commit
 * its manifest and shards too: a run that fails leaves nothing a trainer could mistake for
 * a prepared corpus; it is safe from an atexit handler and from a signal handler (unlink
 * only, on names prepared in advance).
 *
 * Manifest (DIR/NAME_manifest.txt, written to a temporary name and renamed), one item a
 * line, fields space separated, a file name always last so it may hold spaces:
 *   llmc-shards 1 TOOL
 *   shard val|train TOKENS BYTES CRC32C(8 hex) FILE      one line per shard, in order
 *   ... EXTRA lines from the caller (prepro_corpus: "input ..." per input)
 *   total SHARDS TOKENS VAL_TOKENS TRAIN_TOKENS
 */
#ifndef LLMC_SHARD_WRITER_H
#define LLMC_SHARD_WRITER_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "run/crc32c.h"
#include "run/run_dir.h"
#include "run/files.h"
#include "tools/bpe.h"

#define SHARD_FILE_MAGIC 20240520
#define SHARD_FILE_VERSION 1
#define SHARD_FILE_HEADER_BYTES 1024  // int32 header[256]
#define TOKENIZER_FILE_MAGIC 20240328
#define TOKENIZER_FILE_VERSION 2

typedef struct {
    char* path;  // final name (allocated, kept for the manifest and abandon)
    char* tmp;   // its temporary name until the commit (allocated)
    int val;
    size_t tokens;
    uint64_t bytes;
    uint32_t crc;
} ShardDone;

typedef struct {
    const char* dir;
    const char* name;
    size_t shard_tokens;  // ids per shard at most
    size_t val_tokens;    // the first ids that go to val
    int numbered;
    int vocab_size;
    // the shard being written
    FILE* f;
    char path[PATH_MAX_LEN];
    char tmp[PATH_MAX_LEN];
    volatile int tmp_live;  // tmp exists on disk (read by abandon, maybe from a signal handler)
    int cur_val;
    size_t cur_tokens;
    uint32_t body_crc;
    uint16_t buf[8192];
    size_t buf_len;
    // the shards written so far
    ShardDone* done;
    volatile size_t n_done;
    size_t cap_done;
    size_t total_tokens, val_written;
    int next_index;
    char manifest[PATH_MAX_LEN], manifest_tmp[PATH_MAX_LEN];
    volatile int committing;  // the manifest and shards are being renamed into place
    int finished;
} ShardWriter;

static inline char* copy_text(const char* s) {
    size_t n = strlen(s) + 1;
    char* p = (char*)mallocCheck(n);
    memcpy(p, s, n);
    return p;
}

static inline void shard_make_dir(const char* dir) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) fatal("output directory '%s' exists and is not a directory", dir);
        return;
    }
    make_parent_dirs(dir, "--out-dir");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) fatal("cannot create output directory '%s': %s", dir, strerror(errno));
}

// Base name of a path, for the manifest (shards sit next to it).
static inline const char* shard_base_name(const char* path) {
    const char* slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static inline void shard_writer_init(ShardWriter* w, const char* dir, const char* name, size_t shard_tokens,
                                     size_t val_tokens, int numbered, int vocab_size) {
    memset(w, 0, sizeof(*w));
    if (shard_tokens == 0 || shard_tokens > INT32_MAX) fatal("shard size %zu outside 1..%d tokens", shard_tokens, INT32_MAX);
    if (vocab_size > 65536) fatal("vocab size %d does not fit uint16 token ids", vocab_size);
    w->dir = dir;
    w->name = name;
    w->shard_tokens = shard_tokens;
    w->val_tokens = val_tokens;
    w->numbered = numbered;
    w->vocab_size = vocab_size;
    w->cap_done = 64;
    w->done = (ShardDone*)callocCheck(w->cap_done, sizeof(ShardDone));
    path_format(w->manifest, sizeof(w->manifest), "%s/%s_manifest.txt", dir, name);
    path_format(w->manifest_tmp, sizeof(w->manifest_tmp), "%s.tmp", w->manifest);
}

// Removes the shard being written and every completed one, and during the commit the
// manifest and the shards' final names. Only unlink(): callable from a signal handler (the
// names exist before they are counted).
static inline void shard_writer_abandon(ShardWriter* w) {
    if (w->finished) return;
    if (w->tmp_live) unlink(w->tmp);
    w->tmp_live = 0;
    unlink(w->manifest_tmp);
    if (w->committing) unlink(w->manifest);
    for (size_t k = 0; k < w->n_done; k++) {
        unlink(w->done[k].tmp);
        if (w->committing) unlink(w->done[k].path);
    }
    w->n_done = 0;
}

static inline void shard_header(int32_t header[256], size_t count) {
    memset(header, 0, 256 * sizeof(int32_t));
    header[0] = SHARD_FILE_MAGIC;
    header[1] = SHARD_FILE_VERSION;
    header[2] = (int32_t)count;
}

static inline void shard_writer_open_next(ShardWriter* w, int val) {
    const char* split = val ? "val" : "train";
    if (w->numbered) {
        path_format(w->path, sizeof(w->path), "%s/%s_%s_%06d.bin", w->dir, w->name, split, w->next_index);
    } else {
        path_format(w->path, sizeof(w->path), "%s/%s_%s.bin", w->dir, w->name, split);
    }
    w->next_index++;
    path_format(w->tmp, sizeof(w->tmp), "%s.tmp", w->path);
    run_dir_require();  // where the tool locked its directory: it is still the one locked
    w->tmp_live = 1;  // before fopen: a file half-created by a failing fopen is removed too
    w->f = fopenCheck(w->tmp, "wb");
    int32_t header[256];
    shard_header(header, 0);  // the count is written when the shard is complete
    fwriteCheck(header, sizeof(int32_t), 256, w->f, w->tmp);
    w->cur_val = val;
    w->cur_tokens = 0;
    w->body_crc = 0;
    w->buf_len = 0;
}

static inline void shard_writer_flush(ShardWriter* w) {
    if (w->buf_len == 0) return;
    fwriteCheck(w->buf, sizeof(uint16_t), w->buf_len, w->f, w->tmp);
    w->body_crc = crc32c_update(w->body_crc, w->buf, w->buf_len * sizeof(uint16_t));
    w->buf_len = 0;
}

static inline void shard_writer_close_current(ShardWriter* w) {
    shard_writer_flush(w);
    int32_t header[256];
    shard_header(header, w->cur_tokens);
    fseekCheck(w->f, 0, SEEK_SET, w->tmp);
    fwriteCheck(header, sizeof(int32_t), 256, w->f, w->tmp);
    // A shard renamed into place must be on disk, not only in the page cache.
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) fatal("%s: write failed: %s", w->tmp, strerror(errno));
    fcloseCheck(w->f, w->tmp);
    w->f = NULL;
    if (w->n_done == w->cap_done) {
        ShardDone* grown = (ShardDone*)callocCheck(w->cap_done * 2, sizeof(ShardDone));
        memcpy(grown, w->done, w->cap_done * sizeof(ShardDone));
        ShardDone* old = w->done;
        w->done = grown;  // a signal handler sees either array whole
        w->cap_done *= 2;
        free(old);
    }
    ShardDone* d = &w->done[w->n_done];
    d->path = copy_text(w->path);
    d->tmp = copy_text(w->tmp);
    d->val = w->cur_val;
    d->tokens = w->cur_tokens;
    d->bytes = SHARD_FILE_HEADER_BYTES + (uint64_t)w->cur_tokens * sizeof(uint16_t);
    d->crc = crc32c_combine(crc32c_update(0, header, sizeof(header)), w->body_crc, (size_t)(d->bytes - sizeof(header)));
    w->n_done++;  // counted before tmp_live is cleared: abandon always sees the file
    w->tmp_live = 0;
}

// Appends ids in corpus order, opening and closing shards at the split and size limits.
static inline void shard_writer_push(ShardWriter* w, const int* ids, size_t n) {
    for (size_t k = 0; k < n; k++) {
        int val = w->total_tokens < w->val_tokens;
        if (w->f != NULL && w->cur_tokens == w->shard_tokens && !w->numbered && w->cur_val == val) {
            fatal("%s: more than %zu tokens do not fit one shard", w->path, w->shard_tokens);
        }
        if (w->f != NULL && (w->cur_val != val || w->cur_tokens == w->shard_tokens)) shard_writer_close_current(w);
        if (w->f == NULL) shard_writer_open_next(w, val);
        int id = ids[k];
        if (id < 0 || id >= w->vocab_size) fatal("token id %d outside the vocabulary of %d", id, w->vocab_size);
        w->buf[w->buf_len++] = (uint16_t)id;
        if (w->buf_len == sizeof(w->buf) / sizeof(w->buf[0])) shard_writer_flush(w);
        w->cur_tokens++;
        w->total_tokens++;
        w->val_written += val;
    }
}

static inline void shard_writer_finish(ShardWriter* w) {
    if (w->f != NULL) shard_writer_close_current(w);
    if (!w->numbered) {  // one file per split, even an empty one
        int have_val = 0, have_train = 0;
        for (size_t k = 0; k < w->n_done; k++) {
            if (w->done[k].val) have_val = 1;
            else have_train = 1;
        }
        if (!have_val) { shard_writer_open_next(w, 1); shard_writer_close_current(w); }
        if (!have_train) { shard_writer_open_next(w, 0); shard_writer_close_current(w); }
        if (!have_val && have_train) {  // val first, as in the numbered names
            ShardDone t = w->done[0]; w->done[0] = w->done[1]; w->done[1] = t;
        }
    }
}

// DIR/NAME_manifest.txt (see the top of this file), then the commit: the manifest renamed
// into place, then the shards. extra: more lines, or NULL. After this the run is complete
// and shard_writer_abandon() leaves the files alone.
static inline void shard_writer_write_manifest(ShardWriter* w, const char* tool, const char* extra) {
    const char* path = w->manifest;
    const char* tmp = w->manifest_tmp;
    run_dir_require();
    FILE* f = fopenCheck(tmp, "w");
    fprintf(f, "llmc-shards 1 %s\n", tool);
    for (size_t k = 0; k < w->n_done; k++) {
        const ShardDone* d = &w->done[k];
        fprintf(f, "shard %s %zu %llu %08x %s\n", d->val ? "val" : "train", d->tokens, (unsigned long long)d->bytes,
                (unsigned)d->crc, shard_base_name(d->path));
    }
    if (extra) fputs(extra, f);
    fprintf(f, "total %zu %zu %zu %zu\n", (size_t)w->n_done, w->total_tokens, w->val_written,
            w->total_tokens - w->val_written);
    int failed = fflush(f) != 0 || fsync(fileno(f)) != 0 || ferror(f);
    int err = errno;
    if (fclose(f) != 0 || failed) fatal("%s: write failed: %s", tmp, strerror(failed ? err : errno));
    w->committing = 1;
    if (rename(tmp, path) != 0) fatal("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    for (size_t k = 0; k < w->n_done; k++) {
        const ShardDone* d = &w->done[k];
        if (rename(d->tmp, d->path) != 0) fatal("cannot rename '%s' to '%s': %s", d->tmp, d->path, strerror(errno));
    }
    // The renames on disk, so that a crash after the exit cannot undo part of them.
    int dir_fd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0 || fsync(dir_fd) != 0) fatal("cannot sync the directory '%s': %s", w->dir, strerror(errno));
    close(dir_fd);
    w->finished = 1;
}

static inline void shard_writer_free(ShardWriter* w) {
    for (size_t k = 0; k < w->n_done; k++) {
        free(w->done[k].path);
        free(w->done[k].tmp);
    }
    free(w->done);
    w->done = NULL;
    w->n_done = 0;
}

// The llm.c tokenizer file (run/tokenizer.h reads it), written to PATH.tmp and renamed.
static inline void tokenizer_file_write(const BpeEncoder* e, const char* path) {
    uint32_t header[256] = {0};
    header[0] = TOKENIZER_FILE_MAGIC;
    header[1] = TOKENIZER_FILE_VERSION;
    header[2] = (uint32_t)e->vocab_size;
    header[3] = (uint32_t)e->eot_token;
    char tmp[PATH_MAX_LEN];
    path_format(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopenCheck(tmp, "wb");
    fwriteCheck(header, sizeof(uint32_t), 256, f, tmp);
    for (int id = 0; id < e->vocab_size; id++) {
        size_t len;
        const unsigned char* b = bpe_token_bytes(e, id, &len);
        if (len == 0 || len > 255) fatal("token %d is %zu bytes; the tokenizer file holds 1..255", id, len);
        unsigned char l = (unsigned char)len;
        fwriteCheck(&l, 1, 1, f, tmp);
        fwriteCheck(b, 1, len, f, tmp);
    }
    fcloseCheck(f, tmp);
    if (rename(tmp, path) != 0) fatal("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
}

#endif
