/*
 * Ranks agree on the job before they start it.
 *
 * Every rank reads its own command line, model file and data, and on a cluster each host
 * sees its own file system: a rank given other files (another host's copy of the data
 * with an extra shard, a stale binary, a different -l in a hand-written launch script)
 * would run until some collective disagreed in size, and Open MPI ends that with a
 * backtrace that names nothing. So at start every rank writes what defines the job as
 * "field: value" lines:
 *   - every option of the command line (run/config.h's table, so a new flag is covered);
 *   - the shape of the model that -e names (the checkpoint's on a resume, and its step);
 *   - every train and validation file the patterns match, with its size;
 *   - the build: the trainer, its precision, whether zero1/ is in, and a CRC32C of the
 *     program file itself;
 * and the ranks compare a 64-bit digest of that text in one collective (a bitwise AND of
 * the digest and of its complement: equal everywhere exactly when AND(h) == ~AND(~h)).
 * Only when they differ do the texts travel, to rank 0, which names the first field that
 * differs and the values on each side; every rank then stops with that one message:
 *
 *   error: the ranks disagree on train file 1: rank 0 has 'data/b.bin, 2048 bytes', rank
 *   3 has 'none' (every rank must be given the same job)
 */
#ifndef RUN_RANKS_AGREE_H
#define RUN_RANKS_AGREE_H

#include <glob.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>

#include "run/config.h"
#include "run/crc32c.h"
#include "llmc/gpt2_spec.h"
#include "run/mpi_wait.h"
#include "run/model_file.h"
#include "run/step.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char* text;
    size_t len, cap;
} JobText;

// Collective, right after the flags (and a resume's checkpoint) are known: returns when
// every rank describes the same job; otherwise every rank stops with one message.
void ranks_agree(const TrainConfig* cfg, const char* build, int resume_step);

#ifdef __cplusplus
}
#endif
#endif
