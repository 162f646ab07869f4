/*
 * zero1/backend_cpu.c: the CPU trainer's backend for zero1/ (see zero1/optimizer.h).
 */
#include <mpi.h>

#include "run/files.h"
#include "zero1/optimizer.h"

// An MPI communicator over the ranks of one color (< 0: all), waiting at most --comm-timeout.
static Zero1Comm* mpi_comm(const TrainConfig* cfg, const Zero1Device* dev, int color, const char* label) {
    Zero1Comm* c = zero1_comm_mpi_create(dev, color);
    c->timeout_s = cfg->comm_timeout;
    c->label = label;
    return c;
}

Zero1Backend* zero1_backend_cpu_on(const TrainConfig* cfg, int world, Zero1Backend* be) {
    int group = zero1_instance_group_size(cfg, world);
    if (group < world) {
        int rank;
        mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
        be->comm = mpi_comm(cfg, &be->device, rank / group, NULL);
        be->cross = mpi_comm(cfg, &be->device, rank % group, "across instances");
    } else {
        be->comm = world > 1 ? mpi_comm(cfg, &be->device, -1, NULL) : zero1_comm_single_create(&be->device);
    }
    be->host_model = 1;
    return be;
}

Zero1Backend* zero1_backend_cpu(const TrainConfig* cfg, int world) {
    Zero1Backend* be = (Zero1Backend*)callocCheck(1, sizeof(Zero1Backend));
    be->device = zero1_device_cpu();
    return zero1_backend_cpu_on(cfg, world, be);
}
