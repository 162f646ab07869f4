/*
 * One job per output directory. Two jobs writing into the same -o would remove each
 * other's temporary checkpoints and interleave main.log, and the survivor would leave a
 * checkpoint without a manifest or with a wrong CRC. So rank 0 takes an flock(2) on
 * DIR/.lock for the whole run (the kernel drops it when the process ends, kill -9
 * included: no stale lock to clean up) and writes who holds it there; a second job that
 * finds it held stops at once naming the holder.
 */
#ifndef LLMC_DIR_LOCK_H
#define LLMC_DIR_LOCK_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "llmc/utils.h"

// Returns the open lock file's descriptor; close it (or exit) to release the directory.
static inline int dir_lock_take(const char* dir) {
    char path[PATH_MAX_LEN];
    path_format(path, sizeof(path), "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fatal("cannot open the lock file '%s': %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) fatal("cannot lock '%s': %s", path, strerror(errno));
        char holder[256] = "";
        ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        fatal("output directory '%s' is in use by another job (%s): one job per output directory, or its "
              "checkpoints and main.log would clash", dir, holder[0] ? holder : "holder unknown");
    }
    char host[128] = "?", when[64];
    gethostname(host, sizeof(host) - 1);
    time_t now = time(NULL);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    char line[256];
    int len = snprintf(line, sizeof(line), "host %s, pid %ld, started %s\n", host, (long)getpid(), when);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        fatal("cannot write the lock file '%s': %s", path, strerror(errno));
    }
    return fd;
}

#endif
