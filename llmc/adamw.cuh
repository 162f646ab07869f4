/*
 * AdamW on the GPU: fp32 master weights, m, v; the updated master is rounded once into
 * the floatX param buffer (bf16: llmc/adamw.h's adamw_round_bf16, round-to-nearest-even
 * or --stochastic-rounding, with each element's model-space index). The per-element arithmetic is
 * adamw_element() from llmc/adamw.h, the very function the CPU trainer and zero1/ use, compiled
 * with the trainer's flags (contraction, BF16's fast math): the same formula, not the same bits
 * on a GPU (llmc/adamw.h).
 * The clip factor is read from device memory (written by global_norm), so the update
 * is queued without the host waiting for the norm. One launch updates every tensor of the
 * model (AdamWTensors: a table of runs with their weight decay, made once).
 */
#ifndef LLMC_ADAMW_CUH
#define LLMC_ADAMW_CUH

#include "llmc/adamw.h"
#include "llmc/cuda_common.cuh"

// The write-back of a master value into a param; element: its model-space index.
__device__ __forceinline__ void store_rounded(float* p, float x, const AdamWStep& s, size_t element) { *p = x; }
__device__ __forceinline__ void store_rounded(__nv_bfloat16* p, float x, const AdamWStep& s, size_t element) {
    *(bf16_bits*)p = adamw_round_bf16(x, &s, element);
}

// The tensors of one update, as one launch takes them: runs of consecutive elements
// [starts[k], starts[k+1]) of the dense buffers, each with its weight decay (neighbours
// that agree are merged), in one device allocation made once; element i's model-space
// index is model + i. A decay of ADAMW_NOT_MINE marks a tensor another optimizer updates
// (--optimizer muon's matrices: llmc/muon.cuh), which the launch leaves alone.
typedef struct {
    int count;          // runs
    size_t numel;       // starts[count]
    size_t model;
    size_t* d_starts;   // count + 1, then the ints
    int* d_decays;      // count
} AdamWTensors;
#define ADAMW_NOT_MINE (-1)

// n tensors of sizes[i] elements, one after another from model-space index model.
static void adamw_tensors_init(AdamWTensors* t, const size_t* sizes, const int* decays, int n, size_t model) {
    size_t* starts = (size_t*)mallocCheck(((size_t)n + 1) * sizeof(size_t));
    int* runs = (int*)mallocCheck(((size_t)n + 1) * sizeof(int));
    int count = 0;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (sizes[i] == 0) continue;
        int run = decays[i] == ADAMW_NOT_MINE ? ADAMW_NOT_MINE : decays[i] != 0;
        if (count == 0 || runs[count - 1] != run) {
            starts[count] = at;
            runs[count++] = run;
        }
        at += sizes[i];
    }
    starts[count] = at;
    t->count = count, t->numel = at, t->model = model;
    size_t bytes = ((size_t)count + 1) * sizeof(size_t) + (size_t)count * sizeof(int);
    t->d_starts = (size_t*)cudaMallocCheck(bytes);
    t->d_decays = (int*)(t->d_starts + count + 1);
    cudaCheck(cudaMemcpy(t->d_starts, starts, ((size_t)count + 1) * sizeof(size_t), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(t->d_decays, runs, (size_t)count * sizeof(int), cudaMemcpyHostToDevice));
    free(starts);
    free(runs);
}
static void adamw_tensors_free(AdamWTensors* t) { cudaCheck(cudaFree(t->d_starts)); }

#define ADAMW_THREADS 256
#define ADAMW_CHUNK (ADAMW_THREADS * 8)  // elements per block
// Block b updates elements [b CHUNK, (b+1) CHUNK): thread 0 finds the run of the first by
// a binary search of the starts, then each thread walks on through the runs as its
// elements go up (reads and writes of consecutive threads are consecutive).
static __global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(floatX* params, float* master, const float* grads, float* m, float* v, size_t numel, size_t model,
                 const size_t* starts, const int* decays, int count, AdamWStep s, const float* grad_scale) {
    __shared__ int first_run;
    const size_t begin = (size_t)blockIdx.x * ADAMW_CHUNK, end = numel - begin < ADAMW_CHUNK ? numel : begin + ADAMW_CHUNK;
    if (threadIdx.x == 0) {
        int lo = 0, hi = count - 1;  // the largest k with starts[k] <= begin
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (starts[mid] <= begin) lo = mid;
            else hi = mid - 1;
        }
        first_run = lo;
    }
    __syncthreads();
    s.grad_scale = grad_scale[0];
    int k = first_run;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        while (i >= starts[k + 1]) k++;
        if (decays[k] == ADAMW_NOT_MINE) continue;
        float p = adamw_element(master[i], grads[i], &m[i], &v[i], &s, decays[k]);
        master[i] = p;
        store_rounded(&params[i], p, s, model + i);
    }
}

// Every tensor of t in one launch.
static void adamw_update(floatX* params, float* master, const float* grads, float* m, float* v, const AdamWTensors* t,
                         const AdamWStep* s, const float* grad_scale, cudaStream_t stream) {
    if (t->numel == 0) return;
    adamw_kernel<<<(unsigned)CEIL_DIV(t->numel, (size_t)ADAMW_CHUNK), ADAMW_THREADS, 0, stream>>>(
        params, master, grads, m, v, t->numel, t->model, t->d_starts, t->d_decays, t->count, *s, grad_scale);
    cudaCheckLaunch();
}

// params = the master as step s's write-back rounds it (params and master dense canonical,
// from model-space index 0): after loading weights (a step-0 AdamWStep rounds to nearest)
// or a resume (the checkpoint's step).
static __global__ void copy_master_to_params_kernel(floatX* params, const float* master, size_t n, AdamWStep s) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store_rounded(&params[i], master[i], s, i);
}

static void copy_master_to_params(floatX* params, const float* master, size_t n, const AdamWStep* s,
                                  cudaStream_t stream) {
    copy_master_to_params_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(params, master, n, *s);
    cudaCheckLaunch();
}

#endif
