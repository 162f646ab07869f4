/*
 * zero1/device_cuda.h: the device table of zero1/device_ops.h for GPU memory (CUDA).
 *
 * Memory is cudaMalloc'd (not host-addressable), streams are non-blocking CUDA streams,
 * events carry ordering only (no timing), and every op is queued on the stream it is
 * given. The arithmetic gives zero1/device_cpu.c's results: bit for bit for convert,
 * adamw and nonfinite_flags (zero1/device_cuda.cu is compiled without fast math and
 * without fused multiply-adds for that); sum_squares is deterministic (same bits run to
 * run and on any GPU) but sums in another order than the CPU. --dp-invariant's ops (add,
 * sum_slices_pairwise, the exact sum of squares and its norm) give the CPU's bits too.
 *
 * One context per device (the caller selects the GPU with cudaSetDevice first). The
 * compute stream is borrowed: the caller creates it and destroys it after the device.
 *
 * Span lists (upload_spans) carry their own scratch for sum_squares, so two lists may
 * be summed on two streams at once; one list may not be summed on two streams at once.
 */
#ifndef ZERO1_DEVICE_CUDA_H
#define ZERO1_DEVICE_CUDA_H

#include <cuda_runtime.h>

#include "zero1/device_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const Zero1DeviceOps zero1_device_cuda_ops;

// The CUDA device on the current GPU, with compute as its compute stream.
Zero1Device zero1_device_cuda_create(cudaStream_t compute);
// Frees the context (not the compute stream, not memory the caller allocated).
void zero1_device_cuda_destroy(Zero1Device* dev);

// cudaEventQuery, with "not ready" kept out of cudaGetLastError (launch checks read it):
// cudaSuccess (complete), cudaErrorNotReady, or the error.
cudaError_t zero1_cuda_event_status(cudaEvent_t e);

#ifdef __cplusplus
}
#endif
#endif
