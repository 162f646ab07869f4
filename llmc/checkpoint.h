/*
 * Checkpoints: one directory per step, DIR/checkpoint_00000123/, holding
 *   model.bin      the fp32 master weights as an llm.c model file (version 3), so a
 *                  checkpoint is also a model any llm.c tool can load;
 *   optimizer.bin  AdamW m and v for every parameter, in the model file's tensor order;
 *   state.txt      step, data position, sampling RNG, and the run's shape (for messages).
 * Everything is in model-space order, independent of DP, buckets and layout, so a run
 * saved on 4 ranks resumes on 2 or 3. The directory is written under a temporary name
 * and renamed when complete: a crash mid-write never leaves a checkpoint that looks whole.
 */
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/stat.h>

#include "llmc/gpt2_spec.h"
#include "llmc/logger.h"
#include "llmc/model_file.h"
#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OPTIMIZER_MAGIC 20241129
#define OPTIMIZER_VERSION 1

typedef struct {
    int step;                   // optimizer steps completed
    size_t shard;               // train data position: shard index ...
    size_t shard_tokens_done;   // ... and tokens of it consumed (a multiple of ranks*B*T)
    uint64_t sample_rng;
    int world, B, T, grad_accum_steps;  // the run that saved it
} CheckpointState;

static inline void checkpoint_path(char* out, size_t n, const char* dir, int step, int temporary) {
    if (temporary) path_format(out, n, "%s/.checkpoint_%08d.tmp", dir, step);
    else path_format(out, n, "%s/checkpoint_%08d", dir, step);
}

// Removes a directory's files and the directory (a stale temporary checkpoint).
static inline void remove_flat_dir(const char* dir) {
    DIR* d = opendir(dir);
    if (!d) return;
    struct dirent* e;
    char path[PATH_MAX_LEN];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        path_format(path, sizeof(path), "%s/%s", dir, e->d_name);
        remove(path);
    }
    closedir(d);
    rmdir(dir);
}

static inline void checkpoint_write_optimizer(const char* path, const GPT2Config* cfg, const float* dense_m,
                                              const float* dense_v, int step) {
    size_t n = gpt2_num_parameters(cfg);
    int header[MODEL_HEADER_INTS] = {0};
    header[0] = OPTIMIZER_MAGIC;
    header[1] = OPTIMIZER_VERSION;
    header[2] = step;
    FILE* f = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int), MODEL_HEADER_INTS, f, path);
    float* file_order = (float*)mallocCheck(n * sizeof(float));
    gpt2_dense_reorder(cfg, file_order, dense_m, 1);
    fwriteCheck(file_order, sizeof(float), n, f, path);
    gpt2_dense_reorder(cfg, file_order, dense_v, 1);
    fwriteCheck(file_order, sizeof(float), n, f, path);
    free(file_order);
    fcloseCheck(f, path);
}

static inline void checkpoint_read_optimizer(const char* path, const GPT2Config* cfg, float* dense_m, float* dense_v,
                                             int step) {
    size_t n = gpt2_num_parameters(cfg);
    FILE* f = fopenCheck(path, "rb");
    long size = file_size_of(f, path);
    int header[MODEL_HEADER_INTS];
    if ((size_t)size != sizeof(header) + 2 * n * sizeof(float)) {
        fatal("%s: %ld bytes, expected %zu for this model (truncated or corrupt)", path, size,
              sizeof(header) + 2 * n * sizeof(float));
    }
    freadCheck(header, sizeof(int), MODEL_HEADER_INTS, f, path);
    if (header[0] != OPTIMIZER_MAGIC || header[1] != OPTIMIZER_VERSION) fatal("%s: not an optimizer state file", path);
    if (header[2] != step) fatal("%s: saved at step %d, but its checkpoint says step %d", path, header[2], step);
    float* file_order = (float*)mallocCheck(n * sizeof(float));
    freadCheck(file_order, sizeof(float), n, f, path);
    gpt2_dense_reorder(cfg, dense_m, file_order, 0);
    freadCheck(file_order, sizeof(float), n, f, path);
    gpt2_dense_reorder(cfg, dense_v, file_order, 0);
    free(file_order);
    fcloseCheck(f, path);
}

static inline void checkpoint_write_state(const char* path, const CheckpointState* s) {
    FILE* f = fopenCheck(path, "w");
    fprintf(f, "step %d\nshard %zu\nshard_tokens_done %zu\nsample_rng %" PRIu64 "\nranks %d\nB %d\nT %d\n"
               "grad_accum_steps %d\n",
            s->step, s->shard, s->shard_tokens_done, s->sample_rng, s->world, s->B, s->T, s->grad_accum_steps);
    fcloseCheck(f, path);
}

static inline void checkpoint_read_state(const char* path, CheckpointState* s) {
    FILE* f = fopenCheck(path, "r");
    int n = fscanf(f, "step %d\nshard %zu\nshard_tokens_done %zu\nsample_rng %" SCNu64 "\nranks %d\nB %d\nT %d\n"
                      "grad_accum_steps %d\n",
                   &s->step, &s->shard, &s->shard_tokens_done, &s->sample_rng, &s->world, &s->B, &s->T,
                   &s->grad_accum_steps);
    fclose(f);
    if (n != 8) fatal("%s: malformed checkpoint state (read %d of 8 fields)", path, n);
}

// The newest complete checkpoint in dir: returns its step and writes its path, or -1.
static inline int checkpoint_find_latest(const char* dir, char* path, size_t n) {
    DIR* d = opendir(dir);
    if (!d) return -1;
    int best = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int step;
        char tail;
        if (sscanf(e->d_name, "checkpoint_%d%c", &step, &tail) == 1 && step > best) best = step;
    }
    closedir(d);
    if (best >= 0) checkpoint_path(path, n, dir, best, 0);
    return best;
}

// Writes a checkpoint (rank 0 only): master weights, m, v (dense canonical), state.
static inline void checkpoint_save(const char* dir, const GPT2Config* cfg, const float* dense_master,
                                   const float* dense_m, const float* dense_v, const CheckpointState* s) {
    char tmp[PATH_MAX_LEN], final_path[PATH_MAX_LEN], file[PATH_MAX_LEN];
    make_dir_or_die(dir);
    checkpoint_path(tmp, sizeof(tmp), dir, s->step, 1);
    checkpoint_path(final_path, sizeof(final_path), dir, s->step, 0);
    remove_flat_dir(tmp);
    if (mkdir(tmp, 0755) != 0) fatal("cannot create %s: %s", tmp, strerror(errno));
    path_format(file, sizeof(file), "%s/model.bin", tmp);
    gpt2_model_file_write(file, cfg, dense_master, MODEL_VERSION_FP32);
    path_format(file, sizeof(file), "%s/optimizer.bin", tmp);
    checkpoint_write_optimizer(file, cfg, dense_m, dense_v, s->step);
    path_format(file, sizeof(file), "%s/state.txt", tmp);
    checkpoint_write_state(file, s);
    remove_flat_dir(final_path);  // a checkpoint of the same step from an earlier run
    if (rename(tmp, final_path) != 0) fatal("cannot rename %s to %s: %s", tmp, final_path, strerror(errno));
}

#ifdef __cplusplus
}
#endif
#endif
