/*
 * Sharded parallel checkpoint I/O, shared by both trainers: save, find and restore a
 * checkpoint (run/checkpoint.h describes the files and their life cycle) through the
 * optimizer table (run/optimizer.h) and MPI-IO.
 *
 * No rank ever holds a whole array. Each rank writes only its own pieces (ZeRO-1: what it
 * owns; replicated: its 1/world part) straight into model.bin and optimizer.bin at their
 * byte offsets, and on resume reads only the pieces it holds at the new rank count and
 * layout. Pieces go through one staging buffer per rank (64 MiB, or
 * LLMC_CHECKPOINT_STAGING_MIB) in rounds: a round is a contiguous run of the file of at
 * most the buffer's size, made of one or more ranges of pieces that sit next to each
 * other in the file. Every round is one collective MPI_File_write_at_all /
 * MPI_File_read_at_all with an explicit offset (ranks with fewer rounds join with 0
 * bytes), so the MPI library can aggregate the ranks' requests on Lustre or GPFS.
 *
 * Checksums and finite values: each rank computes the CRC32C of every round it writes or
 * reads, and finds the round's first NaN or infinity if it holds one (one more pass over
 * bytes the CRC has just read), and sends (offset, bytes, crc, that offset) to rank 0, which sorts them by offset, requires them to tile the
 * file exactly, and joins them with crc32c_combine into the file's CRC: written into the
 * manifest on save, compared with it on load (the verdict is broadcast, so every rank
 * stops alike on a mismatch). A non-finite value stops a save before the checkpoint is
 * renamed into place (the earlier ones stay, and -nk removes nothing), and a load before
 * training on it: the update gate keeps them out of the state (run/step.h), but AdamW's
 * v overflows on a gradient above ~1.8e19 when --grad-clip 0 lets one through, and a
 * checkpoint of an older build may hold them. Rank 0 writes the headers (as rounds of its own), state.txt
 * and, once every rank has synced and closed the large files, the manifest, then renames
 * the temporary directory into place.
 *
 * MPI calls live in the few functions marked "collective" below, every one under
 * --comm-timeout: the non-blocking ones through run/mpi_wait.h, MPI-IO's blocking ones
 * through its watchdog thread, so a rank that stops in a save or a load ends the job with
 * one message naming the call, the file and the step (the earlier checkpoints are left
 * whole). Bad input is fatal() with the file's name; so is any MPI-IO error code, which
 * names the call and the file.
 */
#ifndef RUN_CHECKPOINT_IO_H
#define RUN_CHECKPOINT_IO_H

#include <mpi.h>
#include <signal.h>
#include <stdint.h>

#include "run/checkpoint.h"
#include "run/config.h"
#include "run/crc32c.h"
#include "run/dataloader.h"
#include "run/memory_check.h"
#include "run/mpi_wait.h"
#include "run/optimizer.h"
#include "llmc/rng.h"
#include "run/model_file.h"
#include "run/run_dir.h"
#include "run/step.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CHECKPOINT_HEADER_SLICE (-1)  // a slice holding a file header instead of a state range
#define CHECKPOINT_MEMCHECK_ENV "LLMC_CHECKPOINT_MEMCHECK"

// A range of one state of one tensor (or a header), at its place in a file.
typedef struct {
    uint64_t offset;         // bytes into the file
    uint64_t bytes;
    int which;               // an OptimizerState, or CHECKPOINT_HEADER_SLICE
    OptimizerPiece range;    // the tensor range (not for a header)
} CheckpointSlice;

// One collective call: a contiguous run of the file, slices [first, first + count).
typedef struct {
    uint64_t offset, bytes;
    int first, count;
} CheckpointRound;

// What a rank reports to rank 0 for each round it moved.
typedef struct {
    uint64_t offset, bytes;
    uint32_t crc;
    int32_t file;
    uint64_t nonfinite_at;   // the file offset of the round's first NaN or infinity; CHECKPOINT_FINITE: none
} CheckpointCrc;
#define CHECKPOINT_FINITE UINT64_MAX

// This rank's share of one large file.
typedef struct {
    int file;                // CHECKPOINT_MODEL or CHECKPOINT_OPTIMIZER
    char path[PATH_MAX_LEN];
    uint64_t size;           // the whole file's
    CheckpointSlice* slices;
    int num_slices, cap;
    CheckpointRound* rounds;
    int num_rounds;
    int header[MODEL_HEADER_INTS];  // rank 0 writes it (on load, read with the rest for the CRC)
    int step;                // the checkpoint's, for messages
} CheckpointFilePlan;

// ----------------------------------------------------------------------------
// The plan: which byte ranges of which file this rank moves, in rounds

// ----------------------------------------------------------------------------
// Moving the rounds

// Collective MPI-IO calls block until every rank joins; the watchdog thread bounds each
// by --comm-timeout ("checkpoint save: MPI_File_write_at_all of DIR/model.bin at step 4").
void checkpoint_io_begin(const CheckpointFilePlan* f, int saving, const char* call);

// One collective MPI-IO call under the deadline; an error code is fatal, naming it and the file.
#define CHECKPOINT_IO(f, saving, name, call)               \
    do {                                                   \
        checkpoint_io_begin(f, saving, name);              \
        int rc_ = (call);                                  \
        mpi_blocking_end();                                \
        checkpoint_io_check(rc_, (f)->path, name, saving); \
    } while (0)

// MPI's error classes rarely say why a write failed (a full disk can come back as
// MPI_ERR_OTHER, depending on which rank aggregated the write), so a failed save says
// what usually causes it.
void checkpoint_io_check(int rc, const char* path, const char* call, int saving);

// ----------------------------------------------------------------------------
// A transfer: both large files of one checkpoint, saved or loaded by every rank

typedef struct {
    CheckpointFilePlan plans[2];   // model.bin, optimizer.bin
    uint32_t crc[2];               // rank 0: each file's CRC32C, from every rank's rounds
    uint64_t nonfinite_at[2];      // rank 0: each file's first NaN or infinity (CHECKPOINT_FINITE: none)
    size_t state_bytes;            // this rank's pieces: master + m + v, fp32
    double mib_moved;              // rank 0: both files, MiB
} CheckpointTransfer;

// ----------------------------------------------------------------------------
// Memory check (tests): LLMC_CHECKPOINT_MEMCHECK=1 makes every rank reset its peak RSS
// counter (Linux: /proc/self/clear_refs) before a save or a load and print how far its
// peak rose above what it held before. The end-of-run peak RSS then counts from the last
// reset, so this is for tests, not for production runs.

// ----------------------------------------------------------------------------
// What a run calls (run/run.c)

// Collective: writes DIR/checkpoint_<step>/ (DIR = out_dir) from every rank's pieces and
// s (state.txt), under a temporary name renamed into place once whole; rank 0 stops every
// rank alike when -o is lost or the state holds a NaN or infinity (the earlier checkpoints
// are kept).
void checkpoint_save(const char* out_dir, const GPT2Config* cfg, Optimizer* o, const CheckpointState* s);

// ----------------------------------------------------------------------------
// The steps of a save, which run/checkpoint_async.h shares: checkpoint_save is begin,
// the collective writes, then commit.

// Collective: rank 0 removes stale temporaries and makes DIR/.checkpoint_<step>.tmp (its
// path written to tmp), and every rank stops alike when -o is no longer this job's.
void checkpoint_save_begin(const char* out_dir, int step, char* tmp, size_t n);

// This rank's pieces of both files of checkpoint dir, planned in rounds of at most
// staging_bytes (t->plans, t->state_bytes); returns the number of rounds.
int checkpoint_plan_transfer(CheckpointTransfer* t, const char* dir, const GPT2Config* cfg, Optimizer* o, int step,
                             size_t staging_bytes);

// Saving: round r's slices (and rank 0's header) from the optimizer into staging;
// loading: from staging into the optimizer.
void checkpoint_stage_round(const CheckpointFilePlan* f, const CheckpointRound* r, Optimizer* o,
                            unsigned char* staging, int saving);

// The file offset of the first NaN or infinity in a staged round, or CHECKPOINT_FINITE.
uint64_t checkpoint_round_nonfinite(const CheckpointFilePlan* f, const CheckpointRound* r,
                                    const unsigned char* staging);

// Collective: every rank's round reports (crcs[0..num_rounds)) to rank 0, which checks
// that they tile both files and fills t->crc, t->nonfinite_at and t->mib_moved.
void checkpoint_collect_crcs(CheckpointTransfer* t, const CheckpointCrc* crcs, int num_rounds);

// Collective, once every rank's files are synced and closed: rank 0 writes state.txt and
// the manifest and renames the temporary directory into place, or (a non-finite state,
// -o lost) removes it, and every rank stops alike. The saved line ends with how.
void checkpoint_save_commit(const char* out_dir, const GPT2Config* cfg, Optimizer* o, const CheckpointState* s,
                            const CheckpointTransfer* t, double t0, const char* how);

void checkpoint_free_transfer(CheckpointTransfer* t);

// -y 1, before the trainer is built: the newest checkpoint in -o, checked (manifest,
// sizes, headers, state.txt) against the shape of -e. With one, cfg->model becomes its
// model.bin, whose shape the trainer is built for; the weights come from
// checkpoint_restore, piece by piece. With none yet, the run starts from step 0 as if -y
// were 0. r must outlive cfg.
typedef struct {
    char dir[PATH_MAX_LEN];
    char model_path[PATH_MAX_LEN];
    CheckpointState state;
    CheckpointManifest manifest;
} CheckpointResume;

void checkpoint_find_resume(TrainConfig* cfg, CheckpointResume* r);

// -y 1, once the run's batch and length are known (every rank alike): a resume continues
// the saved run's steps exactly, so what a step means must not change. The rank count,
// -b and the accumulation may (a run saved on 4 ranks resumes on 2 with twice the
// micro-steps), the global batch (tokens per step), -t, -a, the schedule (-l -u -q, and -x
// where the learning rate decays) and AdamW's settings may not, unless
// --allow-resume-change says the change is meant. Returns 1 when the checkpoint is already
// at -x (nothing left to do).
int checkpoint_resume_check(const TrainConfig* cfg, const CheckpointResume* r, const DataIdentity* data,
                            long long tokens_per_step, int max_steps);

// After the trainer is built for the checkpoint's shape (collective): weights and AdamW
// state from the files, then the data position and the sampling RNG.
// AdamW's m and v, averages of the same gradients m = sum a_i g_i and v = sum b_i g_i^2,
// obey m^2 <= (sum a_i^2 / b_i) v (Cauchy-Schwarz), at most C v with
// C = (1 - b1)^2 / ((1 - b2) (1 - b1^2 / b2)) for any number of steps (1.36 at 0.9, 0.95); a
// change of the betas mid-run adds the new C (the old terms only shrink). m and v swapped, or
// ranks' parts moved, break it nearly everywhere though every CRC and value passes.
// checkpoint_moments_bound: C, or 0 when b1^2 >= b2 (no bound).
float checkpoint_moments_bound(float b1, float b2);
// moments_bound > 0: AdamW's m and v checked against it (muon: its matrices left out).
void checkpoint_restore(const CheckpointResume* r, const GPT2Config* mc, Optimizer* o, DataLoader* train,
                        uint64_t* sample_rng, int muon, float moments_bound);

// Collective, for a replicated optimizer's finish_import: rank r holds its part of buf
// (optimizer_split_range of total elements); afterwards every rank holds all of it. One
// broadcast per part, in pieces an int count can carry.
void checkpoint_share_split(float* buf, size_t total, int world);

// What a step of this run means, beyond its batch: the schedule, -a and AdamW's settings.
void checkpoint_step_meaning(const TrainConfig* cfg, int max_steps, CheckpointState* s);

#ifdef __cplusplus
}
#endif
#endif
