/*
 * One job per output directory. Two jobs writing into the same -o would remove each
 * other's temporary checkpoints and interleave main.log, and the survivor would leave a
 * checkpoint without a manifest or with a wrong CRC. So rank 0 takes an flock(2) on
 * DIR/.lock for the whole run (the kernel drops it when the process ends, kill -9
 * included: no stale lock to clean up) and writes who holds it there; a second job that
 * finds it held stops at once naming the holder.
 *
 * A lock guards a directory only while it is there: after an rm -rf (or mv) of -o the
 * job holds a lock file with no name, and a second job on the same -o locks a new one. So
 * before every write there (each main.log line, each checkpoint) the job checks that -o
 * is still the directory it locked, same device and inode, with its lock file still linked
 * in it (dir_lock_lost), and stops if not, writing nothing more there. Between two checks
 * any operation there can fail instead (a save in flight: "cannot open .../model.bin"), so
 * the lock also explains every error of the process (fatal's cause, llmc/utils.h): while -o
 * is lost, that is what the error says, the failed operation in parentheses.
 *
 * The lock file, like every file the job writes, must be a regular file and not a link.
 */
#ifndef LLMC_DIR_LOCK_H
#define LLMC_DIR_LOCK_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "llmc/utils.h"

// Room for dir_lock_lost's message: the directory's path and the reason.
#define DIR_LOCK_WHY_MAX (PATH_MAX_LEN + 256)

// This process's lock (a job locks one -o), kept for the checks.
typedef struct {
    int fd;                   // DIR/.lock, open and flock()ed; -1 when none is held
    char dir[PATH_MAX_LEN];   // -o as given
    char path[PATH_MAX_LEN];  // DIR/.lock
    dev_t dir_dev;            // the directory that was locked
    ino_t dir_ino;
} DirLock;
static DirLock dir_lock_ = {-1, "", "", 0, 0};

// "" while -o is still the directory this process locked (or it holds no lock); else a
// message saying what became of it, in why (DIR_LOCK_WHY_MAX bytes). Three stat calls.
static inline const char* dir_lock_lost(char* why) {
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
static inline int dir_lock_explain(char* buf, size_t n) {
    char why[DIR_LOCK_WHY_MAX];
    if (!dir_lock_lost(why)[0]) return 0;
    snprintf(buf, n, "%s", why);
    return 1;
}

// Stops (this rank) when -o is no longer the directory this process locked.
static inline void dir_lock_require(void) {
    char why[DIR_LOCK_WHY_MAX];
    if (dir_lock_lost(why)[0]) fatal("%s", why);
}

// Locks dir for this process until dir_lock_release (or exit); clash: what two jobs in one
// directory would break, for the refusal.
static inline void dir_lock_take_for(const char* dir, const char* clash) {
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
    fatal_cause_ = dir_lock_explain;
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

static inline void dir_lock_take(const char* dir) { dir_lock_take_for(dir, "its checkpoints and main.log"); }

// The directory is free for the next job.
static inline void dir_lock_release(void) {
    if (dir_lock_.fd >= 0) close(dir_lock_.fd);
    dir_lock_.fd = -1;
    if (fatal_cause_ == dir_lock_explain) fatal_cause_ = NULL;
}

#endif
