/*
 * NCCL communicator for the GPU trainer: one GPU per local rank, the ncclUniqueId
 * made by rank 0 and broadcast over MPI (the launcher already connects the ranks).
 * With one rank no NCCL communicator is created at all.
 * Collectives are queued on the caller's stream, so they are ordered after the
 * backward kernels without any host synchronisation.
 * Also the one check of NCCL results (ncclCheck), for every file that calls NCCL. run/'s
 * one CUDA file (run/nccl_comm.cu), compiled with the GPU targets.
 */
#ifndef RUN_NCCL_COMM_H
#define RUN_NCCL_COMM_H

#include <mpi.h>
#include <nccl.h>

#include "llmc/cuda_common.cuh"
#include "run/error.h"
#include "run/mpi_wait.h"

// A failed NCCL result ends the program, naming where, what (NULL: the call at that line)
// and NCCL's own account (ncclGetLastError; comm may be NULL).
void nccl_check(ncclResult_t r, ncclComm_t comm, const char* what, const char* file, int line);
#define ncclCheck(call) nccl_check((call), NULL, NULL, __FILE__, __LINE__)

typedef struct {
    int rank, world;
    int local_rank, local_world;  // among the ranks on this node
    ncclComm_t comm;              // NULL with one rank
} NcclComm;

// The rank among the processes that share this node (and so its GPUs).
int mpi_local_rank(int* local_world);

// 1 when the ranks on this node run on distinct GPUs (collective over the node's ranks).
// Compares device UUIDs, so it also holds where every process is shown only its own GPU
// (CUDA_VISIBLE_DEVICES per task).
int gpus_distinct_on_node(void);

// Call after cuda_select_device(local_rank). NCCL needs a GPU per rank: with more ranks
// than GPUs on a node it would refuse with a bare "invalid usage", so say what is wrong.
void nccl_comm_init(NcclComm* c, int rank, int world, int local_rank, int local_world);

void nccl_comm_free(NcclComm* c);

// ncclCommDestroy under the job's deadline (--comm-timeout; `what` names it in the error): since
// NCCL 2.14 destroy finalizes, an intra-node collective that returns only once every rank of
// the communicator has reached its own destroy, so a peer that died first would hold it forever.
void nccl_comm_destroy_deadline(ncclComm_t comm, const char* what);

// A host wait on the GPU (cudaStreamSynchronize, cudaEventSynchronize) under the same deadline,
// where NCCL work is queued before it: a peer that died before queueing its part of a collective
// leaves that collective, and so the wait, unfinished for good (NCCL's kernels spin).
#define cudaDeadline(what, call)   \
    do {                           \
        mpi_blocking_begin(what);  \
        cudaCheck(call);           \
        mpi_blocking_end();        \
    } while (0)

// In-place SUM over all ranks of n floats, queued on stream.
void nccl_all_reduce_sum(float* buf, size_t n, const NcclComm* c, cudaStream_t stream);

#endif
