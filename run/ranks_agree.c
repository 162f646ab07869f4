// run/ranks_agree.c: what run/ranks_agree.h declares.
#include "run/ranks_agree.h"
static void job_text_add(JobText* t, const char* fmt, ...) LLMC_PRINTF(2, 3);

static void job_text_add(JobText* t, const char* fmt, ...) {
    char line[PATH_MAX_LEN + 256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t len = strlen(line);
    if (t->len + len + 2 > t->cap) {
        t->cap = 2 * (t->len + len + 2);
        t->text = (char*)realloc(t->text, t->cap);
        if (!t->text) fatal("out of memory describing the job");
    }
    memcpy(t->text + t->len, line, len);
    t->len += len;
    t->text[t->len++] = '\n';
    t->text[t->len] = '\0';
}

static void job_text_files(JobText* t, const char* kind, const char* pattern) {
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0) {
        job_text_add(t, "%s files: none match '%s'", kind, pattern);
        return;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        struct stat st;
        long long bytes = stat(g.gl_pathv[i], &st) == 0 ? (long long)st.st_size : -1;
        job_text_add(t, "%s file %zu: %s, %lld bytes", kind, i, g.gl_pathv[i], bytes);
    }
    job_text_add(t, "%s files: %zu", kind, g.gl_pathc);
    globfree(&g);
}

// The job as this rank sees it. build names the trainer and its precision.
static void job_text_describe(JobText* t, const TrainConfig* cfg, const char* build, int resume_step) {
    char value[PATH_MAX_LEN];
    for (int i = 0; i < NUM_TRAIN_OPTIONS; i++) {
        const OptionSpec* o = &TRAIN_OPTIONS[i];
        job_text_add(t, "%s: %s", o->long_name, cli_value_text(cfg, o, value, sizeof(value)));
    }
    GPT2Config mc;
    model_shape_of(cfg->model, &mc);
    job_text_add(t, "model shape: L=%d NH=%d C=%d maxT=%d V=%d Vp=%d", mc.num_layers, mc.num_heads, mc.channels,
                 mc.max_seq_len, mc.vocab_size, mc.padded_vocab_size);
    job_text_add(t, "resume from step: %d", resume_step);
    job_text_files(t, "train", cfg->train_pattern);
    if (cfg->val_every > 0) job_text_files(t, "validation", cfg->val_pattern);
    if (cfg->hellaswag) job_text_files(t, "hellaswag", cfg->hellaswag_path);
    size_t bytes = 0;
    uint32_t crc = crc32c_file("/proc/self/exe", &bytes);
    job_text_add(t, "build: %s, program %zu bytes, crc32c %08x", build, bytes, crc);
}

// The value of a "field: value" line of len bytes ("none" for a missing line).
static void job_line_value(const char* line, size_t len, char* out, size_t n) {
    const char* sep = (const char*)memchr(line, ':', len);
    const char* value = sep && sep + 2 <= line + len ? sep + 2 : line;
    if (len) snprintf(out, n, "%.*s", (int)(line + len - value), value);
    else snprintf(out, n, "none");
}

// The first line where b differs from a: its field's name and both values; 0 when none.
static int job_text_first_difference(const char* a, const char* b, char* field, size_t field_n, char* va,
                                     char* vb, size_t value_n) {
    for (;;) {
        size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
        if (la != lb || memcmp(a, b, la) != 0) {
            const char* line = la ? a : b;  // the field's name from whichever side has the line
            snprintf(field, field_n, "%.*s", (int)strcspn(line, ":\n"), line);
            job_line_value(a, la, va, value_n);
            job_line_value(b, lb, vb, value_n);
            return 1;
        }
        if (!a[la] && !b[lb]) return 0;
        a += la + (a[la] ? 1 : 0);
        b += lb + (b[lb] ? 1 : 0);
    }
}

void ranks_agree(const TrainConfig* cfg, const char* build, int resume_step) {
    int world = utils_world(), rank = utils_rank();
    if (world <= 1) return;
    JobText t = {NULL, 0, 0};
    job_text_describe(&t, cfg, build, resume_step);
    uint64_t h = fnv1a(FNV1A_START, t.text, t.len);
    uint64_t mine[2] = {h, ~h}, all[2];
    MPI_Request request;
    mpiCheck(MPI_Iallreduce(mine, all, 2, MPI_UINT64_T, MPI_BAND, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "job description check", -1);
    if (all[0] == ~all[1]) {
        free(t.text);
        return;
    }
    // They differ: rank 0 gathers every text and names the first difference from its own.
    int len = (int)t.len + 1;
    int* lens = (int*)mallocCheck((size_t)world * sizeof(int));
    mpiCheck(MPI_Igather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "job description gather", -1);
    int* displs = (int*)mallocCheck((size_t)world * sizeof(int));
    size_t total = 0;
    for (int r = 0; r < world && rank == 0; r++) {
        displs[r] = (int)total;
        total += (size_t)lens[r];
    }
    char* texts = rank == 0 ? (char*)mallocCheck(total) : NULL;
    mpiCheck(MPI_Igatherv(t.text, len, MPI_CHAR, texts, lens, displs, MPI_CHAR, 0, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "job description gather", -1);
    char message[2 * PATH_MAX_LEN + 512] = "the ranks disagree on the job";
    if (rank == 0) {
        char field[256], va[PATH_MAX_LEN], vb[PATH_MAX_LEN];
        for (int r = 1; r < world; r++) {
            if (job_text_first_difference(texts, texts + displs[r], field, sizeof(field), va, vb, sizeof(va))) {
                snprintf(message, sizeof(message),
                         "the ranks disagree on %s: rank 0 has '%s', rank %d has '%s' (every rank must be given the "
                         "same job: command line, files, build)", field, va, r, vb);
                break;
            }
        }
    }
    fatal("%s", message);  // rank 0 speaks; the others stay quiet while mpirun ends the job
}
