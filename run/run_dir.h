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

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

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

// "" while -o is still the directory this process locked (or it holds no lock); else a
// message saying what became of it, in why (DIR_LOCK_WHY_MAX bytes). Three stat calls.
const char* dir_lock_lost(char* why);

// Stops (this rank) when -o is no longer the directory this process locked.
void dir_lock_require(void);

// Locks dir for this process until dir_lock_release (or exit); clash: what two jobs in one
// directory would break, for the refusal.
void dir_lock_take_for(const char* dir, const char* clash);
void dir_lock_take(const char* dir);

// The directory is free for the next job.
void dir_lock_release(void);

#ifdef __cplusplus
}
#endif
#endif
