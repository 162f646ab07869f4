/*
 * zero1/optimizer.h: the zero1/ runtime behind the trainers' optimizer table
 * (run/optimizer.h), for any model and any device.
 *
 * The trainer chooses the backend (the device its buffers live on and a communicator made
 * for it, zero1/device_ops.h and zero1/comm.h) and describes the model (Zero1ModelSpec);
 * this file does the rest: options from the command line, the runtime, the model's hooks,
 * the start-up ledger, the end-of-run report and the traces. zero1/gpt2.h describes GPT-2.
 */
#ifndef ZERO1_OPTIMIZER_H
#define ZERO1_OPTIMIZER_H

#include "run/config.h"
#include "run/optimizer.h"
#include "zero1/comm.h"
#include "zero1/device_ops.h"
#include "zero1/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

// Where the optimizer runs. The trainer fills it (heap-allocated, so that the communicator
// can keep a pointer to the device) and hands it over; the optimizer destroys the
// communicator, then the device (destroy_device may be NULL).
// host_model: the model computes on the host, reading and writing the buffers directly
// (the CPU trainer). The compute stream is then synced before the model runs, as if the
// model's work were queued on it: free on the CPU device, and what keeps the deferred
// test device's late execution consistent with the host model.
// comm: the ranks that shard the optimizer state among them (all of them, or with
// --dist-opt-instances K the W/K consecutive ranks of this rank's group); cross: with K > 1,
// the K ranks at this rank's position in every group (the shard all-reduce), else NULL.
typedef struct Zero1Backend_ {
    Zero1Device device;
    void (*destroy_device)(Zero1Device* d);
    Zero1Comm* comm;
    Zero1Comm* cross;
    int host_model;
    // For a host model on a device whose pointers the host cannot use (the deferred test
    // device): the host address of a device range. NULL: device pointers are host pointers.
    void* (*host_view)(const Zero1Device* d, const void* p, size_t bytes);
    // Where the host waits for the step's device work (read_norm), for a device whose
    // work can hang on a stuck peer (a GPU with NCCL): waits under --comm-timeout and
    // ends the job naming it. NULL: the device op's plain sync.
    void (*sync_compute)(const struct Zero1Backend_* be, int step);
} Zero1Backend;

// compute_dtype: what the model reads (the param buffer itself, or an fp32 copy of it).
Optimizer* zero1_optimizer_create(const TrainConfig* cfg, const Zero1ModelSpec* spec, Zero1Backend* backend,
                                  Zero1Dtype compute_dtype);
Zero1Runtime* zero1_optimizer_runtime(Optimizer* o);

// --dist-opt-instances K over world ranks: the group size W/K, after checking that K
// divides W and that the run is ZeRO-1 (fatal otherwise). Group g holds ranks
// g*G .. g*G+G-1; a backend makes comm from color rank / G and cross from color rank % G.
int zero1_instance_group_size(const TrainConfig* cfg, int world);

// The CPU backend: host memory and MPI (one rank: no communication; comm and cross as
// --dist-opt-instances asks; both wait at most --comm-timeout).
Zero1Backend* zero1_backend_cpu(const TrainConfig* cfg, int world);
// The same communicators for a backend whose device the caller chose (be->device, and
// destroy_device and host_view where it needs them: the tests' deferred device); returns be.
Zero1Backend* zero1_backend_cpu_on(const TrainConfig* cfg, int world, Zero1Backend* be);

#ifdef __cplusplus
}
#endif
#endif
