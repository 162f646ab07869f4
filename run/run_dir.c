// run/run_dir.c: what run/run_dir.h declares.
#include "run/run_dir.h"

static DirLock dir_lock_ = {-1, "", "", 0, 0};

const char* dir_lock_lost(char* why) {
    why[0] = '\0';
    if (dir_lock_.fd < 0) return why;
    struct stat dir, mine, linked;
    char what[160] = "";
    if (stat(dir_lock_.dir, &dir) != 0) {
        snprintf(what, sizeof(what), "%s", errno == ENOENT ? "it no longer exists" : strerror(errno));
    } else if (dir.st_dev != dir_lock_.dir_dev || dir.st_ino != dir_lock_.dir_ino) {
        snprintf(what, sizeof(what), "it is another directory now (inode %llu, the locked one was %llu)",
                 (unsigned long long)dir.st_ino, (unsigned long long)dir_lock_.dir_ino);
    } else if (fstat(dir_lock_.fd, &mine) != 0 || lstat(dir_lock_.path, &linked) != 0) {
        snprintf(what, sizeof(what), "its lock file .lock is gone");
    } else if (linked.st_dev != mine.st_dev || linked.st_ino != mine.st_ino) {
        snprintf(what, sizeof(what), "its lock file .lock was replaced by another");
    } else {
        return why;
    }
    snprintf(why, DIR_LOCK_WHY_MAX, "output directory '%s' is no longer the one this job locked (%s): it was "
             "removed or replaced while the job ran, and another job may own it now; stopping without writing "
             "anything more there", dir_lock_.dir, what);
    return why;
}

// fatal()'s cause (llmc/utils.h): -o lost explains whatever failed.
static int dir_lock_explain(char* buf, size_t n) {
    char why[DIR_LOCK_WHY_MAX];
    if (!dir_lock_lost(why)[0]) return 0;
    snprintf(buf, n, "%s", why);
    return 1;
}

void dir_lock_require(void) {
    char why[DIR_LOCK_WHY_MAX];
    if (dir_lock_lost(why)[0]) fatal("%s", why);
}

void dir_lock_take_for(const char* dir, const char* clash) {
    char path[PATH_MAX_LEN];
    path_format(path, sizeof(path), "%s/.lock", dir);
    struct stat st;
    const char* kind = lstat(path, &st) == 0 ? file_kind_of_mode(st.st_mode) : NULL;
    int fd = kind ? -1 : open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0 && !kind && (errno == ELOOP || errno == ENXIO)) kind = errno == ELOOP ? "a symbolic link" : "a FIFO";
    if (fd >= 0 && fstat(fd, &st) == 0 && (kind = file_kind_of_mode(st.st_mode)) != NULL) close(fd);
    if (kind) {
        fatal("the lock file '%s' is %s, not a regular file: the job locks its directory with a regular file of its "
              "own (remove it)", path, kind);
    }
    if (fd < 0) fatal("cannot open the lock file '%s': %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) fatal("cannot lock '%s': %s", path, strerror(errno));
        char holder[256] = "";
        ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        fatal("output directory '%s' is in use by another job (%s): one job per output directory, or %s would "
              "clash", dir, holder[0] ? holder : "holder unknown", clash);
    }
    if (stat(dir, &st) != 0) fatal("cannot stat the output directory '%s': %s", dir, strerror(errno));
    dir_lock_.fd = fd;
    path_format(dir_lock_.dir, sizeof(dir_lock_.dir), "%s", dir);
    path_format(dir_lock_.path, sizeof(dir_lock_.path), "%s", path);
    dir_lock_.dir_dev = st.st_dev;
    dir_lock_.dir_ino = st.st_ino;
    dir_lock_require();  // the lock file opened is the one in the directory now
    fatal_set_cause(dir_lock_explain);
    char host[128] = "?", when[64];
    gethostname(host, sizeof(host) - 1);
    time_t now = time(NULL);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    char line[256];
    int len = snprintf(line, sizeof(line), "host %s, pid %ld, started %s\n", host, (long)getpid(), when);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        fatal("cannot write the lock file '%s': %s", path, strerror(errno));
    }
}

void dir_lock_take(const char* dir) { dir_lock_take_for(dir, "its checkpoints and main.log"); }

void dir_lock_release(void) {
    if (dir_lock_.fd >= 0) close(dir_lock_.fd);
    dir_lock_.fd = -1;
    if (fatal_cause() == dir_lock_explain) fatal_set_cause(NULL);
}
