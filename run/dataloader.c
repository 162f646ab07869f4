// run/dataloader.c: what run/dataloader.h declares.
#include "run/dataloader.h"

#include "run/seams.h"

// Reads and checks a shard header; returns its token count. The count (a non-negative
// int32, so at most 2^31-1 tokens) must describe the file's size exactly. *crc: the
// header's CRC32C.
static size_t shard_check_header(FILE* f, const char* path, uint32_t* crc) {
    int header[SHARD_HEADER_INTS];
    long size = file_size_of(f, path);
    if (size < (long)sizeof(header)) fatal("%s: too small to be a token shard (%ld bytes)", path, size);
    freadCheck(header, sizeof(int), SHARD_HEADER_INTS, f, path);
    *crc = crc32c_update(0, header, sizeof(header));
    if (header[0] != SHARD_MAGIC) {
        fatal("%s: not a token shard (magic %d, expected %d)", path, header[0], SHARD_MAGIC);
    }
    if (header[1] != SHARD_VERSION) fatal("%s: unsupported shard version %d (expected %d)", path, header[1], SHARD_VERSION);
    size_t ntok = (size_t)field_range_check(path, "header field token count", header[2], 0, INT32_MAX);
    size_t expected = size_add_check(sizeof(header), size_mul_check(ntok, sizeof(uint16_t), path), path);
    if ((size_t)size != expected) {
        fatal("%s: header field token count = %zu needs %zu bytes, but the file has %ld (truncated or corrupt)", path,
              ntok, expected, size);
    }
    return ntok;
}

// Scans every token of an open shard (positioned after the header); returns the index of
// the first id >= vocab_size (its id in *bad_id), or ntok. *crc continues with the tokens'
// bytes, so that a manifest's checksum can speak first about a damaged shard.
static size_t shard_scan_tokens(FILE* f, const char* path, size_t ntok, int vocab_size, uint32_t* crc,
                                int* bad_id) {
    enum { CHUNK = 1 << 16 };
    uint16_t* buf = (uint16_t*)mallocCheck(CHUNK * sizeof(uint16_t));
    size_t bad = ntok;
    for (size_t done = 0; done < ntok;) {
        size_t n = ntok - done < CHUNK ? ntok - done : CHUNK;
        freadCheck(buf, sizeof(uint16_t), n, f, path);
        *crc = crc32c_update(*crc, buf, n * sizeof(uint16_t));
        for (size_t i = 0; i < n && bad == ntok; i++) {
            if (buf[i] >= vocab_size) {
                bad = done + i;
                *bad_id = buf[i];
            }
        }
        done += n;
    }
    free(buf);
    return bad;
}

// A permutation of 0..n-1 (Fisher-Yates) from the stream of (seed, epoch, what): the same
// on every rank and in every run with the seed.
static void dataloader_permutation(uint64_t seed, size_t epoch, uint64_t what, size_t n, void* out,
                                   int wide) {
    uint64_t state = rng_seed(rng_seed(rng_seed(seed) ^ epoch) ^ what);
    for (size_t i = 0; i < n; i++) {
        if (wide) ((size_t*)out)[i] = i;
        else ((uint32_t*)out)[i] = (uint32_t)i;
    }
    for (size_t i = n; i > 1; i--) {
        uint64_t r = ((uint64_t)rng_u32(&state) << 32) | rng_u32(&state);
        size_t j = (size_t)(r % i);  // the modulo bias is below 2^-30 for any shard
        if (wide) {
            size_t* a = (size_t*)out;
            size_t t = a[i - 1]; a[i - 1] = a[j]; a[j] = t;
        } else {
            uint32_t* a = (uint32_t*)out;
            uint32_t t = a[i - 1]; a[i - 1] = a[j]; a[j] = t;
        }
    }
}

static size_t dataloader_rows_per_micro_step(const DataLoader* d) { return (size_t)d->world * d->B; }

static void dataloader_open_shard(DataLoader* d, size_t index) {
    if (d->file) fcloseCheck(d->file, "token shard");
    const char* path = d->files.gl_pathv[index];
    d->file = fopenCheck(path, "rb");
    shard_check_identity(&d->checks[index], d->file, path);
    uint32_t crc;
    int bad_id = 0;
    d->shard_tokens = shard_check_header(d->file, path, &crc);
    size_t bad = shard_scan_tokens(d->file, path, d->shard_tokens, d->vocab_size, &crc, &bad_id);
    shard_check_content(&d->checks[index], path, SHARD_HEADER_INTS * sizeof(int) + d->shard_tokens * sizeof(uint16_t), crc);
    d->checks[index].content_crc = crc;
    d->checks[index].content_read = 1;
    if (bad < d->shard_tokens) {
        fatal("%s: token %zu has id %d, not below the vocabulary size %d", path, bad, bad_id, d->vocab_size);
    }
    size_t rows = d->shard_tokens > 0 ? (d->shard_tokens - 1) / d->T : 0;
    size_t round = d->row_order || d->micro_steps ? d->rows_per_step : dataloader_rows_per_micro_step(d);
    if (rows < round && !d->row_order && !d->micro_steps) {
        fatal("%s: %zu tokens, but one step of %d ranks x B=%d x T=%d needs %zu; use a larger shard or smaller -b/-t",
              path, d->shard_tokens, d->world, d->B, d->T, round * d->T + 1);
    }
    if (rows < round) {
        fatal("%s: %zu tokens, but %s reads whole optimizer steps, and one of %zu rows of T=%d needs %zu; use a "
              "larger shard or a smaller batch", path, d->shard_tokens, d->row_order ? "--shuffle" : "--dp-invariant",
              round, d->T, round * d->T + 1);
    }
    d->rows_used = rows / round * round;
    if (d->row_order) {
        free(d->row_order);
        d->row_order = (uint32_t*)mallocCheck(rows * sizeof(uint32_t));
        dataloader_permutation(d->seed, d->epoch, 1 + (uint64_t)index, rows, d->row_order, 0);
    }
    d->shard_index = index;
    d->window_index = 0;
}

// The shard at place pos of epoch e's order.
static void dataloader_enter(DataLoader* d, size_t epoch, size_t pos) {
    if (d->shard_order && epoch != d->epoch) dataloader_permutation(d->seed, epoch, 0, d->num_shards, d->shard_order, 1);
    d->epoch = epoch;
    d->order_pos = pos;
    dataloader_open_shard(d, d->shard_order ? d->shard_order[pos] : pos);
}

// No shard matches pattern: the default tinyshakespeare paths come from `make data`; for
// any other pattern, say what its directory holds (a corpus with no train split shows
// itself there by its val shards alone).
static void dataloader_no_shard(const char* pattern) {
    if (strncmp(pattern, "data/tinyshakespeare_", 21) == 0) {
        fatal("no token shard matches '%s' (run `make data` to prepare tinyshakespeare, or pass -i/-j)", pattern);
    }
    const char* slash = strrchr(pattern, '/');
    char dir[PATH_MAX_LEN];
    snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash == pattern ? 1 : slash - pattern) : 1, slash ? pattern : ".");
    DIR* dh = strpbrk(dir, "*?[") ? NULL : opendir(dir);
    if (dh == NULL) fatal("no token shard matches '%s' (no directory '%s')", pattern, dir);
    char found[512] = "";
    int shards = 0;
    for (struct dirent* e; (e = readdir(dh)) != NULL;) {
        size_t n = strlen(e->d_name), len = strlen(found);
        if (n < 4 || strcmp(e->d_name + n - 4, ".bin") != 0) continue;
        if (shards++ < 4) snprintf(found + len, sizeof(found) - len, "%s%s", len ? ", " : "", e->d_name);
    }
    closedir(dh);
    if (shards == 0) fatal("no token shard matches '%s': '%s' holds no .bin file", pattern, dir);
    fatal("no token shard matches '%s': '%s' holds %d other .bin file%s (%s%s)", pattern, dir, shards,
          shards == 1 ? "" : "s", found, shards > 4 ? ", ..." : "");
}

void dataloader_init(DataLoader* d, const char* pattern, int B, int T, int rank, int world,
                     int vocab_size) {
    memset(d, 0, sizeof(*d));
    d->B = B;
    d->T = T;
    d->rank = rank;
    d->world = world;
    d->vocab_size = vocab_size;
    // A pattern that names an existing file is that file, glob characters and all: 'g[1]/x.bin'
    // is not g1/x.bin when g[1]/x.bin exists. Its metacharacters are escaped for glob and fnmatch.
    char literal[2 * PATH_MAX_LEN];
    struct stat st;
    if (strpbrk(pattern, "*?[\\") && stat(pattern, &st) == 0 && strlen(pattern) < PATH_MAX_LEN) {
        size_t k = 0;
        for (const char* c = pattern; *c; c++) {
            if (strchr("*?[\\", *c)) literal[k++] = '\\';
            literal[k++] = *c;
        }
        literal[k] = '\0';
        pattern = literal;
    }
    int rc = glob(pattern, 0, NULL, &d->files);
    if (rc != 0 || d->files.gl_pathc == 0) dataloader_no_shard(pattern);
    d->num_shards = d->files.gl_pathc;
    d->checks = shard_manifest_check(&d->files, pattern, rank);
    d->window = (uint16_t*)mallocCheck(((size_t)B * T + 1) * sizeof(uint16_t));
    d->inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    d->targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    dataloader_open_shard(d, 0);
}

static void dataloader_require_split(const DataLoader* d, const char* split, const char* option, const char* pattern) {
    for (size_t k = 0; k < d->num_shards; k++) {
        const ShardCheck* c = &d->checks[k];
        if (!c->manifest || strcmp(c->split, split) == 0) continue;
        fatal("%s '%s' matches %s, which %s lists as a %s shard: %s takes %s shards (-i train, -j val); narrow the "
              "pattern", option, pattern, d->files.gl_pathv[k], c->manifest, c->split, option, split);
    }
}

void dataloader_check_roles(const DataLoader* train, const DataLoader* val, const char* train_pattern,
                            const char* val_pattern, int allow_overlap) {
    dataloader_require_split(train, "train", "-i", train_pattern);
    if (!val) return;
    dataloader_require_split(val, "val", "-j", val_pattern);
    for (size_t i = 0; i < train->num_shards && !allow_overlap; i++) {
        for (size_t j = 0; j < val->num_shards; j++) {
            if (train->checks[i].dev != val->checks[j].dev || train->checks[i].ino != val->checks[j].ino) continue;
            fatal("-i '%s' and -j '%s' both read %s: a validation loss on training data says nothing of how the model "
                  "generalizes; give -j other shards, or --allow-train-val-overlap if it is meant", train_pattern,
                  val_pattern, train->files.gl_pathv[i]);
        }
    }
}

void dataloader_identity(const DataLoader* d, DataIdentity* id) {
    memset(id, 0, sizeof(*id));
    snprintf(id->corpus, sizeof(id->corpus), "-");
    id->shards = d->num_shards;
    id->digest = FNV1A_START;
    for (size_t k = 0; k < d->num_shards; k++) {
        const ShardCheck* c = &d->checks[k];
        if (c->manifest) data_corpus_of_manifest(c->manifest, id->corpus);
        uint32_t crc = c->manifest ? c->crc : k == 0 && c->content_read ? c->content_crc : 0;
        id->digest = data_digest_add(id->digest, c->manifest ? c->bytes : (uint64_t)c->size, crc);
    }
}

void dataloader_shuffle(DataLoader* d, uint64_t seed, size_t rows_per_step) {
    d->seed = seed;
    d->rows_per_step = rows_per_step;
    d->shard_order = (size_t*)mallocCheck(d->num_shards * sizeof(size_t));
    d->row_order = (uint32_t*)mallocCheck(sizeof(uint32_t));  // grown by dataloader_open_shard
    dataloader_permutation(seed, 0, 0, d->num_shards, d->shard_order, 1);
    d->epoch = 0;
    d->order_pos = 0;
    dataloader_open_shard(d, d->shard_order[0]);
}

void dataloader_rank_major(DataLoader* d, int micro_steps) {
    d->micro_steps = micro_steps;
    d->rows_per_step = dataloader_rows_per_micro_step(d) * (size_t)micro_steps;
    dataloader_open_shard(d, d->shard_index);  // its rows in whole steps
}

// The first row of this rank's next micro-batch in the shard's order.
static size_t dataloader_first_row(const DataLoader* d) {
    size_t i = d->window_index, N = (size_t)d->world, r = (size_t)d->rank;
    if (!d->micro_steps) return (i * N + r) * d->B;
    size_t k = (size_t)d->micro_steps;
    return ((i / k * N + r) * k + i % k) * d->B;
}

// Number of micro-steps (of all ranks together) one pass over the current shard gives.
static size_t dataloader_windows_per_shard(const DataLoader* d) {
    return d->rows_used / dataloader_rows_per_micro_step(d);
}

static void dataloader_read(DataLoader* d, size_t token, size_t count, uint16_t* out) {
    fseekCheck(d->file, (long)(SHARD_HEADER_INTS * sizeof(int) + token * sizeof(uint16_t)), SEEK_SET, "token shard");
    freadCheck(out, sizeof(uint16_t), count, d->file, d->files.gl_pathv[d->shard_index]);
}

// Past the current shard's last whole round: on to the next shard of the order, and after
// the last one, to the next epoch.
static void dataloader_enter_next_if_done(DataLoader* d) {
    if (d->window_index < dataloader_windows_per_shard(d)) return;
    size_t pos = d->order_pos + 1, epoch = d->epoch;
    if (pos == d->num_shards) {
        pos = 0;
        epoch++;
    }
    dataloader_enter(d, epoch, pos);
}

void dataloader_next_batch(DataLoader* d) {
    dataloader_enter_next_if_done(d);
    size_t T = (size_t)d->T, first_row = dataloader_first_row(d);
    for (int b = 0; b < d->B; b++) {
        uint16_t* row = d->window + (size_t)b * T;  // row b's T+1 tokens; b > 0 overwrites row b-1's extra one
        if (!d->row_order) {  // file order: the B rows are contiguous, one read
            if (b == 0) dataloader_read(d, first_row * T, (size_t)d->B * T + 1, d->window);
            row = d->window + (size_t)b * T;
        } else {
            dataloader_read(d, (size_t)d->row_order[first_row + b] * T, T + 1, row);
        }
        if (d->trace) {
            size_t index = d->row_order ? d->row_order[first_row + b] : first_row + b;
            fprintf(d->trace, "%zu %zu %zu\n", d->epoch, d->shard_index, index);
        }
        for (size_t t = 0; t < T; t++) {
            d->inputs[b * T + t] = row[t];
            d->targets[b * T + t] = row[t + 1];
        }
    }
    d->window_index++;
}

size_t dataloader_batches_per_epoch(const DataLoader* d) {
    size_t batches = 0, round = dataloader_rows_per_micro_step(d);
    for (size_t k = 0; k < d->num_shards; k++) {
        size_t bytes = (size_t)d->checks[k].size, header = SHARD_HEADER_INTS * sizeof(int);
        size_t tokens = bytes > header ? (bytes - header) / sizeof(uint16_t) : 0;
        size_t rows = tokens > 0 ? (tokens - 1) / d->T : 0;
        batches += rows / round * d->world;
    }
    return batches;
}

void dataloader_skip(DataLoader* d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dataloader_enter_next_if_done(d);
        d->window_index++;
    }
}

void dataloader_trace(DataLoader* d) { d->trace = seam_data_trace(d->rank); }

void dataloader_reset(DataLoader* d) {
    if (d->epoch != 0 || d->order_pos != 0) dataloader_enter(d, 0, 0);
    d->window_index = 0;
}

DataPosition dataloader_position(const DataLoader* d) {
    DataPosition p = {d->epoch, d->shard_index, d->window_index * dataloader_rows_per_micro_step(d) * d->T};
    return p;
}

void dataloader_seek(DataLoader* d, DataPosition p) {
    size_t per_window = dataloader_rows_per_micro_step(d) * d->T;
    if (p.shard >= d->num_shards) fatal("data position names shard %zu but only %zu match", p.shard, d->num_shards);
    size_t pos = p.shard;
    if (d->shard_order) {  // the shard's place in the saved epoch's order
        dataloader_permutation(d->seed, p.epoch, 0, d->num_shards, d->shard_order, 1);
        for (pos = 0; d->shard_order[pos] != p.shard; pos++) {}
    }
    d->epoch = p.epoch;
    d->order_pos = pos;
    dataloader_open_shard(d, p.shard);
    // A saved position is always inside its shard's rows (at most at their end: the move to
    // the next shard comes with the next batch); beyond them, the data changed since.
    if (p.tokens_done > d->rows_used * d->T) {
        fatal("data position: token %zu of shard %zu (%s), which has only %zu tokens in whole rounds: not the data of "
              "the saved run", p.tokens_done, p.shard, d->files.gl_pathv[p.shard], d->rows_used * d->T);
    }
    if (p.tokens_done % per_window != 0) {
        fatal("cannot resume at token %zu of shard %zu with ranks*B*T = %zu tokens per micro-step: "
              "choose -b/-t/ranks so that it divides", p.tokens_done, p.shard, per_window);
    }
    d->window_index = p.tokens_done / per_window;
}

void dataloader_free(DataLoader* d) {
    if (d->file) fclose(d->file);
    if (d->trace) fclose(d->trace);
    free(d->shard_order);
    free(d->row_order);
    shard_checks_free(d->checks, d->num_shards);
    globfree(&d->files);
    free(d->window);
    free(d->inputs);
    free(d->targets);
    memset(d, 0, sizeof(*d));
}
