// run/error.c: the error policy run/error.h describes.
#include "run/error.h"

#include <signal.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int utils_rank_ = -1;
static int utils_world_ = -1;
static FatalCause fatal_cause_ = NULL;

static int utils_env_int(const char* const* names, int fallback) {
    for (int i = 0; names[i]; i++) {
        const char* v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return fallback;
}

int utils_rank(void) {
    static const char* const names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    if (utils_rank_ < 0) utils_rank_ = utils_env_int(names, 0);
    return utils_rank_;
}

int utils_world(void) {
    static const char* const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
    if (utils_world_ < 0) utils_world_ = utils_env_int(names, 1);
    return utils_world_;
}

void utils_set_rank(int rank, int world) {
    utils_rank_ = rank;
    utils_world_ = world;
}

void fatal_set_cause(FatalCause cause) { fatal_cause_ = cause; }
FatalCause fatal_cause(void) { return fatal_cause_; }

void fatal(const char* fmt, ...) {
    signal(SIGTERM, SIG_DFL);  // a job ending on an error ends at the launcher's first SIGTERM (run/preempt.h saves none)
    signal(SIGINT, SIG_DFL);
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
