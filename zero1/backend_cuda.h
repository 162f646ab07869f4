/*
 * zero1/backend_cuda.h: the GPU trainer's backend for zero1/ (see zero1/optimizer.h):
 * the CUDA device on the trainer's compute stream, and a communicator for it: NCCL when
 * every rank has a GPU of its own, MPI staged through page-locked host memory when ranks
 * share a GPU (NCCL refuses that; tests run 2-4 ranks on one GPU), as --comm chooses.
 */
#ifndef ZERO1_BACKEND_CUDA_H
#define ZERO1_BACKEND_CUDA_H

#include <cuda_runtime.h>

#include "run/config.h"
#include "zero1/optimizer.h"

Zero1Backend* zero1_backend_cuda(const TrainConfig* cfg, cudaStream_t compute, int local_rank, int local_world);

#endif
