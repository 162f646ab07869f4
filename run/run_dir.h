/*
 * -o, the directory a run owns: every rule about it is here.
 *
 *   its name     every rank checks its length at start: the longest path the job writes
 *                in it must stay under the system's limit;
 *   its making   rank 0 makes it, parents too; a file of that name, or a symbolic link to
 *                nowhere, is refused;
 *   its lock     one job per directory (below);
 *   its owner    a fresh run (no -y 1) refuses a directory that holds another run's
 *                checkpoints or main.log, and says how to resume it (-y 1) or start over
 *                (--start-over, which removes them);
 *   its files    every file the job writes there, or reads back from there, is a regular
 *                file and never a link (run/files.h's fopenOwnCheck); the lock file too;
 *   its removal  before every write there the job checks that -o is still the directory it
 *                locked (run_dir_lost), and stops if not.
 *
 * One job per directory: two jobs writing into the same -o would remove each other's
 * temporary checkpoints and interleave main.log, and the survivor would leave a checkpoint
 * without a manifest or with a wrong CRC. So rank 0 takes an flock(2) on DIR/.lock for the
 * whole run (the kernel drops it when the process ends, kill -9 included: no stale lock to
 * clean up) and writes who holds it there; a second job that finds it held stops at once
 * naming the holder. prepro_corpus locks its --out-dir the same way.
 *
 * A lock guards a directory only while it is there: after an rm -rf (or mv) of -o the job
 * holds a lock file with no name, and a second job on the same -o locks a new one. So the
 * job checks the directory's device and inode and that its lock file is still linked in
 * it. Between two checks any operation there can fail instead (a save in flight: "cannot
 * open .../model.bin"), so the lock also explains every error of the process (fatal()'s
 * cause, run/error.h): while -o is lost, that is what the error says, the failed operation
 * in parentheses.
 */
#ifndef RUN_RUN_DIR_H
#define RUN_RUN_DIR_H

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

// Room for run_dir_lost's message: the directory's path and the reason.
#define RUN_DIR_WHY_MAX (PATH_MAX_LEN + 256)

// Every rank, at start: an -o whose longest file path would not fit is refused then, not
// at the first checkpoint.
void run_dir_check_length(const char* dir);

// Makes dir (and its parents) unless it is a directory already.
void run_dir_make(const char* dir);

// Rank 0: makes -o and locks it for this job until run_dir_close (or exit).
void run_dir_open(const char* dir);

// Rank 0, under the lock, for a run that does not resume from a checkpoint there: refuses
// another run's checkpoints and main.log (start_over: removes them, saying so).
// resume_asked: -y 1 found no checkpoint, so a main.log is this run's own, from an attempt
// that stopped before its first save. An empty main.log holds nothing.
void run_dir_claim(const char* dir, int resume_asked, int start_over);

// Locks dir for this process (run_dir_open's lock; prepro_corpus's for its --out-dir);
// clash: what two jobs in one directory would break, for the refusal.
void run_dir_lock(const char* dir, const char* clash);

// "" while the locked directory is still the one this process locked (or it holds no lock);
// else a message saying what became of it, in why (RUN_DIR_WHY_MAX bytes). Three stat calls.
const char* run_dir_lost(char* why);

// Stops (this rank) when the locked directory is no longer the one this process locked.
void run_dir_require(void);

// The directory is free for the next job.
void run_dir_close(void);

#ifdef __cplusplus
}
#endif
#endif
