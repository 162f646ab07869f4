/*
 * cuda_cpu/kernel_attributes.h: each kernel's launch resources as nvcc would record them
 * (kernel_attributes.cpp): its __launch_bounds__ and static __shared__ memory, registered
 * before main (rewrite.py, cuda_cpu.h: KernelBounds, KernelStaticShared), and the dynamic
 * shared memory it was opted in to (cudaFuncSetAttribute). kernel.cpp checks every launch
 * and every block against them.
 */
#ifndef CUDA_CPU_KERNEL_ATTRIBUTES_H
#define CUDA_CPU_KERNEL_ATTRIBUTES_H

#include <cstddef>
#include <cstdint>

#include "cuda_cpu.h"

namespace cudacpu {

struct KernelAttributes;
// func's attributes, or NULL where func is no kernel the layer compiled.
KernelAttributes* kernel_attributes(const void* func);
// A launch of `threads` threads and `dynamic` bytes of dynamic shared memory: cudaSuccess, or
// the error an H100's launch returns (with a diag naming the kernel and the limit).
cudaError_t launch_resources(const LaunchSite& site, KernelAttributes* k, uint64_t threads, size_t dynamic);
// A block's static __shared__ memory as it ran (__device__ functions' included, which only
// running shows): false, with the fault's message in why, where the GPU would not have
// built or launched the kernel with it.
bool block_shared_fits(KernelAttributes* k, size_t static_bytes, size_t dynamic, char* why, size_t n);

}  // namespace cudacpu

#endif
