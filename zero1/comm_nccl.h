/*
 * zero1/comm_nccl.h: the communicator of zero1/comm.h for GPU buffers, over NCCL.
 *
 * One GPU per process: the caller selects it (cudaSetDevice) before creating the
 * communicator, and the device must be zero1/device_cuda.h's. Collectives run on the
 * communicator's own non-blocking stream; a handle is an event recorded after the
 * collective. Ordering in: the communication stream waits on an event recorded on the
 * compute stream at the call. wait(h) makes the compute stream wait on the handle's
 * event and returns at once; test(h) asks the event and never blocks.
 *
 * Handles of collectives issued inside group_begin/group_end can be waited for only
 * after group_end (NCCL launches the group's work there); test() answers 0 before.
 *
 * Bootstrap of the ncclUniqueId (rank 0 makes it, every rank needs it):
 *  - MPI: MPI_Bcast; the communicator covers MPI_COMM_WORLD (color < 0) or the ranks
 *    that pass the same color (MPI_Comm_split, ordered by world rank). MPI must be
 *    initialised, and every world rank must call the constructor (the split is collective).
 *  - file (Slurm without MPI): rank 0 writes the id to a file on a filesystem all ranks
 *    share, under a temporary name renamed into place; the others poll for it. The file
 *    carries a run token, so a file left by an earlier run is never taken for this one's;
 *    rank 0 removes it once every rank holds the id.
 */
#ifndef ZERO1_COMM_NCCL_H
#define ZERO1_COMM_NCCL_H

#include <stddef.h>

#include "zero1/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ZERO1_NCCL_BOOT_MPI = 0, ZERO1_NCCL_BOOT_FILE = 1 } Zero1NcclBootMode;

typedef struct {
    Zero1NcclBootMode mode;
    // MPI: < 0 for MPI_COMM_WORLD, else the color of this rank's group (the same choice,
    // world or groups, on every rank).
    int color;
    // file: the id file's path (its directory must exist and be shared by all ranks).
    const char* id_file;
    // file: names this run; NULL: "$SLURM_JOB_ID.$SLURM_STEP_ID" (an error if unset).
    const char* run_token;
    // file: this process's rank and the number of ranks; < 0: SLURM_PROCID, SLURM_NTASKS.
    int rank, size;
    // file: seconds the ranks other than 0 wait for the id file; <= 0: 600.
    double timeout_s;
} Zero1NcclBootstrap;

Zero1Comm* zero1_comm_nccl_create(const Zero1Device* dev, const Zero1NcclBootstrap* boot);

// The communication stream (a cudaStream_t), for traces and tests.
void* zero1_comm_nccl_stream(Zero1Comm* c);

// Ends every collective of the communicator at once (ncclCommAbort), e.g. when a rank is
// stuck past a deadline; only destroy() may follow. Returns 0, or the ncclResult_t.
int zero1_comm_nccl_abort(Zero1Comm* c);

// 1 when every local rank can have a GPU of its own (cudaGetDeviceCount >= local_world);
// NCCL refuses two ranks on one GPU, so otherwise use the staged MPI communicator. It
// counts the GPUs this process sees: where each process is shown only its own GPU
// (CUDA_VISIBLE_DEVICES per task), it answers 0 although NCCL would work.
int zero1_nccl_usable(int local_rank, int local_world);

// The id file's rendezvous alone (no NCCL; for tests). publish: rank 0 replaces path
// atomically with (token, size, id). await: the others poll until the file carries this
// token, then check size and return the id; a wrong size, or nothing after timeout_s,
// ends the program with an error naming the file.
void zero1_nccl_id_file_publish(const char* path, const char* token, int size, const void* id, size_t id_bytes);
void zero1_nccl_id_file_await(const char* path, const char* token, int size, void* id, size_t id_bytes,
                              double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
