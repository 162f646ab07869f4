// run/files.c: what run/files.h declares.
#include "run/files.h"

#include <signal.h>

void files_size_limit_fails_writes(void) { signal(SIGXFSZ, SIG_IGN); }

void path_format(char* buf, size_t n, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= n) fatal("path too long (over %zu bytes): %.60s...", n - 1, buf);
}

void make_parent_dirs(const char* path, const char* option) {
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

const char* file_kind_of_mode(mode_t mode) {
    if (S_ISREG(mode)) return NULL;
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a pipe or FIFO (such as <(...))";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

const char* not_regular_file_kind(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    return file_kind_of_mode(st.st_mode);
}

FILE* fopen_check(const char* path, const char* mode, int own_file, const char* file, int line) {
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

void fread_check(void* dst, size_t size, size_t count, FILE* f, const char* what,
                 const char* file, int line) {
    size_t got = fread(dst, size, count, f);
    if (got != count) {
        fatal("%s: truncated or unreadable (wanted %zu items of %zu bytes, got %zu) (%s:%d)", what,
              count, size, got, file, line);
    }
}

void fwrite_check(const void* src, size_t size, size_t count, FILE* f, const char* what,
                  const char* file, int line) {
    if (fwrite(src, size, count, f) != count) {
        fatal("%s: write failed: %s (%s:%d)", what, strerror(errno), file, line);
    }
}

void fclose_check(FILE* f, const char* what, const char* file, int line) {
    int failed = ferror(f);
    if (fclose(f) != 0 || failed) fatal("%s: write or close failed: %s (%s:%d)", what, strerror(errno), file, line);
}

void fseek_check(FILE* f, long offset, int whence, const char* what, const char* file, int line) {
    if (fseek(f, offset, whence) != 0) fatal("%s: seek failed: %s (%s:%d)", what, strerror(errno), file, line);
}

long file_size_of(FILE* f, const char* what) {
    fseekCheck(f, 0, SEEK_END, what);
    long n = ftell(f);
    if (n < 0) fatal("%s: cannot tell size", what);
    fseekCheck(f, 0, SEEK_SET, what);
    return n;
}

char* read_whole_file(const char* path, size_t* size) {
    FILE* f = fopenCheck(path, "rb");
    long n = file_size_of(f, path);
    char* buf = (char*)mallocCheck((size_t)n + 1);
    if (n > 0) freadCheck(buf, 1, (size_t)n, f, path);
    buf[n] = 0;
    fcloseCheck(f, path);
    *size = (size_t)n;
    return buf;
}

long long field_range_check(const char* path, const char* field, long long value, long long min,
                            long long max) {
    if (value < min || value > max) fatal("%s: %s = %lld is out of range (%lld..%lld)", path, field, value, min, max);
    return value;
}

size_t size_mul_check(size_t a, size_t b, const char* path) {
    if (a != 0 && b > SIZE_MAX / a) fatal("%s: size %zu x %zu overflows size_t (corrupt header?)", path, a, b);
    return a * b;
}

size_t size_add_check(size_t a, size_t b, const char* path) {
    if (b > SIZE_MAX - a) fatal("%s: size %zu + %zu overflows size_t (corrupt header?)", path, a, b);
    return a + b;
}

int parse_u64_strict(const char* s, uint64_t* out) {
    if (s == NULL || *s == '\0') return 0;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return 0;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

FILE* file_replace_open(const char* path, char* tmp) {
    path_format(tmp, PATH_MAX_LEN, "%s.tmp", path);
    return fopenCheck(tmp, "w");  // a regular file, never written through a link
}

// The directory that holds path ("dir/", "/" or ".").
static void directory_of(const char* path, char* dir) {
    const char* slash = strrchr(path, '/');
    path_format(dir, PATH_MAX_LEN, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
}

// fsync of an open descriptor; a file system that cannot sync one (EINVAL) is not an error.
static int fsync_fd(int fd) { return fsync(fd) == 0 || errno == EINVAL ? 0 : -1; }

void file_replace_commit(FILE* f, const char* tmp, const char* path, const char* what) {
    // A write that failed on the way sets the stream's error flag; the close reports only its
    // own last flush. Either way no half-written file is left.
    int failed = ferror(f) || fflush(f) != 0 || fsync_fd(fileno(f)) != 0;
    int why = errno;
    if (fclose(f) != 0 || failed) {
        why = failed && why ? why : errno ? errno : EIO;
        remove(tmp);
        fatal("cannot write %s %s: %s", what, path, strerror(why));
    }
    if (rename(tmp, path) != 0) fatal("cannot write %s %s: renaming %s: %s", what, path, tmp, strerror(errno));
    char dir[PATH_MAX_LEN];
    directory_of(path, dir);
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync_fd(fd) != 0) fatal("cannot write %s %s: flushing its directory: %s", what, path, strerror(errno));
    close(fd);
}

void file_replace_check(const char* path, const char* option) {
    char dir[PATH_MAX_LEN];
    directory_of(path, dir);
    struct stat st;
    if (stat(dir, &st) != 0) fatal("%s %s: its directory %s: %s", option, path, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) fatal("%s %s: %s is not a directory", option, path, dir);
    const char* kind = lstat(path, &st) == 0 ? file_kind_of_mode(st.st_mode) : NULL;
    if (kind) {
        fatal("%s %s: that path is %s; the job writes a regular file there (replacing it): remove it or choose "
              "another path", option, path, strncmp(kind, "a pipe", 6) == 0 ? "a FIFO" : kind);
    }
    char tmp[PATH_MAX_LEN];
    FILE* f = file_replace_open(path, tmp);  // the directory takes a new file: try it
    fclose(f);
    if (remove(tmp) != 0) fatal("%s %s: cannot remove the trial file %s: %s", option, path, tmp, strerror(errno));
}
