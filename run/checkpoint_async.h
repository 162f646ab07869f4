/*
 * --async-save 1: a checkpoint written while training goes on (run/checkpoint.h describes
 * the files and their life cycle, which do not change).
 *
 * At a save step every rank copies its pieces of model.bin and optimizer.bin (the same
 * rounds as the synchronous save, run/checkpoint_io.h) into a host snapshot, one buffer
 * kept for the run, and returns to the step loop; a background thread writes the snapshot
 * into the temporary directory with plain POSIX pwrite at the rounds' file offsets, fsyncs
 * and closes the files, computing each round's CRC32C and first non-finite value as it goes.
 * The thread makes no MPI call: every collective stays on the main thread, which needs no
 * more than MPI_THREAD_SINGLE-safe use (the watchdog's thread aside, which only aborts).
 *
 * At every step end while a save is in flight (checkpoint_async_progress), the ranks
 * agree on where their writers are (an all-gather of one status each). Once every writer
 * is done, the commit is the synchronous save's own (checkpoint_save_commit): the CRCs
 * to rank 0, state.txt, the manifest, the rename into place under -o's lock; -nk prunes
 * only after it (the caller). So a kill -9 at any moment leaves the committed checkpoints
 * whole plus at most the temporary directory, which the next start removes.
 *
 * At most one save is in flight: a save due while the previous one is still being
 * written, and the end of the run, wait for it (rank 0 says how long). The deadline is
 * --comm-timeout, counted from the writer's last completed write in time this process ran
 * (as run/watchdog.h counts: a job stopped and continued as a whole is not blamed): a
 * writer that makes no progress for that long (a hung disk) or fails (a full disk) ends
 * the job with one error: line from rank 0 naming the rank, the file and the step; the
 * earlier checkpoints stay. While steps run, the main thread looks at each step end (steps
 * longer than that gap do not count); while it waits, every millisecond.
 *
 * Why not the default: the snapshot costs every rank a host copy of its master, m and v
 * (12 bytes per owned parameter, counted by run/memory_check.h), and POSIX writes of
 * disjoint ranges of one shared file by many hosts need a file system that keeps them
 * apart (Lustre, GPFS, a local disk; not NFS), where the synchronous save's MPI-IO
 * aggregates the ranks' requests.
 */
#ifndef RUN_CHECKPOINT_ASYNC_H
#define RUN_CHECKPOINT_ASYNC_H

#include <pthread.h>

#include "run/checkpoint_io.h"

#ifdef __cplusplus
extern "C" {
#endif

// The writer's state, as the ranks report it to each other.
enum { ASYNC_WRITING, ASYNC_DONE, ASYNC_FAILED, ASYNC_STALLED };

typedef struct {
    int in_flight;            // a save begun and not yet committed
    CheckpointState state;    // for state.txt, written at the commit
    const char* out_dir;
    const GPT2Config* cfg;
    Optimizer* opt;
    double timeout_s;         // --comm-timeout (0: none)
    double t0_ms, snapshot_ms;
    CheckpointTransfer transfer;
    CheckpointCrc* crcs;
    int num_rounds;
    unsigned char* snapshot;  // this rank's rounds of both files, back to back
    size_t snapshot_cap;
    pthread_t thread;
    // Written by the writer, read by the main thread (atomically).
    int status;               // ASYNC_WRITING or ASYNC_DONE / ASYNC_FAILED
    double progress_s;        // watchdog_monotonic_s() at its last completed write
    // The main thread's deadline: when it last looked, the progress it saw, and for how
    // long (time this process ran) that has not changed.
    double last_look_s, seen_progress_s, quiet_s;
    char error[PATH_MAX_LEN + 256];  // ASYNC_FAILED: what failed
} CheckpointAsync;

// Collective, with no save in flight (checkpoint_async_progress waits for it): snapshots
// this rank's pieces of step s->step and starts the writer. out_dir, cfg and o must
// outlive the save.
void checkpoint_async_begin(CheckpointAsync* a, const char* out_dir, const GPT2Config* cfg, Optimizer* o,
                            const CheckpointState* s, double timeout_s);

// Collective, at the end of step steps_done: with a save in flight, the ranks agree
// whether every writer is done, and then commit it. wait 1: until it is committed.
// Returns the step of the checkpoint committed now, or 0.
int checkpoint_async_progress(CheckpointAsync* a, int steps_done, int wait);

void checkpoint_async_free(CheckpointAsync* a);

#ifdef __cplusplus
}
#endif
#endif
