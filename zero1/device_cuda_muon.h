/*
 * zero1/device_cuda_muon.h: the CUDA device's muon op (zero1/device_ops.h), llmc/muon.cuh's
 * kernels and batched GEMMs over the whole matrices of a span list. The device keeps one
 * Zero1CudaMuon per context: a cuBLASLt handle of its own and a plan per span list.
 */
#ifndef ZERO1_DEVICE_CUDA_MUON_H
#define ZERO1_DEVICE_CUDA_MUON_H

#include <cuda_runtime.h>

#include "zero1/device_ops.h"

typedef struct Zero1CudaMuon Zero1CudaMuon;

// The muon op's contract, on stream s; *state is created on first use.
void zero1_cuda_muon(Zero1CudaMuon** state, cudaStream_t s, const Zero1SpanList* spans, const Zero1MatrixShape* shapes,
                     float* params, float* master, const float* grads, float* momentum, const Zero1MuonStep* step,
                     const float* grad_scale);
// Frees state (NULL: nothing); the device's streams must be idle.
void zero1_cuda_muon_free(Zero1CudaMuon* state);

#endif
