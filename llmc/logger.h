/*
 * main.log in the output directory, written by rank 0 only, one line per event, in
 * llm.c's format plus extra fields:  "s:12 trl:4.123456 norm:1.2345 lr:3.00e-04 ms:812.3"
 * for a train step and "s:12 tel:4.2345" for a validation loss. Flushed per line, so a
 * crashed run keeps what it logged. On resume the log is appended to.
 */
#ifndef LLMC_LOGGER_H
#define LLMC_LOGGER_H

#include <sys/stat.h>
#include <sys/types.h>

#include "llmc/dir_lock.h"
#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    FILE* file;
    int lock_fd;  // DIR/.lock, held for the run (llmc/dir_lock.h); -1 when none
} Logger;

static inline void make_dir_or_die(const char* dir) {
    struct stat st;
    if (lstat(dir, &st) == 0 && S_ISLNK(st.st_mode) && stat(dir, &st) != 0) {
        char target[PATH_MAX_LEN];
        ssize_t n = readlink(dir, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = '\0';
        fatal("output path '%s' is a symbolic link to '%s', which does not exist", dir, target);
    }
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) fatal("output path '%s' exists and is not a directory", dir);
        return;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) fatal("cannot create output directory '%s': %s", dir, strerror(errno));
}

static inline void logger_init(Logger* lg, const char* dir, int rank, int append) {
    lg->file = NULL;
    lg->lock_fd = -1;
    if (dir == NULL || rank != 0) return;
    make_dir_or_die(dir);
    lg->lock_fd = dir_lock_take(dir);
    char path[PATH_MAX_LEN];
    path_format(path, sizeof(path), "%s/main.log", dir);
    lg->file = fopenCheck(path, append ? "a" : "w");
}

static inline void logger_log_train(Logger* lg, int step, float loss, float norm, float lr, double ms) {
    if (!lg->file) return;
    fprintf(lg->file, "s:%d trl:%.6f norm:%.4f lr:%.2e ms:%.1f\n", step, loss, norm, lr, ms);
    fflush(lg->file);
}

static inline void logger_log_val(Logger* lg, int step, float loss) {
    if (!lg->file) return;
    fprintf(lg->file, "s:%d tel:%.6f\n", step, loss);
    fflush(lg->file);
}

static inline void logger_close(Logger* lg) {
    if (lg->file) fclose(lg->file);
    lg->file = NULL;
    if (lg->lock_fd >= 0) close(lg->lock_fd);  // the directory is free for the next job
    lg->lock_fd = -1;
}

#ifdef __cplusplus
}
#endif
#endif
