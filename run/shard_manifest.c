// run/shard_manifest.c: what run/shard_manifest.h declares.
#include "run/shard_manifest.h"

#include "run/dataloader.h"  // the shard format

static char* manifest_copy(const char* s) {
    char* p = strdup(s);
    if (p == NULL) fatal("out of memory copying a path");
    return p;
}

// The directory part of a glob result ("" when it has none) and its base name.
static void manifest_split_path(const char* path, char* dir, size_t n, const char** base) {
    const char* slash = strrchr(path, '/');
    if (slash == NULL) {
        dir[0] = '\0';
        *base = path;
        return;
    }
    path_format(dir, n, "%.*s", (int)(slash - path), path);
    if (slash == path) path_format(dir, n, "/");
    *base = slash + 1;
}

// dir joined with a file name, as the glob writes it.
static void manifest_join(char* out, size_t n, const char* dir, const char* name) {
    if (dir[0] == '\0') path_format(out, n, "%s", name);
    else if (strcmp(dir, "/") == 0) path_format(out, n, "/%s", name);
    else path_format(out, n, "%s/%s", dir, name);
}

// Adds the shard lines of one manifest. Any *_manifest.txt that does not start with
// "llmc-shards " is someone else's file and is passed over; one of ours of another version
// than 1, or malformed, or listing a shard twice, is an error.
static void manifest_read(ManifestSet* set, const char* dir, const char* path) {
    FILE* f = fopenCheck(path, "r");  // a FIFO or a directory is refused, never waited on
    char line[PATH_MAX_LEN + 128];
    int number = 0;
    size_t first = set->n;  // this manifest's entries start here
    while (fgets(line, sizeof(line), f)) {
        number++;
        line[strcspn(line, "\n")] = '\0';
        if (number == 1 && strncmp(line, "llmc-shards ", 12) != 0) break;
        if (number == 1 && strncmp(line, "llmc-shards 1 ", 14) != 0) {
            fclose(f);
            fatal("%s: manifest version '%.*s' is unknown to this build (it reads 'llmc-shards 1'): prepare the corpus "
                  "with this build's tools, or train with the build that prepared it", path,
                  (int)strcspn(line + 12, " "), line + 12);
        }
        if (strncmp(line, "shard ", 6) != 0) continue;
        char split[8], tokens_text[24], bytes_text[24];
        uint64_t tokens = 0, bytes = 0;
        unsigned crc;
        int name_at = -1;
        if (sscanf(line, "shard %7s %23s %23s %8x %n", split, tokens_text, bytes_text, &crc, &name_at) != 4 ||
            name_at < 0 || line[name_at] == '\0' || strchr(line + name_at, '/') != NULL ||
            (strcmp(split, "train") != 0 && strcmp(split, "val") != 0) || !parse_u64_strict(tokens_text, &tokens) ||
            !parse_u64_strict(bytes_text, &bytes)) {
            fclose(f);
            fatal("%s: malformed line %d '%s' (want: shard val|train TOKENS BYTES CRC32C FILE)", path, number, line);
        }
        const uint64_t header = SHARD_HEADER_INTS * sizeof(int32_t);
        if (tokens > (UINT64_MAX - header) / 2 || bytes != header + 2 * tokens) {
            fclose(f);
            fatal("%s: line %d lists %s tokens in %s bytes, where a shard holds a %llu-byte header and 2 bytes a token: "
                  "the manifest was edited or damaged, prepare the corpus again", path, number, tokens_text, bytes_text,
                  (unsigned long long)header);
        }
        if (set->n == set->cap) {
            set->cap = set->cap ? 2 * set->cap : 64;
            set->entries = (ManifestEntry*)realloc(set->entries, set->cap * sizeof(ManifestEntry));
            if (set->entries == NULL) fatal("out of memory reading '%s'", path);
        }
        for (size_t k = first; k < set->n; k++) {
            const ManifestEntry* seen = &set->entries[k];
            if (strcmp(seen->name, line + name_at) != 0) continue;
            int same = seen->bytes == bytes && seen->crc == crc;
            fclose(f);
            fatal("%s: line %d lists %s again (first at line %d%s): a manifest lists each shard once; it was edited "
                  "or damaged, prepare the corpus again", path, number, seen->name, seen->line,
                  same ? "" : ", with another size or checksum: the two lines contradict each other");
        }
        ManifestEntry* e = &set->entries[set->n++];
        e->dir = manifest_copy(dir);
        e->manifest = manifest_copy(path);
        e->name = manifest_copy(line + name_at);
        e->bytes = bytes;
        e->crc = crc;
        snprintf(e->split, sizeof(e->split), "%s", split);
        e->line = number;
        e->matched = 0;
    }
    fclose(f);
}

// Reads every manifest in dir, once.
static void manifest_read_dir(ManifestSet* set, const char* dir) {
    for (size_t k = 0; k < set->n_dirs; k++) {
        if (strcmp(set->dirs[k], dir) == 0) return;
    }
    set->dirs = (char**)realloc(set->dirs, (set->n_dirs + 1) * sizeof(char*));
    if (set->dirs == NULL) fatal("out of memory listing manifests");
    set->dirs[set->n_dirs++] = manifest_copy(dir);
    DIR* d = opendir(dir[0] ? dir : ".");
    if (d == NULL) return;  // the shards themselves will be reported
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name), k = strlen("_manifest.txt");
        if (n <= k || strcmp(e->d_name + n - k, "_manifest.txt") != 0) continue;
        char path[PATH_MAX_LEN];
        manifest_join(path, sizeof(path), dir, e->d_name);
        manifest_read(set, dir, path);
    }
    closedir(d);
}

// The manifest a shard's own name points to: for NAME_train_000001.bin, NAME_val.bin ...,
// DIR/NAME_manifest.txt if it exists. 0 for names not made that way, or no such file.
static int manifest_of_name(const char* dir, const char* base, char* out, size_t n) {
    char stem[PATH_MAX_LEN];
    size_t len = strlen(base);
    if (len < 4 || strcmp(base + len - 4, ".bin") != 0 || len - 4 >= sizeof(stem)) return 0;
    memcpy(stem, base, len - 4);
    stem[len - 4] = '\0';
    char* last = strrchr(stem, '_');
    if (last && last[1] && strspn(last + 1, "0123456789") == strlen(last + 1)) *last = '\0';  // the shard number
    len = strlen(stem);
    if (len > 6 && strcmp(stem + len - 6, "_train") == 0) stem[len - 6] = '\0';
    else if (len > 4 && strcmp(stem + len - 4, "_val") == 0) stem[len - 4] = '\0';
    else return 0;
    char name[PATH_MAX_LEN];
    path_format(name, sizeof(name), "%s_manifest.txt", stem);
    manifest_join(out, n, dir, name);
    struct stat st;
    return stat(out, &st) == 0;
}

static void manifest_set_free(ManifestSet* set) {
    for (size_t k = 0; k < set->n; k++) {
        free(set->entries[k].dir);
        free(set->entries[k].manifest);
        free(set->entries[k].name);
    }
    for (size_t k = 0; k < set->n_dirs; k++) free(set->dirs[k]);
    free(set->entries);
    free(set->dirs);
}

ShardCheck* shard_manifest_check(const glob_t* files, const char* pattern, int rank) {
    size_t n = files->gl_pathc, listed = 0, first_listed = n;
    ShardCheck* checks = (ShardCheck*)callocCheck(n, sizeof(ShardCheck));
    ManifestSet set;
    memset(&set, 0, sizeof(set));
    char dir[PATH_MAX_LEN], path[PATH_MAX_LEN];
    const char* base;
    for (size_t k = 0; k < n; k++) {
        struct stat st;
        if (stat(files->gl_pathv[k], &st) != 0) fatal("cannot stat '%s': %s", files->gl_pathv[k], strerror(errno));
        checks[k].dev = st.st_dev;
        checks[k].ino = st.st_ino;
        checks[k].size = st.st_size;
        checks[k].mtime = st.st_mtim;
        manifest_split_path(files->gl_pathv[k], dir, sizeof(dir), &base);
        manifest_read_dir(&set, dir);
        for (size_t j = 0; j < set.n; j++) {
            ManifestEntry* e = &set.entries[j];
            if (strcmp(e->dir, dir) != 0 || strcmp(e->name, base) != 0) continue;
            if (checks[k].manifest) {
                fatal("%s is listed in both %s and %s: two corpora claim the same shard (a manifest copied or renamed?); "
                      "remove the one that is not its corpus's", files->gl_pathv[k], checks[k].manifest, e->manifest);
            }
            checks[k].manifest = manifest_copy(e->manifest);
            checks[k].bytes = e->bytes;
            checks[k].crc = e->crc;
            memcpy(checks[k].split, e->split, sizeof(e->split));
            e->matched = 1;
            listed++;
        }
        // One corpus per run: its checkpoints record which (run/data_identity.h).
        if (checks[k].manifest && first_listed < n && strcmp(checks[first_listed].manifest, checks[k].manifest) != 0) {
            fatal("'%s' matches shards of two corpora: %s (listed in %s) and %s (listed in %s); a run trains on one "
                  "corpus: narrow the pattern, or prepare the data as one corpus", pattern, files->gl_pathv[first_listed],
                  checks[first_listed].manifest, files->gl_pathv[k], checks[k].manifest);
        }
        if (checks[k].manifest && first_listed == n) first_listed = k;
    }
    for (size_t k = 0; k < n; k++) {
        if (checks[k].manifest) continue;
        const char* shard = files->gl_pathv[k];
        manifest_split_path(shard, dir, sizeof(dir), &base);
        if (manifest_of_name(dir, base, path, sizeof(path))) {
            fatal("%s matches '%s' but is not listed in %s: it is no shard of that corpus (another run's, or a "
                  "copy); remove it or narrow the pattern", shard, pattern, path);
        }
        if (listed > 0) {
            size_t j = 0;
            while (!checks[j].manifest) j++;
            fatal("'%s' matches shards listed in %s and also %s, which no manifest lists: the pattern mixes a corpus "
                  "with other files; narrow it", pattern, checks[j].manifest, shard);
        }
    }
    // A listed shard the pattern matches but that is missing: the corpus is not whole.
    for (size_t j = 0; j < set.n; j++) {
        const ManifestEntry* e = &set.entries[j];
        if (e->matched) continue;
        int manifest_in_use = 0;
        for (size_t k = 0; k < n && !manifest_in_use; k++) {
            manifest_in_use = checks[k].manifest && strcmp(checks[k].manifest, e->manifest) == 0;
        }
        manifest_join(path, sizeof(path), e->dir, e->name);
        if (manifest_in_use && fnmatch(pattern, path, FNM_PATHNAME | FNM_PERIOD) == 0) {
            fatal("%s lists %s, which matches '%s' but is missing: the corpus is not whole (its preparation was "
                  "interrupted, or the shard was removed); prepare it again", e->manifest, path, pattern);
        }
    }
    if (listed == 0 && rank == 0) {
        printf("data: '%s': %zu shard%s without a manifest beside %s (NAME_manifest.txt): unverified, sizes and "
               "checksums not checked\n", pattern, n, n == 1 ? "" : "s", n == 1 ? "it" : "them");
    }
    manifest_set_free(&set);
    return checks;
}

void shard_check_identity(const ShardCheck* c, FILE* f, const char* path) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0) fatal("%s: cannot stat: %s", path, strerror(errno));
    char what[160] = "";
    if (st.st_dev != c->dev || st.st_ino != c->ino) {
        snprintf(what, sizeof(what), "it is another file now: inode %llu, was %llu", (unsigned long long)st.st_ino,
                 (unsigned long long)c->ino);
    } else if (st.st_size != c->size) {
        snprintf(what, sizeof(what), "its size is %lld bytes, was %lld", (long long)st.st_size, (long long)c->size);
    } else if (st.st_mtim.tv_sec != c->mtime.tv_sec || st.st_mtim.tv_nsec != c->mtime.tv_nsec) {
        snprintf(what, sizeof(what), "it was modified");
    } else {
        return;
    }
    fatal("%s changed while this job ran (%s): the corpus was rebuilt or edited under a running job, which would "
          "mix two corpora in one run; stopping (start the job again to train on the new data)", path, what);
}

void shard_check_content(const ShardCheck* c, const char* path, uint64_t size, uint32_t crc) {
    if (!c->manifest) return;
    if (size != c->bytes) {
        fatal("%s: %llu bytes, but %s lists it with %llu: not the shard prepared (truncated, replaced or corrupt)", path,
              (unsigned long long)size, c->manifest, (unsigned long long)c->bytes);
    }
    if (crc != c->crc) {
        fatal("%s: checksum mismatch (CRC32C %08x, %s lists %08x): the shard is corrupt or was changed since it was "
              "prepared", path, (unsigned)crc, c->manifest, (unsigned)c->crc);
    }
}

void shard_checks_free(ShardCheck* checks, size_t n) {
    for (size_t k = 0; checks && k < n; k++) free(checks[k].manifest);
    free(checks);
}
