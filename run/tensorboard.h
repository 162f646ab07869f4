/*
 * TensorBoard event files, written by rank 0 in TensorBoard's own format: TFRecord
 * framing (a little-endian uint64 length, the masked CRC32C of those 8 bytes, the data,
 * the masked CRC32C of the data) around `Event` protos (tensorflow/core/util/event.proto):
 * the first holds file_version "brain.Event:2", each later one a wall_time, a step and a
 * `Summary` of `Value{tag, simple_value}` scalars. docs/formats.md lists the tags.
 *
 * One file per run segment, events.out.tfevents.<unix seconds>.<host>.<pid>.0, so that
 * TensorBoard reads the segments in the order they ran. A run that starts at step S (a
 * resume: its checkpoint's step; a fresh run: 0) first drops from the directory's older
 * files what it will log again, as main.log does (run/log.h): the records of the steps
 * after S, and the validation and eval records at S. Each file changed is rewritten to a
 * temporary and renamed over it, so a crash leaves the old file or the new one; a file left
 * with no scalars is removed. Each record goes out with one write(2) as it is made (what
 * TensorBoard loads is current every step); a failed write is cut back to the last whole
 * record and, like main.log's, ends the job once the step's checkpoint was tried.
 */
#ifndef RUN_TENSORBOARD_H
#define RUN_TENSORBOARD_H

#include <sys/types.h>

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int active;                // 0 (as zeroed): not written (not rank 0, no directory, --tensorboard 0)
    int fd;
    char path[PATH_MAX_LEN];
    off_t size;                // the bytes of the whole records written
    int write_errno;           // the first failed write's errno; 0 while every write succeeded
} TensorBoard;

typedef struct TbScalar {
    const char* tag;
    double value;              // written as a float (simple_value)
} TbScalar;

// The tags written at the step they were measured before (a validation, an eval), which a
// run resumed at that step measures again; every other tag belongs to the step it ends.
int tensorboard_tag_at_step_start(const char* tag);

// dir NULL: off. Else the older files' records after start_step go (see above), then this
// segment's file is made in dir (created if missing, one level) with its file_version.
void tensorboard_open(TensorBoard* tb, const char* dir, int start_step);

// One Event: step and its scalars.
void tensorboard_write(TensorBoard* tb, int step, const TbScalar* values, int n);

// Ends the job when a write failed.
void tensorboard_check(const TensorBoard* tb);

void tensorboard_close(TensorBoard* tb);

#ifdef __cplusplus
}
#endif
#endif
