/*
 * Checkpoints: one directory per step, DIR/checkpoint_00000123/, holding
 *   model.bin      the fp32 master weights as an llm.c model file (version 3), so a
 *                  checkpoint is also a model any llm.c tool can load;
 *   optimizer.bin  AdamW m and v for every parameter, in the model file's tensor order;
 *   state.txt      step, data position, sampling RNG, and the run's shape (for messages);
 *   manifest.txt   one line "file bytes crc32c" for each of the three, written last.
 * Everything is in model-space order, independent of DP, buckets and layout, so a run
 * saved on 4 ranks resumes on 2 or 3.
 *
 * Life cycle:
 *   save   into DIR/.checkpoint_00000123.tmp; every file is flushed to disk, then the
 *          directory is renamed into place. A crash or kill -9 at any point leaves the
 *          checkpoints that were there plus, at most, a temporary directory, which no
 *          reader takes for a checkpoint and the next start (or save) removes.
 *   resume the newest checkpoint_N, whose model must have -e's shape (a requeued job
 *          repeats its command line). A renamed directory is complete by construction, so
 *          a missing file, or one whose size or CRC32C disagrees with the manifest, was
 *          damaged afterwards: loading stops and names the file, rather than silently
 *          training on from an older checkpoint (deleting the damaged one is the user's
 *          call, and the message says so).
 *   prune  (-nk N) once a new checkpoint is in place, the older ones beyond the newest N
 *          are removed: only the files a checkpoint holds, symlinks never followed.
 * Files are untrusted like any input: every field is range-checked before use.
 *
 * This file holds what needs no MPI: names, listing, removal, the small text files, the
 * headers and the per-rank checks before a resume. run/checkpoint_io.h writes and reads
 * the large files, every rank its own pieces in parallel, and verifies their CRC32C.
 */
#ifndef RUN_CHECKPOINT_H
#define RUN_CHECKPOINT_H

#include <dirent.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "run/crc32c.h"
#include "run/data_identity.h"
#include "llmc/gpt2_spec.h"
#include "run/model_file.h"
#include "run/outliers.h"
#include "run/skip_batches.h"
#include "run/spikes.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OPTIMIZER_MAGIC 20241129
#define OPTIMIZER_VERSION 1
#define CHECKPOINT_MANIFEST "manifest.txt"
#define CHECKPOINT_TEXT_MAX 65536  // state.txt and manifest.txt: a few lines (the outlier windows the longest)

// The files the manifest covers.
#define CHECKPOINT_WORD_MAX 24  // a state.txt word: an option's choice (--optimizer muon)

enum { CHECKPOINT_MODEL, CHECKPOINT_OPTIMIZER, CHECKPOINT_STATE, CHECKPOINT_NUM_FILES };
extern const char* const CHECKPOINT_FILES[CHECKPOINT_NUM_FILES];

typedef struct {
    int step;                   // optimizer steps completed
    size_t epoch;               // train data position: the epoch, ...
    size_t shard;               // ... shard index ...
    size_t shard_tokens_done;   // ... and tokens of it consumed (a multiple of ranks*B*T)
    uint64_t sample_rng;
    int world, B, T, grad_accum_steps;  // the run that saved it
    // What a step means: the global batch (world*B*T*grad_accum_steps), T and these; a
    // resume that changes any of them is refused (run/checkpoint_io.h). Checkpoints of
    // earlier versions lack them (has_step_meaning 0) and resume with the batch checked only.
    int max_steps, warmup_steps, overfit_single_batch;
    float lr, final_lr_fraction, weight_decay, beta1, beta2, eps, grad_clip;
    int has_step_meaning;
    // The data order (--shuffle and its --seed) and the epoch, the same way: absent from
    // earlier checkpoints (has_data_order 0), which ran in file order.
    int shuffle, data_seed;
    int has_data_order;
    // -sl/-sg's windows of recent losses and grad norms (run/outliers.h), so that a resume
    // decides as the straight run would; absent from earlier checkpoints (has_outliers 0).
    OutlierState outliers;
    int has_outliers;
    // Non-finite steps in a row up to this step, so that a resume that diverges again stops
    // as the straight run would (--max-nonfinite-steps); absent from earlier checkpoints (0).
    int nonfinite_in_a_row;
    int has_nonfinite_count;
    // The train data (run/dataloader.h's DataIdentity): a resume on another corpus is refused
    // unless --allow-corpus-change; absent from earlier checkpoints (has_corpus 0: not checked).
    char corpus[DATA_CORPUS_NAME_MAX];
    size_t corpus_shards;
    uint64_t corpus_digest;
    int has_corpus;
    // The --skip-batches ranges the run has applied (run/skip_batches.h); none in earlier
    // checkpoints.
    SkipBatches skipped;
    // The optimizer (--optimizer and Muon's settings, run/config.h): a resume with the other
    // one is refused; absent from earlier checkpoints (has_optimizer 0), which ran AdamW.
    char optimizer[CHECKPOINT_WORD_MAX];
    float muon_momentum, muon_extra_scale;
    int muon_nesterov, muon_ns_steps, muon_split_qkv;
    char muon_coefficients[CHECKPOINT_WORD_MAX], muon_scale[CHECKPOINT_WORD_MAX];
    int has_optimizer;
    // The bound on AdamW's m^2 / v over the run's history, which the load checks
    // (checkpoint_moments_bound, summed over each change of the betas); 0: none; absent from
    // earlier checkpoints (has_moments_bound 0: the check is left out).
    float moments_bound;
    int has_moments_bound;
    // The spike detector's open streak and vouched checkpoint (run/spikes.h; its history is
    // in outliers.good_loss, good_norm); absent from earlier checkpoints (has_spikes 0).
    SpikeStreak spikes;
    int has_spikes;
} CheckpointState;

// ----------------------------------------------------------------------------
// Names, listing, removal

void checkpoint_path(char* out, size_t n, const char* dir, int step, int temporary);

// Removes a checkpoint (or temporary) directory: the files a checkpoint holds, then the
// directory itself. A symlink is removed, never followed, wherever it points. A directory
// holding anything else is left whole, with a warning: what is not ours is not deleted.
// Returns 1 when the path is gone.
// 1 when checkpoint directory path holds a file no checkpoint writes (its name in name): a
// user's file, which no removal touches.
int checkpoint_dir_foreign(const char* path, char* name, size_t n);
int checkpoint_remove_dir(const char* path);

// Temporaries are what interrupted saves leave behind (kill, crash, full disk).
void checkpoint_remove_stale_temporaries(const char* dir);

// -nk keep: removes the checkpoints beyond the newest `keep` of those up to step `newest`
// (the one just saved, complete and in place), except `vouched` (run/spikes.h: the newest
// one a good step's loss measured; 0: none), the one to go back to after a spike.
// Checkpoints of later steps, which an earlier run may have left in the same directory,
// are not this run's to count or remove. The caller checks that -o is still its own first
// (run/run_dir.h).
void checkpoint_prune(const char* dir, int keep, int newest, int vouched);

// ----------------------------------------------------------------------------
// Small text files (state.txt, manifest.txt)

// A flushed file survives a power loss; a checkpoint is renamed into place only when all
// of it would. (Some file systems cannot sync a directory: EINVAL is not an error.)
void checkpoint_fsync(const char* path);

// ----------------------------------------------------------------------------
// state.txt: "key value" lines, every value a non-negative integer in a stated range, or
// a finite non-negative float written with the 9 digits that give back its exact bits.


void checkpoint_write_state(const char* path, const CheckpointState* s);

// ----------------------------------------------------------------------------
// The two large files, in llm.c's tensor-major order (gpt2_file_index), fp32:
//   model.bin      int32 header[256] (an llm.c version 3 model header), then the master;
//   optimizer.bin  int32 header[256] (magic, version, step), then m, then v.
// run/checkpoint_io.h writes and reads them in parallel, each rank its own pieces.

#define CHECKPOINT_HEADER_BYTES (MODEL_HEADER_INTS * sizeof(int))

void checkpoint_optimizer_header(int step, int header[MODEL_HEADER_INTS]);

// Bytes of model.bin or optimizer.bin for a model of n parameters (checked: n comes from
// an untrusted header's shape).
uint64_t checkpoint_file_bytes(int file, size_t n, const char* what);

// ----------------------------------------------------------------------------
// manifest.txt: "file bytes crc32c" (crc32c as 8 hex digits) for every checkpoint file.

typedef struct {
    uint64_t bytes[CHECKPOINT_NUM_FILES];
    uint32_t crc[CHECKPOINT_NUM_FILES];
} CheckpointManifest;

void checkpoint_write_manifest(const char* dir, const CheckpointManifest* m);

// The manifest of checkpoint dir, and every file it lists present with its size; else
// stops, naming the file. The CRCs are compared where the files are read.
void checkpoint_read_manifest(const char* dir, CheckpointManifest* m);

// The message for a file whose bytes do not have the manifest's CRC32C.
void checkpoint_checksum_mismatch(const char* path, uint32_t crc, uint32_t expected) LLMC_NORETURN;

// ----------------------------------------------------------------------------
// Find and open for resume

// The newest checkpoint in dir: returns its step and writes its path, or -1 if none.
int checkpoint_find_latest(const char* dir, char* path, size_t n);

// -y 1: the newest checkpoint in out_dir, of the same shape as the run's model (run_model,
// the -e it was given: requeued jobs repeat their command line, so another shape means
// another run's directory). Every rank checks what is cheap to check: the manifest, every
// file's size, state.txt's checksum and fields, both headers. The large files' checksums
// are verified while they are read (run/checkpoint_io.h). Writes the checkpoint's path,
// state and manifest and returns 1; returns 0, saying so, when out_dir has none yet.
int checkpoint_open_for_resume(const char* out_dir, const GPT2Config* run_shape, const char* run_model,
                               char* dir, size_t n, CheckpointState* state,
                               CheckpointManifest* manifest);

// The steps of the checkpoints (or temporary directories) in dir, newest first, in a
// new array; returns how many. A directory that does not exist has none.
int checkpoint_list(const char* dir, int temporary, int** steps);

#ifdef __cplusplus
}
#endif
#endif
