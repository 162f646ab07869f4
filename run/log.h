/*
 * main.log in the output directory, written by rank 0 only, one line per event, in
 * llm.c's format plus extra fields:  "s:12 trl:4.123456 norm:1.2345 lr:3.00e-04 ms:812.3"
 * for a train step, then appended (so llm.c's readers and scripts/plot_loss.sh still read
 * it) the step metrics of run/metrics.h, " tps:1262 mfu:4.210 comm:3.100 mem:812.0
 * slow:790.100@1" (and gmem: for a GPU); "s:12 busy_ms:min/med/max@rank
 * comm_ms:min/med/max@rank" every --straggler-every steps; "s:12 tel:4.2345" for a
 * validation loss and "s:12 eval:0.2500" for a HellaSwag-style accuracy (-H 1)
 * (docs/formats.md has every line). Flushed per line, so a
 * crashed run keeps what it logged. On resume the log is appended to, once the entries
 * of the steps the resumed run repeats (those after its checkpoint) are dropped, so every
 * step appears once. A write that fails (a full disk) is remembered, not ignored: the
 * training loop ends the job naming the file once the step's checkpoint, if one is due,
 * has been tried (logger_check). So is a line not written because -o is no longer the
 * directory this job locked (run/run_dir.h: checked before every line).
 */
#ifndef RUN_LOG_H
#define RUN_LOG_H

#include <stdarg.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "run/run_dir.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    FILE* file;
    char path[PATH_MAX_LEN];
    int write_errno;  // the first failed write's errno; 0 while every write succeeded
    int dir_lost;     // a line was not written: -o is no longer the locked directory
} Logger;

// Rank 0 with -o (dir; NULL: no log): DIR/main.log, a regular file and no link, once the
// run holds -o's lock and has claimed it (run/run_dir.h); a main.log.tmp that a rewrite cut
// short is removed first. append: a resumed run's log (logger_resume_at then drops what the
// run repeats).
void logger_open(Logger* lg, const char* dir, int append);

void logger_line(Logger* lg, const char* fmt, ...) LLMC_PRINTF(2, 3);

// more: the fields appended after llm.c's (run/metrics.h's metrics_format_log).
void logger_log_train(Logger* lg, int step, float loss, float norm, float lr, double ms, const char* more);

void logger_log_val(Logger* lg, int step, float loss);
// The train data's epoch (0-based) began with step's batch.
void logger_log_epoch(Logger* lg, int step, size_t epoch);

void logger_log_eval(Logger* lg, int step, float accuracy);

// Ends the job when a write to the log failed (or was not made: run/run_dir.h).
void logger_check(const Logger* lg);

void logger_close(Logger* lg);

// Once a resume from `step` is accepted (rank 0's log only).
void logger_resume_at(Logger* lg, int step);

#ifdef __cplusplus
}
#endif
#endif
