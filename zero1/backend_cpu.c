/*
 * zero1/backend_cpu.c: the CPU trainer's backend for zero1/ (see zero1/optimizer.h).
 * Only the CPU trainer links it: it brings the deferred test device and the hazard
 * communicator along.
 */
#include "llmc/utils.h"
#include "zero1/optimizer.h"

static void destroy_deferred(Zero1Device* d) { zero1_device_deferred_destroy(d); }

Zero1Backend* zero1_backend_cpu(const TrainConfig* cfg, int world) {
    Zero1Backend* be = (Zero1Backend*)callocCheck(1, sizeof(Zero1Backend));
    if (strcmp(cfg->test_device, "deferred") == 0) {
        be->device = zero1_device_deferred_create();
        be->destroy_device = destroy_deferred;
        be->host_view = zero1_device_deferred_host_view;
    } else {  // "cpu" (llmc/cli.h checked the choice)
        be->device = zero1_device_cpu();
    }
    be->comm = world > 1 ? zero1_comm_mpi_create(&be->device, -1) : zero1_comm_single_create(&be->device);
    if (cfg->test_hazard) be->comm = zero1_comm_hazard_create(be->comm, &be->device, (unsigned)cfg->seed);
    be->host_model = 1;
    return be;
}
