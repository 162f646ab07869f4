// run/log.c: what run/log.h declares.
#include "run/log.h"

// A run resumed at `step` logs again the train entries after it and the validation and
// eval entries at it: those of the run that saved the checkpoint go (written to a temporary file that
// replaces the log, so a crash leaves the old log or the new one, never half of one).
static void logger_drop_repeated(const char* path, int step) {
    struct stat st;
    if (lstat(path, &st) != 0) return;  // no log yet
    FILE* in = fopenOwnCheck(path, "r");
    char tmp[PATH_MAX_LEN], line[1024], kind[8];
    path_format(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* out = fopenOwnCheck(tmp, "w");
    int dropped = 0, s;
    while (fgets(line, sizeof(line), in)) {
        if (sscanf(line, "s:%d %7[a-z]:", &s, kind) != 2) kind[0] = '\0';
        int at_step = strcmp(kind, "tel") == 0 || strcmp(kind, "eval") == 0;  // logged before step s runs
        if (kind[0] && (at_step ? s >= step : s > step)) {
            dropped++;
            continue;
        }
        if (fputs(line, out) < 0) break;  // reported by the close
    }
    fclose(in);
    int failed = ferror(out), err = errno;
    if (fclose(out) != 0 || failed) {  // a full disk: the old log stays, and no .tmp holds the space
        if (!failed) err = errno;
        unlink(tmp);
        fatal("cannot write %s: %s (main.log is unchanged; free space and resume again)", tmp, strerror(err ? err : EIO));
    }
    if (rename(tmp, path) != 0) fatal("cannot replace %s with %s: %s", path, tmp, strerror(errno));
    if (dropped) printf("main.log: dropped %d entries after step %d, which this resumed run repeats\n", dropped, step);
}

// A main.log.tmp is dead once this job holds the lock (its writer stopped while rewriting
// the log); on a full disk it would hold the space the rewrite needs.
static void logger_remove_dead_temporary(const char* log_path) {
    char tmp[PATH_MAX_LEN];
    path_format(tmp, sizeof(tmp), "%s.tmp", log_path);
    if (unlink(tmp) == 0) printf("main.log: removed %s, left by a run that stopped while rewriting main.log\n", tmp);
    else if (errno != ENOENT) fatal("cannot remove %s: %s", tmp, strerror(errno));
}

void logger_open(Logger* lg, const char* dir, int append) {
    memset(lg, 0, sizeof(*lg));
    if (dir == NULL) return;
    path_format(lg->path, sizeof(lg->path), "%s/main.log", dir);
    logger_remove_dead_temporary(lg->path);
    lg->file = fopenOwnCheck(lg->path, append ? "a" : "w");
}

void logger_resume_at(Logger* lg, int step) {
    if (!lg->file) return;
    run_dir_require();
    fcloseCheck(lg->file, lg->path);
    logger_drop_repeated(lg->path, step);
    lg->file = fopenOwnCheck(lg->path, "a");
}

void logger_line(Logger* lg, const char* fmt, ...) {
    if (!lg->file || lg->write_errno || lg->dir_lost) return;  // after a failure, nothing more (the job is ending)
    char why[RUN_DIR_WHY_MAX];
    if (run_dir_lost(why)[0]) {
        lg->dir_lost = 1;
        return;
    }
    // A line is written whole or not at all: one cut by a full disk or ulimit -f is cut back off.
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    struct stat st;
    off_t before = fstat(fileno(lg->file), &st) == 0 ? st.st_size : -1;
    if (n < 0 || (size_t)n >= sizeof(line)) fatal("main.log: a line longer than %zu bytes (%s)", sizeof(line), fmt);
    if (fwrite(line, 1, (size_t)n, lg->file) != (size_t)n || fflush(lg->file) != 0) {
        lg->write_errno = errno ? errno : EIO;
        if (before >= 0 && ftruncate(fileno(lg->file), before) != 0) lg->write_errno = errno;
    }
}

void logger_log_train(Logger* lg, int step, float loss, float norm, float lr, double ms, const char* more) {
    logger_line(lg, "s:%d trl:%.6f norm:%.9g lr:%.2e ms:%.1f%s\n", step, loss, norm, lr, ms, more);  // the norm to full float precision (dev/bench/)
}

void logger_log_val(Logger* lg, int step, float loss) { logger_line(lg, "s:%d tel:%.6f\n", step, loss); }

void logger_log_epoch(Logger* lg, int step, size_t epoch) { logger_line(lg, "s:%d epoch:%zu\n", step, epoch); }

void logger_log_eval(Logger* lg, int step, float accuracy) {
    logger_line(lg, "s:%d eval:%.4f\n", step, accuracy);
}

void logger_check(const Logger* lg) {
    if (lg->dir_lost) run_dir_require();
    if (lg->write_errno) {
        fatal("cannot write %s: %s (its last lines are lost; %s and resume with -y 1)", lg->path,
              strerror(lg->write_errno), lg->write_errno == EFBIG ? "raise the file size limit (ulimit -f)" : "free space");
    }
}

void logger_close(Logger* lg) {
    if (lg->file) {
        int failed = ferror(lg->file);
        if ((fclose(lg->file) != 0 || failed) && !lg->write_errno) lg->write_errno = errno ? errno : EIO;
        lg->file = NULL;
        logger_check(lg);
    }
    lg->file = NULL;
}
