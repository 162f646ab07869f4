/*
 * Which kernels the GPU model runs (llmc/gpt2_cuda.cuh), chosen on the command line:
 *   --attention flash|naive|cudnn  flash: our own tiled kernels, no (B,NH,T,T) buffers;
 *                                  naive: scores materialised, the reference path;
 *                                  cudnn: cuDNN's fused attention (USE_CUDNN=1 builds only)
 *   -r 0|1                         1: recompute GELU in the backward instead of keeping its
 *                                  output per layer (one B*T*4C buffer instead of L)
 *   --fused-kernels 0|1            0: the unfused reference kernels, each a pass of its own
 * Plain C: the memory estimate (run/memory_check.h) and the cost model read it too.
 */
#ifndef LLMC_GPT2_KERNELS_H
#define LLMC_GPT2_KERNELS_H

#include <string.h>

#include "run/config.h"
#include "llmc/utils.h"

typedef enum { ATTENTION_FLASH = 0, ATTENTION_NAIVE = 1, ATTENTION_CUDNN = 2 } AttentionKind;

typedef struct {
    int attention;       // AttentionKind
    int recompute_gelu;  // -r
    int fused;           // --fused-kernels
} GPT2Kernels;

static inline const char* attention_kind_name(int kind) {
    return kind == ATTENTION_FLASH ? "flash" : kind == ATTENTION_NAIVE ? "naive" : "cudnn";
}

// Fills k from the options; an unknown attention kind, or cudnn in a build without it, is
// one error.
static inline void gpt2_kernels_from_config(const TrainConfig* cfg, GPT2Kernels* k) {
    memset(k, 0, sizeof(*k));
    const char* a = cfg->attention ? cfg->attention : "flash";
    if (strcmp(a, "flash") == 0) k->attention = ATTENTION_FLASH;
    else if (strcmp(a, "naive") == 0) k->attention = ATTENTION_NAIVE;
    else if (strcmp(a, "cudnn") == 0) k->attention = ATTENTION_CUDNN;
    else fatal("--attention %s: expected flash, naive or cudnn", a);
#if defined(ENABLE_FP32)
    if (k->attention == ATTENTION_CUDNN)
        fatal("--attention cudnn: cuDNN's attention has no fp32 path; build PRECISION=BF16 USE_CUDNN=1");
#elif !defined(USE_CUDNN)
    if (k->attention == ATTENTION_CUDNN) fatal("--attention cudnn needs a build with cuDNN: make train_gpt2cu USE_CUDNN=1");
#endif
    k->recompute_gelu = cfg->recompute;
    k->fused = cfg->fused_kernels;
}

// The memory check's count for cuDNN's SDPA workspace (llmc/cudnn_attention.cpp): an fp32
// dq accumulator (B,T,C) and an fp32 row sum (B,NH,T) for the deterministic backward.
// An estimate until a GPU run prints the real size (the trainer warns when it is more).
static inline double gpt2_cudnn_workspace_estimate(double B, double T, double C, double NH) {
    return 4 * B * T * C + 4 * B * NH * T;
}

#endif
