/*
 * Checked wrappers and the error policy shared by every host program.
 *
 * fatal(...) ends the program with one message and exit status 1. Most input errors
 * (a bad flag, model file or token shard) are seen by every rank alike, since all ranks
 * read the same inputs; so that the user sees the message once, rank 0 prints at once
 * and exits, which makes mpirun end the whole job. Another rank first waits 3 s:
 * if the error was shared, mpirun ends it during the wait and it stays quiet; if only
 * that rank saw it, it prints (with its rank) and exits. Nothing hangs either way.
 * Programs under MPI call utils_set_rank() once they know their rank.
 */
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

// Per translation unit (this is a header), so a unit that never called utils_set_rank()
// falls back to the rank the MPI launcher exported; outside mpirun that is rank 0 of 1.
static int utils_rank_ = -1;
static int utils_world_ = -1;

static inline int utils_env_int(const char* const* names, int fallback) {
    for (int i = 0; names[i]; i++) {
        const char* v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return fallback;
}

static inline int utils_rank(void) {
    static const char* const names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    if (utils_rank_ < 0) utils_rank_ = utils_env_int(names, 0);
    return utils_rank_;
}

static inline int utils_world(void) {
    static const char* const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
    if (utils_world_ < 0) utils_world_ = utils_env_int(names, 1);
    return utils_world_;
}

static inline void utils_set_rank(int rank, int world) {
    utils_rank_ = rank;
    utils_world_ = world;
}

#if defined(__GNUC__)
#define LLMC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define LLMC_NORETURN __attribute__((noreturn))
#else
#define LLMC_PRINTF(a, b)
#define LLMC_NORETURN
#endif

static inline void fatal(const char* fmt, ...) LLMC_PRINTF(1, 2) LLMC_NORETURN;
static inline void fatal(const char* fmt, ...) {
    fflush(stdout);
    if (utils_rank() != 0) usleep(3000 * 1000);  // let rank 0 speak for a shared error
    // One write for the whole line: stderr is unbuffered, and under mpirun another stream's
    // output could otherwise land between "error: " and the message.
    char line[8192];
    size_t n = 0;
    if (utils_world() > 1 && utils_rank() != 0) n = (size_t)snprintf(line, sizeof(line), "[rank %d] ", utils_rank());
    n += (size_t)snprintf(line + n, sizeof(line) - n, "error: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
    va_end(ap);
    n = m < 0 ? n : n + (size_t)m < sizeof(line) - 2 ? n + (size_t)m : sizeof(line) - 2;
    line[n] = '\n';
    line[n + 1] = '\0';
    fputs(line, stderr);
    fflush(stderr);
    exit(1);
}

// snprintf for file paths: a path that does not fit is an error, never a silent truncation.
#define PATH_MAX_LEN 4096
static inline void path_format(char* buf, size_t n, const char* fmt, ...) LLMC_PRINTF(3, 4);
static inline void path_format(char* buf, size_t n, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= n) fatal("path too long (over %zu bytes): %.60s...", n - 1, buf);
}

// Creates the missing directories above path, as `mkdir -p` does, not path itself: an
// output directory is often a fresh path. option names path in the error ("-o").
static inline void make_parent_dirs(const char* path, const char* option) {
    char prefix[PATH_MAX_LEN];
    path_format(prefix, sizeof(prefix), "%s", path);
    for (char* p = prefix + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(prefix, 0755) != 0 && errno != EEXIST) {
            fatal("cannot create directory '%s' for %s '%s': %s", prefix, option, path, strerror(errno));
        }
        *p = '/';
    }
}

// For MPI calls (the macro needs <mpi.h> only where it is used).
#define mpiCheck(call)                                                                                   \
    do {                                                                                                 \
        int mpi_status_ = (call);                                                                        \
        if (mpi_status_ != MPI_SUCCESS) fatal("MPI error %d at %s:%d", mpi_status_, __FILE__, __LINE__); \
    } while (0)

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* p = malloc(size == 0 ? 1 : size);
    if (p == NULL) fatal("out of memory allocating %zu bytes (%s:%d)", size, file, line);
    return p;
}
#define mallocCheck(size) malloc_check((size), __FILE__, __LINE__)

static inline void* calloc_check(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n == 0 ? 1 : n, size == 0 ? 1 : size);
    if (p == NULL) fatal("out of memory allocating %zu x %zu bytes (%s:%d)", n, size, file, line);
    return p;
}
#define callocCheck(n, size) calloc_check((n), (size), __FILE__, __LINE__)

// What a path is when it is not a regular file, for messages ("a directory"), or NULL.
static inline const char* not_regular_file_kind(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode)) return NULL;
    if (S_ISDIR(st.st_mode)) return "a directory";
    if (S_ISFIFO(st.st_mode)) return "a pipe or FIFO (such as <(...))";
    if (S_ISCHR(st.st_mode)) return "a character device";
    if (S_ISBLK(st.st_mode)) return "a block device";
    if (S_ISSOCK(st.st_mode)) return "a socket";
    return "not a regular file";
}

// Inputs and outputs are regular files: every rank reads them, some more than once and at
// offsets, and opening a FIFO would block forever.
static inline FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    const char* kind = not_regular_file_kind(path);
    if (kind) fatal("'%s' is %s, not a regular file: pass a file (%s:%d)", path, kind, file, line);
    FILE* f = fopen(path, mode);
    if (f == NULL) {
        fatal("cannot open '%s' for %s: %s (%s:%d)", path, mode[0] == 'r' ? "reading" : "writing",
              strerror(errno), file, line);
    }
    return f;
}
#define fopenCheck(path, mode) fopen_check((path), (mode), __FILE__, __LINE__)

// A short read means the file is truncated (or unreadable): name the file.
static inline void fread_check(void* dst, size_t size, size_t count, FILE* f, const char* what,
                               const char* file, int line) {
    size_t got = fread(dst, size, count, f);
    if (got != count) {
        fatal("%s: truncated or unreadable (wanted %zu items of %zu bytes, got %zu) (%s:%d)", what,
              count, size, got, file, line);
    }
}
#define freadCheck(dst, size, count, f, what) fread_check((dst), (size), (count), (f), (what), __FILE__, __LINE__)

static inline void fwrite_check(const void* src, size_t size, size_t count, FILE* f, const char* what,
                                const char* file, int line) {
    if (fwrite(src, size, count, f) != count) {
        fatal("%s: write failed: %s (%s:%d)", what, strerror(errno), file, line);
    }
}
#define fwriteCheck(src, size, count, f, what) fwrite_check((src), (size), (count), (f), (what), __FILE__, __LINE__)

// A write that failed earlier (a full disk) leaves the stream's error flag set, and
// fclose then reports only its own last flush: both count.
static inline void fclose_check(FILE* f, const char* what, const char* file, int line) {
    int failed = ferror(f);
    if (fclose(f) != 0 || failed) fatal("%s: write or close failed: %s (%s:%d)", what, strerror(errno), file, line);
}
#define fcloseCheck(f, what) fclose_check((f), (what), __FILE__, __LINE__)

static inline void fseek_check(FILE* f, long offset, int whence, const char* what, const char* file, int line) {
    if (fseek(f, offset, whence) != 0) fatal("%s: seek failed: %s (%s:%d)", what, strerror(errno), file, line);
}
#define fseekCheck(f, off, whence, what) fseek_check((f), (off), (whence), (what), __FILE__, __LINE__)

// Size of an open file in bytes (restores the position to the start).
static inline long file_size_of(FILE* f, const char* what) {
    fseekCheck(f, 0, SEEK_END, what);
    long n = ftell(f);
    if (n < 0) fatal("%s: cannot tell size", what);
    fseekCheck(f, 0, SEEK_SET, what);
    return n;
}

#ifdef __cplusplus
}
#endif
#endif
