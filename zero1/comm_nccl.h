/*
 * zero1/comm_nccl.h: the communicator of zero1/comm.h for GPU buffers, over NCCL.
 *
 * One GPU per process: the caller selects it (cudaSetDevice) before creating the
 * communicator, and the device must be zero1/device_cuda.h's. Collectives run on a
 * non-blocking communication stream, one per device, shared by every NCCL communicator of
 * that device (so no two of their collectives run at once on the GPU); a handle is an
 * event recorded after the collective. Ordering in: the communication stream waits on an event recorded on the
 * compute stream at the call. wait(h) makes the compute stream wait on the handle's
 * event and returns at once; test(h) asks the event and never blocks; abort() is
 * ncclCommAbort.
 *
 * Handles of collectives issued inside group_begin/group_end can be waited for only
 * after group_end (NCCL launches the group's work there); test() answers 0 before.
 *
 * Bootstrap: rank 0 makes the ncclUniqueId and MPI_Bcast hands it to the others; the
 * communicator covers MPI_COMM_WORLD (color < 0) or the ranks that pass the same color
 * (MPI_Comm_split, ordered by world rank). MPI must be initialised, and every world rank
 * must call the constructor (the split is collective). NCCL refuses two ranks on one GPU:
 * ask run/nccl_comm.h's gpus_distinct_on_node() first.
 */
#ifndef ZERO1_COMM_NCCL_H
#define ZERO1_COMM_NCCL_H

#include "zero1/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

Zero1Comm* zero1_comm_nccl_create(const Zero1Device* dev, int color);

// The communication stream (a cudaStream_t; the same for every communicator of a device), for tests.
void* zero1_comm_nccl_stream(Zero1Comm* c);

#ifdef __cplusplus
}
#endif
#endif
