// run/checkpoint.c: what run/checkpoint.h declares.
#include "run/checkpoint.h"

const char* const CHECKPOINT_FILES[CHECKPOINT_NUM_FILES] = {"model.bin", "optimizer.bin", "state.txt"};

static void checkpoint_name(char* out, size_t n, int step, int temporary) {
    if (temporary) path_format(out, n, ".checkpoint_%08d.tmp", step);
    else path_format(out, n, "checkpoint_%08d", step);
}

void checkpoint_path(char* out, size_t n, const char* dir, int step, int temporary) {
    char name[64];
    checkpoint_name(name, sizeof(name), step, temporary);
    path_format(out, n, "%s/%s", dir, name);
}

// The step of a name checkpoint_name() writes (final or temporary, as asked), or -1 for
// any other name: exact digits, no sign, no overflow.
static int checkpoint_step_of_name(const char* name, int temporary) {
    const char* prefix = temporary ? ".checkpoint_" : "checkpoint_";
    size_t len = strlen(prefix);
    if (strncmp(name, prefix, len) != 0) return -1;
    char digits[16], canonical[64];
    size_t nd = strspn(name + len, "0123456789");
    if (nd == 0 || nd >= sizeof(digits)) return -1;
    memcpy(digits, name + len, nd);
    digits[nd] = '\0';
    uint64_t step;
    if (!parse_u64_strict(digits, &step) || step > INT_MAX) return -1;
    checkpoint_name(canonical, sizeof(canonical), (int)step, temporary);
    return strcmp(canonical, name) == 0 ? (int)step : -1;
}

static int checkpoint_compare_newest_first(const void* a, const void* b) {
    int x = *(const int*)a, y = *(const int*)b;
    return (x < y) - (x > y);
}

int checkpoint_list(const char* dir, int temporary, int** steps) {
    *steps = NULL;
    DIR* d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        fatal("cannot read the output directory %s: %s", dir, strerror(errno));
    }
    int count = 0, cap = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int step = checkpoint_step_of_name(e->d_name, temporary);
        if (step < 0) continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 16;
            int* grown = (int*)realloc(*steps, (size_t)cap * sizeof(int));
            if (!grown) fatal("out of memory listing %s", dir);
            *steps = grown;
        }
        (*steps)[count++] = step;
    }
    closedir(d);
    if (count > 1) qsort(*steps, (size_t)count, sizeof(int), checkpoint_compare_newest_first);
    return count;
}

// 1 for the names a checkpoint directory may hold: its files, the manifest, and side files
// named after one of the large files that a save cut short can leave behind: MPI-IO's own
// (Open MPI's "model.bin.locktest.0", made and removed while the file is opened) and an
// earlier version's "model.bin.tmp".
static int checkpoint_owns_file(const char* name) {
    for (int i = 0; i < CHECKPOINT_NUM_FILES; i++) {
        if (strcmp(name, CHECKPOINT_FILES[i]) == 0) return 1;
        size_t len = strlen(CHECKPOINT_FILES[i]);
        if (i == CHECKPOINT_STATE || strncmp(name, CHECKPOINT_FILES[i], len) != 0) continue;
        const char* side = name + len;  // exactly ".tmp" or ".locktest.DIGITS": a user's model.bin.notes stays
        if (strcmp(side, ".tmp") == 0) return 1;
        if (strncmp(side, ".locktest.", 10) == 0 && side[10] && strspn(side + 10, "0123456789") == strlen(side + 10)) return 1;
    }
    return strcmp(name, CHECKPOINT_MANIFEST) == 0;
}

int checkpoint_dir_foreign(const char* path, char* name, size_t n) {
    DIR* d = opendir(path);
    if (!d) return 0;  // checkpoint_remove_dir says why
    struct dirent* e;
    int foreign = 0;
    while (!foreign && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || checkpoint_owns_file(e->d_name)) continue;
        snprintf(name, n, "%s", e->d_name);
        foreign = 1;
    }
    closedir(d);
    return foreign;
}

int checkpoint_remove_dir(const char* path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT;
    if (S_ISLNK(st.st_mode)) {
        if (unlink(path) == 0) return 1;
        fprintf(stderr, "warning: cannot remove the symlink %s: %s\n", path, strerror(errno));
        return 0;
    }
    DIR* d = S_ISDIR(st.st_mode) ? opendir(path) : NULL;
    if (!d) {
        fprintf(stderr, "warning: not removing %s: not a directory I can read\n", path);
        return 0;
    }
    char foreign[256];
    if (checkpoint_dir_foreign(path, foreign, sizeof(foreign))) {  // first, make sure everything in it is ours
        fprintf(stderr, "warning: not removing %s: it holds '%s', which is not a checkpoint file\n", path, foreign);
        closedir(d);
        return 0;
    }
    struct dirent* e;
    int ok = 1;
    while ((e = readdir(d)) != NULL) {
        if (!checkpoint_owns_file(e->d_name)) continue;
        // Relative to the open directory, so a path that changes meanwhile cannot redirect
        // it; unlinkat removes a symlink itself and refuses a directory.
        if (unlinkat(dirfd(d), e->d_name, 0) != 0) {
            fprintf(stderr, "warning: cannot remove %s/%s: %s\n", path, e->d_name, strerror(errno));
            ok = 0;
        }
    }
    closedir(d);
    if (ok && rmdir(path) != 0) {
        fprintf(stderr, "warning: cannot remove %s: %s\n", path, strerror(errno));
        ok = 0;
    }
    return ok;
}

void checkpoint_remove_stale_temporaries(const char* dir) {
    int* steps;
    int n = checkpoint_list(dir, 1, &steps);
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX_LEN];
        checkpoint_path(path, sizeof(path), dir, steps[i], 1);
        if (checkpoint_remove_dir(path)) printf("checkpoint: removed %s, left by an interrupted save\n", path);
    }
    free(steps);
}

void checkpoint_prune(const char* dir, int keep, int newest, int vouched) {
    if (keep <= 0) return;
    int* steps;
    int n = checkpoint_list(dir, 0, &steps);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (steps[i] > newest || kept++ < keep || steps[i] == vouched) continue;
        char path[PATH_MAX_LEN];
        checkpoint_path(path, sizeof(path), dir, steps[i], 0);
        if (checkpoint_remove_dir(path)) printf("checkpoint: removed %s (-nk %d)\n", path, keep);
    }
    free(steps);
}
// The "missing file" error of a damaged checkpoint, with what to do about it.
static void checkpoint_missing_file(const char* path) LLMC_NORETURN;

static void checkpoint_missing_file(const char* path) {
    fatal("%s is missing (%s): a checkpoint is renamed into place only when complete, so this one was damaged "
          "afterwards; delete its directory to resume from the one before", path, strerror(errno));
}

// Reads a whole small text file into buf (NUL-terminated); a FIFO or a link is refused
// before it is opened (fopenOwnCheck), never waited on.
static void checkpoint_read_text(const char* path, char* buf, size_t cap) {
    struct stat st;
    if (lstat(path, &st) != 0) checkpoint_missing_file(path);
    FILE* f = fopenOwnCheck(path, "rb");
    size_t n = fread(buf, 1, cap, f);
    if (ferror(f)) fatal("%s: read failed", path);
    fclose(f);
    if (n == cap) fatal("%s: over %zu bytes: not a checkpoint file", path, cap - 1);
    buf[n] = '\0';
}

// Splits the next line off *text (NUL-terminating it in place); NULL at the end.
static char* checkpoint_next_line(char** text) {
    if (**text == '\0') return NULL;
    char* line = *text;
    char* nl = strchr(line, '\n');
    if (nl) {
        *nl = '\0';
        *text = nl + 1;
    } else {
        *text = line + strlen(line);
    }
    return line;
}

void checkpoint_fsync(const char* path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) fatal("cannot open %s to flush it: %s", path, strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL) fatal("cannot flush %s to disk: %s", path, strerror(errno));
    close(fd);
}

enum { STATE_INT, STATE_SIZE, STATE_U64, STATE_F32, STATE_WINDOW, STATE_SKIPS, STATE_NAME, STATE_WORD };
typedef struct {
    const char* key;
    size_t offset;
    int kind;
    uint64_t min, max;  // integers only
    int group;          // 0: always there; a later group: all of its fields or none (earlier versions)
} CheckpointStateField;

enum {
    STATE_GROUP_ALWAYS, STATE_GROUP_STEP_MEANING, STATE_GROUP_DATA_ORDER, STATE_GROUP_OUTLIERS, STATE_GROUP_SKIPS,
    STATE_GROUP_NONFINITE, STATE_GROUP_CORPUS, STATE_GROUP_OPTIMIZER, STATE_GROUP_MOMENTS, STATE_GROUP_SPIKES,
    STATE_NUM_GROUPS
};
#define CHECKPOINT_NUM_STATE_FIELDS ((int)(sizeof(CHECKPOINT_STATE_FIELDS) / sizeof(CHECKPOINT_STATE_FIELDS[0])))
#define STATE_FIELD(key, member, kind, min, max) {key, offsetof(CheckpointState, member), kind, min, max, 0}
#define STATE_MEANING(key, member, kind, min, max) \
    {key, offsetof(CheckpointState, member), kind, min, max, STATE_GROUP_STEP_MEANING}
#define STATE_OPTIMIZER(key, member, kind, min, max) \
    {key, offsetof(CheckpointState, member), kind, min, max, STATE_GROUP_OPTIMIZER}
#define STATE_ORDER(key, member, kind, min, max) \
    {key, offsetof(CheckpointState, member), kind, min, max, STATE_GROUP_DATA_ORDER}
static const CheckpointStateField CHECKPOINT_STATE_FIELDS[] = {
    STATE_FIELD("step", step, STATE_INT, 1, INT_MAX),  // saved after a step, never before the first
    STATE_FIELD("shard", shard, STATE_SIZE, 0, INT_MAX),
    STATE_FIELD("shard_tokens_done", shard_tokens_done, STATE_SIZE, 0, INT32_MAX),  // a shard's int32 token count
    STATE_FIELD("sample_rng", sample_rng, STATE_U64, 0, UINT64_MAX),
    STATE_FIELD("ranks", world, STATE_INT, 1, INT_MAX),
    STATE_FIELD("B", B, STATE_INT, 1, 1 << 20),  // the command line's bounds for -b, -t
    STATE_FIELD("T", T, STATE_INT, 1, 1 << 20),
    STATE_FIELD("grad_accum_steps", grad_accum_steps, STATE_INT, 1, INT_MAX),
    STATE_MEANING("max_steps", max_steps, STATE_INT, 1, INT_MAX),
    STATE_MEANING("warmup_steps", warmup_steps, STATE_INT, 0, INT_MAX),
    STATE_MEANING("overfit_single_batch", overfit_single_batch, STATE_INT, 0, 1),
    STATE_MEANING("lr", lr, STATE_F32, 0, 0),
    STATE_MEANING("final_lr_fraction", final_lr_fraction, STATE_F32, 0, 0),
    STATE_MEANING("weight_decay", weight_decay, STATE_F32, 0, 0),
    STATE_MEANING("beta1", beta1, STATE_F32, 0, 0),
    STATE_MEANING("beta2", beta2, STATE_F32, 0, 0),
    STATE_MEANING("eps", eps, STATE_F32, 0, 0),
    STATE_MEANING("grad_clip", grad_clip, STATE_F32, 0, 0),
    STATE_ORDER("shuffle", shuffle, STATE_INT, 0, 1),
    STATE_ORDER("data_seed", data_seed, STATE_INT, 0, INT_MAX),
    STATE_ORDER("epoch", epoch, STATE_SIZE, 0, INT64_MAX),
    {"loss_window", offsetof(CheckpointState, outliers.loss), STATE_WINDOW, 0, 0, STATE_GROUP_OUTLIERS},
    {"norm_window", offsetof(CheckpointState, outliers.norm), STATE_WINDOW, 0, 0, STATE_GROUP_OUTLIERS},
    {"skipped_batches", offsetof(CheckpointState, skipped), STATE_SKIPS, 0, 0, STATE_GROUP_SKIPS},
    {"nonfinite_in_a_row", offsetof(CheckpointState, nonfinite_in_a_row), STATE_INT, 0, INT_MAX, STATE_GROUP_NONFINITE},
    {"train_corpus", offsetof(CheckpointState, corpus), STATE_NAME, 0, 0, STATE_GROUP_CORPUS},
    {"train_shards", offsetof(CheckpointState, corpus_shards), STATE_SIZE, 1, INT64_MAX, STATE_GROUP_CORPUS},
    {"train_digest", offsetof(CheckpointState, corpus_digest), STATE_U64, 0, UINT64_MAX, STATE_GROUP_CORPUS},
    STATE_OPTIMIZER("optimizer", optimizer, STATE_WORD, 0, 0),
    STATE_OPTIMIZER("muon_momentum", muon_momentum, STATE_F32, 0, 0),
    STATE_OPTIMIZER("muon_nesterov", muon_nesterov, STATE_INT, 0, 1),
    STATE_OPTIMIZER("muon_ns_steps", muon_ns_steps, STATE_INT, 1, 100),  // the command line's bounds
    STATE_OPTIMIZER("muon_coefficients", muon_coefficients, STATE_WORD, 0, 0),
    STATE_OPTIMIZER("muon_scale", muon_scale, STATE_WORD, 0, 0),
    STATE_OPTIMIZER("muon_extra_scale", muon_extra_scale, STATE_F32, 0, 0),
    STATE_OPTIMIZER("muon_split_qkv", muon_split_qkv, STATE_INT, 0, 1),
    {"moments_bound", offsetof(CheckpointState, moments_bound), STATE_F32, 0, 0, STATE_GROUP_MOMENTS},
    {"spike_loss_history", offsetof(CheckpointState, outliers.good_loss), STATE_WINDOW, 0, 0, STATE_GROUP_SPIKES},
    {"spike_norm_history", offsetof(CheckpointState, outliers.good_norm), STATE_WINDOW, 0, 0, STATE_GROUP_SPIKES},
    {"spike_streak_steps", offsetof(CheckpointState, spikes.steps), STATE_INT, 0, INT_MAX, STATE_GROUP_SPIKES},
    {"spike_streak_spikes", offsetof(CheckpointState, spikes.spikes), STATE_INT, 0, INT_MAX, STATE_GROUP_SPIKES},
    {"spike_streak_first", offsetof(CheckpointState, spikes.first), STATE_INT, 0, INT_MAX, STATE_GROUP_SPIKES},
    {"spike_vouched_checkpoint", offsetof(CheckpointState, spikes.vouched), STATE_INT, 0, INT_MAX, STATE_GROUP_SPIKES},
};

void checkpoint_write_state(const char* path, const CheckpointState* s) {
    FILE* f = fopenCheck(path, "w");
    for (int i = 0; i < CHECKPOINT_NUM_STATE_FIELDS; i++) {
        const CheckpointStateField* fd = &CHECKPOINT_STATE_FIELDS[i];
        const char* p = (const char*)s + fd->offset;
        if (fd->kind == STATE_F32) {
            fprintf(f, "%s %.9g\n", fd->key, (double)*(const float*)p);
            continue;
        }
        if (fd->kind == STATE_WINDOW) {
            fprintf(f, "%s ", fd->key);
            outlier_window_format((const OutlierWindow*)p, f);
            fputc('\n', f);
            continue;
        }
        if (fd->kind == STATE_SKIPS) {
            fprintf(f, "%s ", fd->key);
            skip_batches_format((const SkipBatches*)p, f);
            fputc('\n', f);
            continue;
        }
        if (fd->kind == STATE_NAME || fd->kind == STATE_WORD) {
            fprintf(f, "%s %s\n", fd->key, p);
            continue;
        }
        uint64_t v = fd->kind == STATE_INT ? (uint64_t)*(const int*)p
                   : fd->kind == STATE_SIZE ? (uint64_t)*(const size_t*)p : *(const uint64_t*)p;
        fprintf(f, "%s %" PRIu64 "\n", fd->key, v);
    }
    fcloseCheck(f, path);
}

// A float field's value: finite, non-negative, the whole text a number.
static int checkpoint_parse_f32(const char* text, float* out) {
    char* end = NULL;
    errno = 0;
    float v = strtof(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !(v >= 0.0f) || v > FLT_MAX) return 0;
    *out = v;
    return 1;
}

static void checkpoint_read_state(const char* path, CheckpointState* s) {
    char text[CHECKPOINT_TEXT_MAX];
    checkpoint_read_text(path, text, sizeof(text));
    int seen[CHECKPOINT_NUM_STATE_FIELDS] = {0};
    char *rest = text, *line;
    memset(s, 0, sizeof(*s));
    while ((line = checkpoint_next_line(&rest)) != NULL) {
        char key[64], value[64], extra;
        int at = 0;
        if (sscanf(line, "%63s %n", key, &at) != 1) fatal("%s: malformed line '%.80s'", path, line);
        if (at != (int)strlen(key) + 1 || line[0] != key[0]) {  // as written: no number is read past a stray blank
            fatal("%s: line '%.80s' is not 'KEY VALUE' with one blank between, as the trainer writes it", path, line);
        }
        int i = 0;
        while (i < CHECKPOINT_NUM_STATE_FIELDS && strcmp(CHECKPOINT_STATE_FIELDS[i].key, key) != 0) i++;
        if (i == CHECKPOINT_NUM_STATE_FIELDS) fatal("%s: unknown field '%s'", path, key);
        const CheckpointStateField* fd = &CHECKPOINT_STATE_FIELDS[i];
        if (seen[i]++) fatal("%s: field %s appears twice", path, key);
        char* p = (char*)s + fd->offset;
        if (fd->kind == STATE_WINDOW) {  // one long value: the rest of the line
            int dropped;
            if (!outlier_window_parse(line + at, (OutlierWindow*)p, &dropped)) {
                fatal("%s: field %s = '%.60s...' is not a window of numbers", path, key, line + at);
            }
            if (dropped && utils_rank() == 0) {
                fprintf(stderr, "warning: %s: field %s holds %d non-finite values (an older build kept those of "
                        "non-finite steps): they are left out of -sl/-sg's window\n",
                        path, key, dropped);
            }
            continue;
        }
        if (fd->kind == STATE_SKIPS) {
            if (!skip_batches_parse(line + at, (SkipBatches*)p)) {
                fatal("%s: field %s = '%.60s' is not 'none' or ranges A-B,C-D", path, key, line + at);
            }
            continue;
        }
        if (sscanf(line, "%63s %63s %c", key, value, &extra) != 2) fatal("%s: malformed line '%.80s'", path, line);
        if (fd->kind == STATE_NAME) {
            if (!data_corpus_name_ok(value)) fatal("%s: field %s = '%s' is not a corpus name", path, key, value);
            snprintf(p, DATA_CORPUS_NAME_MAX, "%s", value);
            continue;
        }
        if (fd->kind == STATE_WORD) {  // the choices are checked where they are compared with the flags
            if (strlen(value) >= CHECKPOINT_WORD_MAX || strspn(value, "abcdefghijklmnopqrstuvwxyz_") != strlen(value)) {
                fatal("%s: field %s = '%s' is not a word of lower-case letters", path, key, value);
            }
            snprintf(p, CHECKPOINT_WORD_MAX, "%s", value);
            continue;
        }
        if (fd->kind == STATE_F32) {
            if (!checkpoint_parse_f32(value, (float*)p)) {
                fatal("%s: field %s = '%s' is not a finite non-negative number", path, key, value);
            }
            continue;
        }
        uint64_t v;
        if (!parse_u64_strict(value, &v) || v < fd->min || v > fd->max) {
            fatal("%s: field %s = '%s' is not an integer in %" PRIu64 "..%" PRIu64, path, key, value, fd->min, fd->max);
        }
        if (fd->kind == STATE_INT) *(int*)p = (int)v;
        else if (fd->kind == STATE_SIZE) *(size_t*)p = (size_t)v;
        else *(uint64_t*)p = v;
    }
    // A group of later fields comes all together (this version) or not at all (earlier ones).
    int group_seen[STATE_NUM_GROUPS] = {0};
    for (int i = 0; i < CHECKPOINT_NUM_STATE_FIELDS; i++) group_seen[CHECKPOINT_STATE_FIELDS[i].group] += seen[i];
    s->has_step_meaning = group_seen[STATE_GROUP_STEP_MEANING] > 0;
    s->has_data_order = group_seen[STATE_GROUP_DATA_ORDER] > 0;
    s->has_outliers = group_seen[STATE_GROUP_OUTLIERS] > 0;
    s->has_nonfinite_count = group_seen[STATE_GROUP_NONFINITE] > 0;
    s->has_corpus = group_seen[STATE_GROUP_CORPUS] > 0;
    s->has_optimizer = group_seen[STATE_GROUP_OPTIMIZER] > 0;
    s->has_moments_bound = group_seen[STATE_GROUP_MOMENTS] > 0;
    s->has_spikes = group_seen[STATE_GROUP_SPIKES] > 0;
    for (int i = 0; i < CHECKPOINT_NUM_STATE_FIELDS; i++) {
        int group = CHECKPOINT_STATE_FIELDS[i].group;
        if (!seen[i] && (group == STATE_GROUP_ALWAYS || group_seen[group])) {
            fatal("%s: field %s is missing", path, CHECKPOINT_STATE_FIELDS[i].key);
        }
    }
    // The saving run's tokens per step, in 64 bits without a wrap (each field alone is in range).
    uint64_t tokens = 0;
    if (__builtin_mul_overflow((uint64_t)s->world, (uint64_t)s->B, &tokens) ||
        __builtin_mul_overflow(tokens, (uint64_t)s->T, &tokens) ||
        __builtin_mul_overflow(tokens, (uint64_t)s->grad_accum_steps, &tokens) || tokens > INT64_MAX) {
        fatal("%s: ranks %d x B %d x T %d x grad_accum_steps %d tokens per step do not fit in 63 bits: the file was "
              "edited or damaged", path, s->world, s->B, s->T, s->grad_accum_steps);
    }
}

void checkpoint_optimizer_header(int step, int header[MODEL_HEADER_INTS]) {
    memset(header, 0, CHECKPOINT_HEADER_BYTES);
    header[0] = OPTIMIZER_MAGIC;
    header[1] = OPTIMIZER_VERSION;
    header[2] = step;
}

uint64_t checkpoint_file_bytes(int file, size_t n, const char* what) {
    size_t arrays = file == CHECKPOINT_MODEL ? 1 : 2;
    return size_add_check(CHECKPOINT_HEADER_BYTES, size_mul_check(arrays * sizeof(float), n, what), what);
}

// optimizer.bin of a checkpoint at `step` of the (checked) model cfg: the exact size and
// its header, before anything reads the arrays.
static void checkpoint_check_optimizer_file(const char* path, const GPT2Config* cfg, int step) {
    size_t n = gpt2_num_parameters(cfg);
    uint64_t expected = checkpoint_file_bytes(CHECKPOINT_OPTIMIZER, n, path);
    int header[MODEL_HEADER_INTS];
    FILE* f = fopenCheck(path, "rb");
    long size = file_size_of(f, path);
    if ((uint64_t)size != expected) {
        fatal("%s: %ld bytes, expected %" PRIu64 " for a model of %zu parameters (truncated, corrupt or of another "
              "model)", path, size, expected, n);
    }
    freadCheck(header, sizeof(int), MODEL_HEADER_INTS, f, path);
    fcloseCheck(f, path);
    if (header[0] != OPTIMIZER_MAGIC || header[1] != OPTIMIZER_VERSION) {
        fatal("%s: not an optimizer state file (magic %d version %d, expected %d version %d)", path, header[0],
              header[1], OPTIMIZER_MAGIC, OPTIMIZER_VERSION);
    }
    if (header[2] != step) fatal("%s: header field step = %d, but its checkpoint is at step %d", path, header[2], step);
}

void checkpoint_write_manifest(const char* dir, const CheckpointManifest* m) {
    char path[PATH_MAX_LEN];
    path_format(path, sizeof(path), "%s/%s", dir, CHECKPOINT_MANIFEST);
    FILE* f = fopenCheck(path, "w");
    for (int i = 0; i < CHECKPOINT_NUM_FILES; i++) {
        fprintf(f, "%s %" PRIu64 " %08" PRIx32 "\n", CHECKPOINT_FILES[i], m->bytes[i], m->crc[i]);
    }
    fcloseCheck(f, path);
    checkpoint_fsync(path);
}

void checkpoint_read_manifest(const char* dir, CheckpointManifest* m) {
    char path[PATH_MAX_LEN], text[CHECKPOINT_TEXT_MAX];
    path_format(path, sizeof(path), "%s/%s", dir, CHECKPOINT_MANIFEST);
    checkpoint_read_text(path, text, sizeof(text));
    int seen[CHECKPOINT_NUM_FILES] = {0};
    char *rest = text, *line;
    while ((line = checkpoint_next_line(&rest)) != NULL) {
        char name[64], size_text[32], crc_text[16], extra;
        uint64_t size;
        if (sscanf(line, "%63s %31s %15s %c", name, size_text, crc_text, &extra) != 3 ||
            !parse_u64_strict(size_text, &size) || strlen(crc_text) != 8 || strspn(crc_text, "0123456789abcdef") != 8) {
            fatal("%s: malformed line '%.80s' (expected: file bytes crc32c)", path, line);
        }
        int i = 0;
        while (i < CHECKPOINT_NUM_FILES && strcmp(CHECKPOINT_FILES[i], name) != 0) i++;
        if (i == CHECKPOINT_NUM_FILES) fatal("%s: lists '%s', which is not a checkpoint file", path, name);
        if (seen[i]++) fatal("%s: lists %s twice", path, name);
        m->bytes[i] = size;
        m->crc[i] = (uint32_t)strtoul(crc_text, NULL, 16);
    }
    for (int i = 0; i < CHECKPOINT_NUM_FILES; i++) {
        if (!seen[i]) fatal("%s: does not list %s", path, CHECKPOINT_FILES[i]);
    }
    for (int i = 0; i < CHECKPOINT_NUM_FILES; i++) {
        path_format(path, sizeof(path), "%s/%s", dir, CHECKPOINT_FILES[i]);
        struct stat st;
        if (lstat(path, &st) != 0) checkpoint_missing_file(path);
        const char* kind = file_kind_of_mode(st.st_mode);  // a FIFO's size 0 is no truncation
        if (kind) fatal("%s is %s, not a regular file: a checkpoint holds regular files only", path, kind);
        if ((uint64_t)st.st_size != m->bytes[i]) {
            fatal("%s: %lld bytes, manifest says %" PRIu64 ": the file is truncated or corrupt", path,
                  (long long)st.st_size, m->bytes[i]);
        }
    }
}

void checkpoint_checksum_mismatch(const char* path, uint32_t crc, uint32_t expected) {
    fatal("%s: checksum mismatch (CRC32C %08" PRIx32 ", manifest says %08" PRIx32 "): the file is corrupt", path, crc,
          expected);
}

int checkpoint_find_latest(const char* dir, char* path, size_t n) {
    int* steps;
    int count = checkpoint_list(dir, 0, &steps);
    int best = count > 0 ? steps[0] : -1;
    free(steps);
    if (best >= 0) checkpoint_path(path, n, dir, best, 0);
    return best;
}

static const char* checkpoint_shape_text(const GPT2Config* c, char* buf, size_t n) {
    snprintf(buf, n, "L=%d NH=%d C=%d V=%d Vp=%d maxT=%d", c->num_layers, c->num_heads, c->channels, c->vocab_size,
             c->padded_vocab_size, c->max_seq_len);
    return buf;
}

int checkpoint_open_for_resume(const char* out_dir, const GPT2Config* run_shape, const char* run_model,
                               char* dir, size_t n, CheckpointState* state,
                               CheckpointManifest* manifest) {
    int step = checkpoint_find_latest(out_dir, dir, n);
    if (step < 0) {
        if (utils_rank() == 0) printf("resume: no checkpoint in %s yet; starting from step 0\n", out_dir);
        return 0;
    }
    struct stat st;  // the job's own files are never read through a link (run/files.h): its checkpoints neither
    if (lstat(dir, &st) == 0 && S_ISLNK(st.st_mode)) {
        fatal("resume: %s is a symbolic link, not a directory of -o's own: a checkpoint is read only where the run "
              "saved it; copy it into -o instead", dir);
    }
    checkpoint_read_manifest(dir, manifest);
    char path[PATH_MAX_LEN], saved_text[128], run_text[128];
    path_format(path, sizeof(path), "%s/%s", dir, CHECKPOINT_FILES[CHECKPOINT_STATE]);
    size_t bytes;
    uint32_t crc = crc32c_file(path, &bytes);
    if (crc != manifest->crc[CHECKPOINT_STATE]) checkpoint_checksum_mismatch(path, crc, manifest->crc[CHECKPOINT_STATE]);
    path_format(path, sizeof(path), "%s/%s", dir, CHECKPOINT_FILES[CHECKPOINT_MODEL]);
    GPT2Config saved;
    gpt2_model_file_shape(path, &saved);
    if (!gpt2_config_equal(&saved, run_shape)) {
        fatal("resume: %s is a model with %s, but this run's -e %s has %s: the checkpoint belongs to another run "
              "(resume with the -e it started with)", path,
              checkpoint_shape_text(&saved, saved_text, sizeof(saved_text)), run_model,
              checkpoint_shape_text(run_shape, run_text, sizeof(run_text)));
    }
    path_format(path, sizeof(path), "%s/%s", dir, CHECKPOINT_FILES[CHECKPOINT_STATE]);
    checkpoint_read_state(path, state);
    if (state->step != step) fatal("%s: field step = %d, but its directory is for step %d", path, state->step, step);
    path_format(path, sizeof(path), "%s/%s", dir, CHECKPOINT_FILES[CHECKPOINT_OPTIMIZER]);
    checkpoint_check_optimizer_file(path, &saved, step);
    return 1;
}
