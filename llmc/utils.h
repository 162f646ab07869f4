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
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

// FNV-1a, 64 bits: a cheap fingerprint (parameter bytes to compare replicas, a corpus's shards).
static inline uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
#define FNV1A_START 1469598103934665603ull

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

// What may explain any error of this process better than the failing call can: it writes
// that explanation into buf and returns 1, or returns 0 (llmc/dir_lock.h's: the output
// directory was removed under the job, so "cannot open .../model.bin" is not the story).
typedef int (*FatalCause)(char* buf, size_t n);
static FatalCause fatal_cause_ = NULL;

static inline void fatal(const char* fmt, ...) LLMC_PRINTF(1, 2) LLMC_NORETURN;
static inline void fatal(const char* fmt, ...) {
    fflush(stdout);
    if (utils_rank() != 0) usleep(3000 * 1000);  // let rank 0 speak for a shared error
    // One write for the whole line: stderr is unbuffered, and under mpirun another stream's
    // output could otherwise land between "error: " and the message.
    char message[8192], cause[4608], line[sizeof(message) + sizeof(cause) + 64];
    size_t n = 0;
    if (utils_world() > 1 && utils_rank() != 0) n = (size_t)snprintf(line, sizeof(line), "[rank %d] ", utils_rank());
    n += (size_t)snprintf(line + n, sizeof(line) - n, "error: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    FatalCause explain = fatal_cause_;
    fatal_cause_ = NULL;  // once: an error inside the explanation is reported plainly
    if (explain && explain(cause, sizeof(cause)) && strcmp(cause, message) != 0) {
        snprintf(line + n, sizeof(line) - n - 2, "%s (the operation that failed: %s)", cause, message);
    } else {
        snprintf(line + n, sizeof(line) - n - 2, "%s", message);
    }
    n = strlen(line);
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

// What a file of this mode is when it is not a regular file, for messages ("a directory"), or NULL.
static inline const char* file_kind_of_mode(mode_t mode) {
    if (S_ISREG(mode)) return NULL;
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a pipe or FIFO (such as <(...))";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

// What a path is when it is not a regular file (symbolic links followed), or NULL.
static inline const char* not_regular_file_kind(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    return file_kind_of_mode(st.st_mode);
}

// Inputs and outputs are regular files: every rank reads them, some more than once and at
// offsets, and opening a FIFO would block forever. So the file is opened without blocking
// (O_NONBLOCK: a FIFO opens at once) and what was opened is checked before any use. A file
// this program writes, or reads back from its own directory (own_file), must not be a
// symbolic link either: the link could send main.log or a checkpoint anywhere. Inputs may be
// links to regular files.
static inline FILE* fopen_check(const char* path, const char* mode, int own_file, const char* file, int line) {
    int writing = mode[0] != 'r', update = strchr(mode, '+') != NULL;
    int refuse_links = writing || own_file;
    struct stat st;
    const char* kind = NULL;
    if ((refuse_links ? lstat(path, &st) : stat(path, &st)) == 0) kind = file_kind_of_mode(st.st_mode);
    int flags = O_NONBLOCK | O_CLOEXEC | (refuse_links ? O_NOFOLLOW : 0) | (update ? O_RDWR : writing ? O_WRONLY : O_RDONLY);
    if (writing) flags |= O_CREAT | (mode[0] == 'w' ? O_TRUNC : O_APPEND);
    int fd = kind ? -1 : open(path, flags, 0644);
    if (fd < 0 && !kind) {
        if (errno == ELOOP && refuse_links) kind = "a symbolic link";
        else if (errno == ENXIO) kind = "a pipe or FIFO (such as <(...))";  // a FIFO with no reader
    }
    if (fd >= 0 && fstat(fd, &st) == 0 && (kind = file_kind_of_mode(st.st_mode)) != NULL) {
        close(fd);  // replaced since the check: the kind of what was opened
        fd = -1;
    }
    if (kind && refuse_links) {
        if (strncmp(kind, "a pipe", 6) == 0) kind = "a FIFO";
        fatal("'%s' is %s: the job writes, and reads back from its own directory, regular files only, never through "
              "a link; remove it (%s:%d)", path, kind, file, line);
    }
    if (kind) fatal("'%s' is %s, not a regular file: pass a file (%s:%d)", path, kind, file, line);
    FILE* f = fd < 0 ? NULL : fdopen(fd, mode);
    if (fd >= 0 && (f == NULL || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)) {
        if (f) fclose(f);
        else close(fd);
        f = NULL;
    }
    if (f == NULL) {
        fatal("cannot open '%s' for %s: %s (%s:%d)", path, mode[0] == 'r' ? "reading" : "writing",
              strerror(errno), file, line);
    }
    return f;
}
#define fopenCheck(path, mode) fopen_check((path), (mode), 0, __FILE__, __LINE__)
// A file of the job's own directory (main.log, a checkpoint's), read or written: never a link.
#define fopenOwnCheck(path, mode) fopen_check((path), (mode), 1, __FILE__, __LINE__)

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
