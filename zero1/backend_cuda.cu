/*
 * zero1/backend_cuda.cu: the GPU trainer's backend for zero1/ (see backend_cuda.h).
 *
 * The communicator: --comm nccl, mpi, or auto (NCCL when every rank on the node has a GPU
 * of its own, else MPI staged through page-locked host memory, the only way several ranks
 * can share one GPU, which is how 2-4 ranks are tested on one GPU). With one rank nothing
 * is communicated unless NCCL is asked for by name (a one-rank NCCL communicator, for tests).
 * Errors end the program (fatal).
 */
#include "zero1/backend_cuda.h"

#include <mpi.h>

#include "llmc/cuda_common.cuh"
#include "run/files.h"
#include "run/mpi_wait.h"
#include "run/nccl_comm.h"
#include "zero1/comm_nccl.h"
#include "zero1/device_cuda.h"
#include "zero1/watchdog_cuda.h"

static void destroy_cuda_device(Zero1Device* d) { zero1_device_cuda_destroy(d); }

// The step's one host wait, under --comm-timeout: NCCL's asynchronous errors end the job at
// once, a deadline ends it if a peer never arrives; either way the communicators are
// aborted first (NCCL's kernels would spin forever), whatever wraps them.
static void sync_compute_deadline(const Zero1Backend* be, int step) {
    Zero1Comm* comms[2] = {be->comm, be->cross};
    Zero1CudaWatch watch = {be->comm->timeout_s, comms, be->cross ? 2 : 1, NULL, 0, mpi_abort_world};
    zero1_cuda_sync_deadline((cudaStream_t)be->device.compute, &watch, "zero1: the GPU step", step);
}

// A communicator over the ranks of one color (< 0: all): NCCL or staged MPI.
static Zero1Comm* make_comm(const TrainConfig* cfg, const Zero1Device* dev, int nccl, int color, const char* label) {
    Zero1Comm* c;
    if (nccl) c = zero1_comm_nccl_create(dev, color);
    else c = zero1_comm_mpi_create(dev, color);  // staged: GPU memory is not host-addressable
    c->timeout_s = cfg->comm_timeout;
    c->label = label;
    return c;
}

Zero1Backend* zero1_backend_cuda(const TrainConfig* cfg, cudaStream_t compute, int local_rank, int local_world) {
    int world, rank;
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &world));
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    Zero1Backend* be = (Zero1Backend*)callocCheck(1, sizeof(Zero1Backend));
    be->device = zero1_device_cuda_create(compute);
    be->destroy_device = destroy_cuda_device;
    const char* want = cfg->comm_backend;  // auto, nccl or mpi (run/config.h checked)
    int distinct = gpus_distinct_on_node();  // collective: every rank asks, whatever it chose
    if (strcmp(want, "nccl") == 0 && !distinct) {
        fatal("--comm nccl: %d ranks on this node share GPUs, which NCCL refuses; use --comm mpi (or auto)", local_world);
    }
    int nccl = strcmp(want, "nccl") == 0 || (strcmp(want, "auto") == 0 && world > 1 && distinct);
    int group = zero1_instance_group_size(cfg, world);
    if (group < world) {
        be->comm = make_comm(cfg, &be->device, nccl, rank / group, NULL);
        be->cross = make_comm(cfg, &be->device, nccl, rank % group, "across instances");
    } else if (world > 1 || nccl) {
        be->comm = make_comm(cfg, &be->device, nccl, -1, NULL);
    } else {
        be->comm = zero1_comm_single_create(&be->device);
    }
    be->host_model = 0;
    be->sync_compute = sync_compute_deadline;
    return be;
}
