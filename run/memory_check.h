/*
 * Memory is checked before it is allocated: a job that cannot fit stops at start-up with
 * one error line that names what it needs, what it can have and what dominates, instead
 * of being killed by the kernel minutes later without a word.
 *
 * The need, per rank, comes from the sizes the trainers allocate (each term below names
 * the allocation it mirrors). What a rank can have:
 *   host  the smaller of /proc/meminfo's MemAvailable and the cgroup's headroom (limit
 *         minus usage, at every level of its hierarchy, v2 or v1). Ranks on one node share
 *         it, so the node's ranks' needs add up;
 *   GPU   cudaMemGetInfo's free bytes, which ranks sharing one GPU split. They are read once
 *         every rank has its context and libraries (the CUDA context, cuBLAS's workspace,
 *         the cuBLASLt workspace: the trainer waits for all ranks first), so those are
 *         counted there; what comes after the check is counted here (NCCL's buffers too).
 * One all-gather (under --comm-timeout, run/mpi_wait.h) brings every rank's row (its
 * node's name, its GPU, what is free there); every rank then reaches the same verdict
 * from the same rows, each node judged on its own numbers, so a job that cannot fit ends
 * on every rank with the same fatal() and the user sees it once (rank 0 speaks). Nodes are
 * told apart by MPI_Get_processor_name rather than MPI_Comm_split_type, which blocks with
 * no deadline and would not name the node in the message.
 * Rank 0 prints the estimate as one `memory:` line per kind of memory.
 *
 * Test hooks: LLMC_MEMORY_LIMIT_MIB=N replaces the detected host limit with N MiB, so the
 * refusal can be tested on any machine; LLMC_MEMORY_REPORT=1 makes every rank print at
 * exit its peak RSS (VmHWM) and how far it rose above what the rank held at the check,
 * the number the estimate is a prediction of.
 */
#ifndef RUN_MEMORY_CHECK_H
#define RUN_MEMORY_CHECK_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/config.h"
#include "llmc/gpt2_kernels.h"
#include "llmc/gpt2_spec.h"
#include "run/mpi_wait.h"
#include "run/optimizer.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MEMORY_LIMIT_ENV "LLMC_MEMORY_LIMIT_MIB"
#define MEMORY_REPORT_ENV "LLMC_MEMORY_REPORT"
#define MEMORY_MIB (1024.0 * 1024.0)
#define MEMORY_GIB (1024.0 * MEMORY_MIB)

// ---------------------------------------------------------------------------- the need

#define MEMORY_MAX_TERMS 16
typedef struct {
    const char* name;
    double bytes;
} MemoryTerm;

typedef struct {
    MemoryTerm term[MEMORY_MAX_TERMS];
    int count;
} MemoryNeed;

// The optimizer's buffers: elements of the param and grad buffers (padding included), those
// whose AdamW state this rank keeps, and the bytes of the ZeRO-1 exchange temporaries
// (fp32 accumulation's receive slots, the split embedding's rows, the DP-invariant mode's
// partial grads and receive slots).
// second_moment: the owned elements that also have AdamW's v (with --optimizer muon, not the
// matrices, whose Muon momentum is their only state besides the master).
// communicators: those of two ranks or more that the rank joins (NCCL's buffers on a GPU).
typedef struct {
    double numel, owned, temporaries, second_moment;
    int communicators;
} MemoryBuffers;

// The zero1/ plugin's sizes (zero1/gpt2.h's zero1_gpt2_memory_buffers, from its own layout
// and ledger), passed in by the trainers built with it: llmc/ restates none of its rules.
typedef MemoryBuffers (*MemoryZero1Sizes)(const TrainConfig* cfg, const GPT2Config* mc, int world);

// ---------------------------------------------------------------------------- the limit

typedef struct {
    double bytes;          // what the node's ranks may take together
    double mem_available;  // MemAvailable, -1 unknown
    double cgroup_limit;   // the tightest cgroup limit, -1 none
    double cgroup_room;    // its headroom
    int overridden;        // LLMC_MEMORY_LIMIT_MIB set it
    double as_limit;       // ulimit -v (RLIMIT_AS) in bytes, -1 none: a limit per rank, not per node
    double as_room;        // what a rank's estimate may reach under it: the limit less the address
                           // space mapped but not resident at the check (libraries, stacks, MPI)
} MemoryLimit;

// ---------------------------------------------------------------------------- the verdict

// One rank's view, gathered from every rank.
typedef struct {
    char node[MPI_MAX_PROCESSOR_NAME];  // MPI_Get_processor_name
    uint64_t gpu;          // the GPU's identity (a hash of its UUID); 0: the CPU trainer
    double gpu_free;       // cudaMemGetInfo's free bytes
    MemoryLimit host;
} MemoryRow;

void memory_kernel_choices(const TrainConfig* cfg, const GPT2Config* mc, const GPT2Kernels* k, int x,
                           char* buf, size_t n);

// ---------------------------------------------------------------------------- the report (tests)

// ---------------------------------------------------------------------------- the checks

// The CPU trainer, before its first big allocation. zero1_sizes: the optimizer is zero1/'s
// (NULL: the trainer's own).
void memory_check_cpu(const TrainConfig* cfg, const GPT2Config* mc, int world,
                      MemoryZero1Sizes zero1_sizes);

// This rank's GPU, as the GPU trainer finds it before allocating.
typedef struct {
    uint64_t id;          // a digest of its UUID: ranks with the same id share the GPU
    double free_bytes;    // what cudaMemGetInfo reports free on it
    // 1 on the CPU execution layer (__CUDA_CPU__): device memory is this process's host
    // memory (its count is the GPU's, shared by the ranks that share it, as on a GPU).
    int is_host_memory;
} MemoryGpu;

// The GPU trainer, before its first big allocation; x = sizeof(floatX).
void memory_check_gpu(const TrainConfig* cfg, const GPT2Config* mc, const GPT2Kernels* kernels,
                      int world, MemoryZero1Sizes zero1_sizes, int x, const MemoryGpu* gpu);

// The number after `key` in a file of "key value" lines (/proc/meminfo, memory.stat,
// /proc/self/status); -1 if the file or the key is missing.
double memory_read_key(const char* path, const char* key);

#ifdef __cplusplus
}
#endif
#endif
