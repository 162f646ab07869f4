/*
 * cuda_cpu/kernel_attributes.cpp: kernels' launch resources as an H100/H200 (sm_90) has
 * them, and cudaFuncGetAttributes / cudaFuncSetAttribute.
 *
 * nvcc records with each kernel its __launch_bounds__ (PTX .maxntid) and its static shared
 * memory; the driver refuses, at launch, a block of more threads than the kernel's
 * maxThreadsPerBlock (cudaErrorLaunchOutOfResources, "too many resources requested for
 * launch": the bounds are a promise the compiler allocated registers by) and dynamic shared
 * memory above its maxDynamicSharedSizeBytes: 48 KiB less its static shared memory, or what
 * cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) opted it in to, which
 * may not take static + dynamic past the 227 KiB of cudaDevAttrMaxSharedMemoryPerBlockOptin
 * (cudaErrorInvalidValue both; CUDA Runtime API, cudaFuncSetAttribute and cudaFuncAttributes).
 * Here rewrite.py registers each kernel's bounds and the static __shared__ variables of its
 * own body before main; those of the __device__ functions it calls are learned as its
 * blocks declare them (block_shared_fits), so only from its first block on. The layer has no
 * register allocation: numRegs is 0, and maxThreadsPerBlock only the bounds (or 1024).
 */
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "kernel_attributes.h"  // first: cuda_cpu.h precedes the toolkit's headers
#include "internal.h"

namespace cudacpu {

static const size_t kDefaultSharedLimit = 48 << 10;  // static + dynamic without the opt-in; nvcc's static limit
static const size_t kSharedOptinLimit = 232448;     // 227 KiB: cudaDevAttrMaxSharedMemoryPerBlockOptin of sm_90
static const int kMaxThreadsPerBlock = 1024;

struct KernelAttributes {
    int max_threads = 0, min_blocks = 0;    // __launch_bounds__ (0: none)
    std::unordered_set<unsigned> declared;  // the body's static __shared__ declarations counted
    size_t body_shared = 0;                 // their bytes
    std::atomic<size_t> ran_shared{0};      // the most static __shared__ a block of it declared running
    std::atomic<int> max_dynamic{-1};       // the opt-in (cudaFuncAttributeMaxDynamicSharedMemorySize); -1: none
    int carveout = -1;                      // cudaFuncAttributePreferredSharedMemoryCarveout (a hint)
};

static std::mutex mu;  // constant-initialized: usable by the registrations before main
static std::unordered_map<const void*, KernelAttributes*>& kernels() {
    static auto* m = new std::unordered_map<const void*, KernelAttributes*>();
    return *m;
}
static KernelAttributes* registered(const void* func) {  // with mu held
    KernelAttributes*& k = kernels()[func];
    if (!k) k = new KernelAttributes();
    return k;
}

bool kernel_bounds(const void* func, int max_threads, int min_blocks) {
    std::lock_guard<std::mutex> g(mu);
    KernelAttributes* k = registered(func);
    k->max_threads = max_threads;
    k->min_blocks = min_blocks;
    return true;
}

bool kernel_static_shared(const void* func, unsigned id, size_t bytes) {
    std::lock_guard<std::mutex> g(mu);
    KernelAttributes* k = registered(func);
    if (k->declared.insert(id).second) k->body_shared += bytes;
    return true;
}

KernelAttributes* kernel_attributes(const void* func) {
    std::lock_guard<std::mutex> g(mu);
    auto it = kernels().find(func);
    return it == kernels().end() ? nullptr : it->second;
}

static size_t static_shared(const KernelAttributes* k) { return std::max(k->body_shared, k->ran_shared.load()); }

// maxDynamicSharedSizeBytes: the opt-in, else what the static memory leaves of 48 KiB.
static size_t dynamic_limit(const KernelAttributes* k, size_t static_bytes) {
    if (k->max_dynamic >= 0) return (size_t)k->max_dynamic;
    return static_bytes < kDefaultSharedLimit ? kDefaultSharedLimit - static_bytes : 0;
}

// Why static + dynamic shared memory does not fit (NULL when it does) into why.
static const char* shared_misfit(const KernelAttributes* k, size_t static_bytes, size_t dynamic, char* why, size_t n) {
    if (static_bytes > kDefaultSharedLimit) {
        snprintf(why, n, "static __shared__ memory of %zu bytes exceeds the 48 KiB a kernel may declare (nvcc refuses it)",
                 static_bytes);
    } else if (k->max_dynamic >= 0 && static_bytes + k->max_dynamic > kSharedOptinLimit) {
        snprintf(why, n, "%zu bytes of static __shared__ memory and the %d of dynamic it was opted in to exceed the "
                 "227 KiB of a block (cudaFuncSetAttribute returns cudaErrorInvalidValue)", static_bytes,
                 k->max_dynamic.load());
    } else if (dynamic > dynamic_limit(k, static_bytes)) {
        snprintf(why, n, "%zu bytes of static and %zu of dynamic shared memory exceed the %s (the launch returns "
                 "cudaErrorInvalidValue)", static_bytes, dynamic,
                 k->max_dynamic >= 0 ? "dynamic size opted in to with cudaFuncSetAttribute"
                                     : "48 KiB a block has without cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)");
    } else {
        return nullptr;
    }
    return why;
}

cudaError_t launch_resources(const LaunchSite& site, KernelAttributes* k, uint64_t threads, size_t dynamic) {
    if (!k) {
        diag("kernel %s (%s:%d): not a kernel the layer registered (cuda_cpu/rewrite.py registers the __global__ "
             "functions of .cu and .cuh files: define it in one)", site.kernel, site.file, site.line);
        return cudaErrorInvalidDeviceFunction;
    }
    if (k->max_threads > 0 && threads > (uint64_t)k->max_threads) {
        diag("kernel %s (%s:%d): a block of %llu threads, over its __launch_bounds__ of %d (too many resources "
             "requested for launch)", site.kernel, site.file, site.line, (unsigned long long)threads, k->max_threads);
        return cudaErrorLaunchOutOfResources;
    }
    char why[320];
    size_t static_bytes = static_shared(k);
    // Static memory over 48 KiB stands for nvcc's refusal to build it: its blocks fault.
    if (static_bytes <= kDefaultSharedLimit && shared_misfit(k, static_bytes, dynamic, why, sizeof(why))) {
        diag("kernel %s (%s:%d): %s", site.kernel, site.file, site.line, why);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

bool block_shared_fits(KernelAttributes* k, size_t static_bytes, size_t dynamic, char* why, size_t n) {
    size_t seen = k->ran_shared.load();
    while (static_bytes > seen && !k->ran_shared.compare_exchange_weak(seen, static_bytes)) {
    }
    return shared_misfit(k, std::max(static_bytes, k->body_shared), dynamic, why, n) == nullptr;
}

}  // namespace cudacpu

using namespace cudacpu;

extern "C" cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
    if (!attr) return result(cudaErrorInvalidValue);
    KernelAttributes* k = kernel_attributes(func);
    if (!k) return result(cudaErrorInvalidDeviceFunction);
    std::lock_guard<std::mutex> g(mu);
    memset(attr, 0, sizeof(*attr));  // constant and local memory, cache mode, clusters: none
    attr->sharedSizeBytes = static_shared(k);
    attr->maxThreadsPerBlock = k->max_threads > 0 ? k->max_threads : kMaxThreadsPerBlock;
    attr->numRegs = 0;  // no register allocation here (docs/cuda_cpu.md)
    attr->ptxVersion = attr->binaryVersion = 90;  // sm_90, the project's build
    attr->maxDynamicSharedSizeBytes = (int)dynamic_limit(k, static_shared(k));
    attr->preferredShmemCarveout = k->carveout;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
    KernelAttributes* k = kernel_attributes(func);
    if (!k) {
        diag("cudaFuncSetAttribute: %p is not a kernel", func);
        return result(cudaErrorInvalidDeviceFunction);
    }
    std::lock_guard<std::mutex> g(mu);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        size_t static_bytes = static_shared(k);
        if (value < 0 || static_bytes + value > kSharedOptinLimit) {
            diag("cudaFuncSetAttribute: %d bytes of dynamic shared memory with %zu of static exceed the %zu a block "
                 "may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)", value, static_bytes, kSharedOptinLimit);
            return result(cudaErrorInvalidValue);
        }
        k->max_dynamic = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) {
        if (value < -1 || value > 100) return result(cudaErrorInvalidValue);  // a percentage, or -1 (the default)
        k->carveout = value;
        return cudaSuccess;
    }
    return result(cudaErrorInvalidValue);
}
