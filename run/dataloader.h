/*
 * Data loader for llm.c token shards: int32 header[256] (magic 20240520, version 1,
 * token count), then uint16 tokens.
 *
 * A shard is read as rows of T tokens: row j holds tokens [j*T, j*T+T+1) (inputs, and the
 * targets shifted by one). With N ranks, micro-step i of rank r takes rows (i*N + r)*B ..
 * +B-1 of the shard's order, so every optimizer step reads the next ranks*B*accumulation
 * rows whatever their split over ranks, -b and micro-steps (what lets a run resume at
 * another rank count). With --dp-invariant the step's k*N micro-batches go rank-major
 * instead: micro-step i of rank r takes micro-batch r*k + i of the step (rows from
 * (r*k + i)*B on within the step's), so micro-batch g holds the same rows for every split,
 * and a shard ends at a whole optimizer step. An epoch is one pass over the shards; when
 * the next micro-step would run past a shard's last whole round, the loader moves to the
 * next shard, and after the last, to the next epoch.
 *
 * The order, llm.c's without --shuffle: the shards in sorted file-name order, the rows in
 * file order (a rank's B rows are then contiguous: one read). With --shuffle (the train
 * data), every epoch permutes the shards and the rows of each shard, from (--seed, epoch,
 * shard), identically on every rank; a shard then ends at a whole optimizer step, so which
 * rows a step reads depends only on the seed and the step.
 *
 * Every shard is checked completely when it is opened (header, size, every token id <
 * vocab size; with a manifest beside it, its size and CRC32C too, and in any case that it
 * is still the file it was when the job first opened it: run/shard_manifest.h). All
 * ranks open the same shards, so they all reach the same verdict, and a bad token is
 * reported before it can index past the embedding table.
 */
#ifndef RUN_DATALOADER_H
#define RUN_DATALOADER_H

#include <dirent.h>
#include <glob.h>
#include <stdint.h>

#include "run/crc32c.h"
#include "run/data_identity.h"
#include "llmc/rng.h"
#include "run/shard_manifest.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256

typedef struct {
    int B, T, rank, world, vocab_size;
    glob_t files;
    size_t num_shards;
    ShardCheck* checks;       // per shard: its manifest line, its identity (run/shard_manifest.h)
    size_t shard_index;       // current shard (a file index)
    size_t window_index;      // i: micro-steps taken from this shard
    size_t shard_tokens;      // tokens in the current shard
    FILE* file;               // current shard
    uint16_t* window;         // B*T+1 tokens
    int* inputs;              // B*T
    int* targets;             // B*T
    // The order (see the top). shard_order and row_order are NULL without --shuffle.
    size_t epoch;             // passes over the shards completed
    size_t order_pos;         // the current shard's place in this epoch's order
    size_t* shard_order;      // this epoch's shard order
    uint32_t* row_order;      // the current shard's rows, in this epoch's order
    size_t rows_used;         // rows of the current shard this epoch reads
    size_t rows_per_step;     // --shuffle, --dp-invariant: rows of one optimizer step (ranks x B x accumulation)
    int micro_steps;          // --dp-invariant: micro-steps per step, handed out rank-major; 0: micro-major
    uint64_t seed;
    FILE* trace;              // tests: "epoch shard row" of every row read (dataloader_trace)
} DataLoader;

void dataloader_init(DataLoader* d, const char* pattern, int B, int T, int rank, int world,
                     int vocab_size);
// Train and val shards keep their roles: -i reads no shard its manifest marks val, -j none it
// marks train, and the two read no shard in common (the same file) unless allow_overlap
// (--allow-train-val-overlap). val: NULL without validation.
void dataloader_check_roles(const DataLoader* train, const DataLoader* val, const char* train_pattern,
                            const char* val_pattern, int allow_overlap);

// The corpus the loader reads (run/data_identity.h), as its start found it: the first shard
// has been read whole, so its CRC32C is known even without a manifest.
void dataloader_identity(const DataLoader* d, DataIdentity* id);

// --shuffle: from here on the order of the top, for steps of rows_per_step rows (ranks x B
// x accumulation), from seed; starts at epoch 0's first shard.
void dataloader_shuffle(DataLoader* d, uint64_t seed, size_t rows_per_step);

// --dp-invariant: from here on micro-steps are handed out rank-major, micro_steps a step.
void dataloader_rank_major(DataLoader* d, int micro_steps);

void dataloader_next_batch(DataLoader* d);

// Batches of B rows (of all ranks together) that one pass over the shards gives in file
// order, from the shards' sizes when the job opened them (validation's -m bound).
size_t dataloader_batches_per_epoch(const DataLoader* d);

// Moves past n micro-steps as dataloader_next_batch would, reading none of their rows
// (--skip-batches: run/skip_batches.h).
void dataloader_skip(DataLoader* d, size_t n);

// A test build's trace (run/seams.h): every row this rank reads, as "epoch shard row", so
// that a test can check which rows each step read.
void dataloader_trace(DataLoader* d);

// Back to the first rows of epoch 0 (-a 1 trains on them only).
void dataloader_reset(DataLoader* d);

// The position to save in a checkpoint: the epoch, the shard (a file index), and how many
// of its tokens the steps so far consumed (rows x T, all ranks together). In tokens rather
// than windows, so that a run resumed with another number of ranks or batch size continues
// at the same place.
typedef struct {
    size_t epoch, shard, tokens_done;
} DataPosition;

void dataloader_free(DataLoader* d);

DataPosition dataloader_position(const DataLoader* d);

void dataloader_seek(DataLoader* d, DataPosition p);

#ifdef __cplusplus
}
#endif
#endif
