/*
 * Which kernels the GPU model runs (llmc/gpt2_cuda.cuh), as the command line chooses them
 * (run/config.h's config_gpt2_kernels):
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


typedef enum { ATTENTION_FLASH = 0, ATTENTION_NAIVE = 1, ATTENTION_CUDNN = 2 } AttentionKind;

typedef struct {
    int attention;       // AttentionKind
    int recompute_gelu;  // -r
    int fused;           // --fused-kernels
} GPT2Kernels;

static inline const char* attention_kind_name(int kind) {
    return kind == ATTENTION_FLASH ? "flash" : kind == ATTENTION_NAIVE ? "naive" : "cudnn";
}

// The memory check's count for cuDNN's SDPA workspace (llmc/cudnn_attention.cpp): an fp32
// dq accumulator (B,T,C) and an fp32 row sum (B,NH,T) for the deterministic backward.
// An estimate until a GPU run prints the real size (the trainer warns when it is more).
static inline double gpt2_cudnn_workspace_estimate(double B, double T, double C, double NH) {
    return 4 * B * T * C + 4 * B * NH * T;
}

#endif
