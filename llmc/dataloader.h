/*
 * Data loader for llm.c token shards: int32 header[256] (magic 20240520, version 1,
 * token count), then uint16 tokens.
 *
 * Rank-strided like llm.c: with N ranks, window i of rank r starts at token (i*N + r)*B*T
 * of the current shard and holds B*T+1 tokens (inputs, and targets shifted by one). When
 * the next round of windows would run past the end, the loader moves to the next shard
 * (in sorted file-name order, wrapping around to the first).
 *
 * Every shard is checked completely when it is opened (header, size, every token id <
 * vocab size). All ranks open the same shards, so they all reach the same verdict, and a
 * bad token is reported before it can index past the embedding table.
 */
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <glob.h>
#include <stdint.h>

#include "llmc/untrusted.h"
#include "llmc/utils.h"

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
    size_t shard_index;       // current shard
    size_t window_index;      // i: next window of this rank is (i*world + rank)*B*T
    size_t shard_tokens;      // tokens in the current shard
    FILE* file;               // current shard
    uint16_t* window;         // B*T+1 tokens
    int* inputs;              // B*T
    int* targets;             // B*T
} DataLoader;

// Reads and checks a shard header; returns its token count. The count (a non-negative
// int32, so at most 2^31-1 tokens) must describe the file's size exactly.
static inline size_t shard_check_header(FILE* f, const char* path) {
    int header[SHARD_HEADER_INTS];
    long size = file_size_of(f, path);
    if (size < (long)sizeof(header)) fatal("%s: too small to be a token shard (%ld bytes)", path, size);
    freadCheck(header, sizeof(int), SHARD_HEADER_INTS, f, path);
    if (header[0] != SHARD_MAGIC) {
        fatal("%s: not a token shard (magic %d, expected %d)", path, header[0], SHARD_MAGIC);
    }
    if (header[1] != SHARD_VERSION) fatal("%s: unsupported shard version %d (expected %d)", path, header[1], SHARD_VERSION);
    size_t ntok = (size_t)field_range_check(path, "header field token count", header[2], 0, INT32_MAX);
    size_t expected = size_add_check(sizeof(header), size_mul_check(ntok, sizeof(uint16_t), path), path);
    if ((size_t)size != expected) {
        fatal("%s: header field token count = %zu needs %zu bytes, but the file has %ld (truncated or corrupt)", path,
              ntok, expected, size);
    }
    return ntok;
}

// Scans every token of an open shard (positioned after the header) for ids >= vocab_size.
static inline void shard_check_tokens(FILE* f, const char* path, size_t ntok, int vocab_size) {
    enum { CHUNK = 1 << 16 };
    uint16_t* buf = (uint16_t*)mallocCheck(CHUNK * sizeof(uint16_t));
    for (size_t done = 0; done < ntok;) {
        size_t n = ntok - done < CHUNK ? ntok - done : CHUNK;
        freadCheck(buf, sizeof(uint16_t), n, f, path);
        for (size_t i = 0; i < n; i++) {
            if (buf[i] >= vocab_size) {
                int id = buf[i];
                free(buf);
                fatal("%s: token %zu has id %d, not below the vocabulary size %d", path, done + i, id, vocab_size);
            }
        }
        done += n;
    }
    free(buf);
}

static inline void dataloader_open_shard(DataLoader* d, size_t index) {
    if (d->file) fcloseCheck(d->file, "token shard");
    const char* path = d->files.gl_pathv[index];
    d->file = fopenCheck(path, "rb");
    d->shard_tokens = shard_check_header(d->file, path);
    shard_check_tokens(d->file, path, d->shard_tokens, d->vocab_size);
    size_t needed = (size_t)d->world * d->B * d->T + 1;
    if (d->shard_tokens < needed) {
        fatal("%s: %zu tokens, but one step of %d ranks x B=%d x T=%d needs %zu; use a larger shard or smaller -b/-t",
              path, d->shard_tokens, d->world, d->B, d->T, needed);
    }
    d->shard_index = index;
    d->window_index = 0;
}

static inline void dataloader_init(DataLoader* d, const char* pattern, int B, int T, int rank, int world,
                                   int vocab_size) {
    memset(d, 0, sizeof(*d));
    d->B = B;
    d->T = T;
    d->rank = rank;
    d->world = world;
    d->vocab_size = vocab_size;
    int rc = glob(pattern, 0, NULL, &d->files);
    if (rc != 0 || d->files.gl_pathc == 0) {
        fatal("no token shard matches '%s' (run `make data` to prepare tinyshakespeare, or pass -i/-j)", pattern);
    }
    d->num_shards = d->files.gl_pathc;
    d->window = (uint16_t*)mallocCheck(((size_t)B * T + 1) * sizeof(uint16_t));
    d->inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    d->targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    dataloader_open_shard(d, 0);
}

// Number of whole steps (of all ranks together) one pass over the current shard gives.
static inline size_t dataloader_windows_per_shard(const DataLoader* d) {
    return (d->shard_tokens - 1) / ((size_t)d->world * d->B * d->T);
}

static inline void dataloader_next_batch(DataLoader* d) {
    if (d->window_index >= dataloader_windows_per_shard(d)) {
        dataloader_open_shard(d, (d->shard_index + 1) % d->num_shards);
    }
    size_t BT = (size_t)d->B * d->T;
    size_t start = (d->window_index * d->world + d->rank) * BT;
    fseekCheck(d->file, (long)(SHARD_HEADER_INTS * sizeof(int) + start * sizeof(uint16_t)), SEEK_SET, "token shard");
    freadCheck(d->window, sizeof(uint16_t), BT + 1, d->file, d->files.gl_pathv[d->shard_index]);
    for (size_t i = 0; i < BT; i++) {
        d->inputs[i] = d->window[i];
        d->targets[i] = d->window[i + 1];
    }
    d->window_index++;
}

static inline void dataloader_reset(DataLoader* d) {
    if (d->shard_index != 0) dataloader_open_shard(d, 0);
    d->window_index = 0;
}

// The position to save in a checkpoint: the shard, and how many of its tokens the steps so
// far consumed (all ranks together). In tokens rather than windows, so that a run resumed
// with another number of ranks or batch size continues at the same place.
static inline void dataloader_position(const DataLoader* d, size_t* shard, size_t* tokens_done) {
    *shard = d->shard_index;
    *tokens_done = d->window_index * (size_t)d->world * d->B * d->T;
}

static inline void dataloader_seek(DataLoader* d, size_t shard, size_t tokens_done) {
    size_t per_window = (size_t)d->world * d->B * d->T;
    if (shard >= d->num_shards) fatal("data position names shard %zu but only %zu match", shard, d->num_shards);
    if (shard != d->shard_index) dataloader_open_shard(d, shard);
    // A saved position is always inside its shard; beyond it, the data changed since.
    if (tokens_done >= d->shard_tokens) {
        fatal("data position: token %zu of shard %zu (%s), which has only %zu tokens: not the data of the saved run",
              tokens_done, shard, d->files.gl_pathv[shard], d->shard_tokens);
    }
    if (tokens_done % per_window != 0) {
        fatal("cannot resume at token %zu of shard %zu with ranks*B*T = %zu tokens per micro-step: "
              "choose -b/-t/ranks so that it divides", tokens_done, shard, per_window);
    }
    d->window_index = tokens_done / per_window;
}

static inline void dataloader_free(DataLoader* d) {
    if (d->file) fclose(d->file);
    globfree(&d->files);
    free(d->window);
    free(d->inputs);
    free(d->targets);
    memset(d, 0, sizeof(*d));
}

#ifdef __cplusplus
}
#endif
#endif
