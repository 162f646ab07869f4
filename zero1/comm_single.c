/*
 * The single-rank communicator: with one rank every collective is the identity (an
 * average over one rank included), so nothing is moved and every handle is complete at
 * once (ordering holds trivially: the buffer already is the result, in compute-stream
 * order). all_to_all_v is the exception: its result lives in another buffer, so the
 * slice is copied there, queued on the compute stream.
 * Errors end the program (fatal).
 */
#include <string.h>

#include "zero1/comm.h"

static Zero1Handle single_collective(Zero1Comm* c, Zero1Collective kind, void* buf, size_t n, Zero1Dtype t,
                                     Zero1ReduceOp op, int bucket) {
    return -1;
}
static Zero1Handle single_all_to_all_v(Zero1Comm* c, const void* send, const size_t* send_counts,
                                       const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                       const size_t* recv_offsets, Zero1Dtype t, int bucket) {
    const Zero1Device* dev = (const Zero1Device*)c->impl;
    size_t e = zero1_dtype_size(t);
    if (send_counts[0] != recv_counts[0]) fatal("zero1 single: all_to_all_v sends %zu and receives %zu", send_counts[0], recv_counts[0]);
    if (send_counts[0]) {
        dev->ops->copy(dev->ctx, dev->compute, (char*)recv + recv_offsets[0] * e,
                       (const char*)send + send_offsets[0] * e, send_counts[0] * e);
    }
    return -1;
}
static void single_host_all_gather(Zero1Comm* c, const void* mine, void* all, size_t bytes) {
    if (bytes) memmove(all, mine, bytes);
}
static void single_wait(Zero1Comm* c, Zero1Handle h) {}
static int single_test(Zero1Comm* c, Zero1Handle h) { return 1; }

// No progress, groups, abort or state of its own: those ops stay NULL.
static const Zero1CommOps single_ops = {.collective = single_collective, .all_to_all_v = single_all_to_all_v,
                                        .host_all_gather = single_host_all_gather, .wait = single_wait,
                                        .test = single_test};

// The device is borrowed: it outlives the communicator.
Zero1Comm* zero1_comm_single_create(const Zero1Device* dev) {
    return zero1_comm_new(&single_ops, (void*)dev, 0, 1, "single");
}
