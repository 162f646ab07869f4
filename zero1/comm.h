/*
 * zero1/comm.h: the communicator the ZeRO-1 runtime talks through.
 *
 * The runtime never names MPI or NCCL: each backend has one const table of ops
 * (Zero1CommOps) that all its communicators share, and callers go through the
 * zero1_comm_* wrappers below, never asking which backend they hold. A communicator is made
 * for one device (zero1/device_ops.h: its ops and compute stream) and moves that device's
 * buffers. The contract, the same for every backend:
 *
 *  - Ordering in. A collective sees its buffer as it is once everything the caller queued
 *    on the compute stream before the call has run (NCCL: the communication stream waits
 *    on an event recorded on the compute stream; MPI: the host syncs that point before
 *    posting; staged MPI: the copy to pinned host memory is queued after it).
 *  - In flight. The call returns at once with a handle. Until the handle is waited for, or
 *    test() has returned 1, the caller must not read or write the buffer's region (n
 *    elements from buf; for all_to_all_v both its send and its recv region) in any way: not
 *    from the host, not from work queued on the compute stream. zero1/testing/comm_hazard.c
 *    poisons those regions to prove the runtime never does. Ordering in covers every
 *    region a collective writes too: it writes them only after what the caller queued on
 *    the compute stream before the call (a kernel still reading a recv buffer that a new
 *    all_to_all_v reuses is safe if it was queued first).
 *  - wait(h): what the caller queues on the compute stream after the call runs after the
 *    collective has completed. The CPU backends block the host until then; NCCL makes the
 *    compute stream wait on an event and the host returns at once. The host itself may read
 *    the result only after syncing the compute stream (device_ops.h's rule).
 *  - test(h): never blocks; 1 when complete, with the same effect as wait(h); 0 otherwise.
 *    A handle is finished exactly once, by wait or by the test that returned 1, and is
 *    then released. Handle -1 means "nothing" and is always complete.
 *  - progress(): a chance for a backend to move outstanding work on (Open MPI does not
 *    progress non-blocking collectives in the background); the runtime calls it at layer
 *    boundaries. It has no effect on ordering.
 *  - group_begin()/group_end(): the collectives issued between them may be fused into one
 *    launch (NCCL groups); their handles may be waited for only after group_end (test()
 *    answers 0 before). Groups do not nest.
 *  - abort(): ends every collective in flight at once and for good (NCCL: ncclCommAbort,
 *    whose kernels would otherwise spin on a dead peer forever); only destroy() may follow.
 *    For a job that is ending, so it never ends the program itself: 0, or the backend's
 *    error code. A no-op where the host's waits block (MPI: the job's end stops them); a
 *    wrapper forwards it to the communicator it wraps.
 *  - Every rank issues the same collectives in the same order (bucket is a label for
 *    traces and messages, not a matching key; a negative one names what a collective that
 *    moves no bucket is for: ZERO1_LABEL_*). With issue_order_matters set (NCCL: one GPU
 *    runs the collectives of all its communicators in the order they were issued, so ranks
 *    that interleave two communicators differently can deadlock), the order must also be
 *    the same across communicators: the runtime then issues nothing from a test() that
 *    happened to see a collective complete, only at fixed points of the step.
 *  - Timeouts. timeout_s (seconds; 0: none) bounds every wait the host makes: a wait that
 *    has not completed after timeout_s names the collective (zero1_describe_collective:
 *    kind, bucket, step) and ends the job (run/watchdog.h), so that a rank that stopped
 *    or lost its network cannot hang the others. Whoever creates a communicator sets it
 *    (zero1_comm_mpi_create starts at WATCHDOG_DEFAULT_TIMEOUT_S); a wrapper leaves it to the
 *    communicator it wraps. A backend whose wait does not block the host (NCCL) is watched
 *    where the host does block, and aborted past the deadline: zero1/watchdog_cuda.h.
 *  - Traces: when tracer is set, a backend whose collectives run on a device stream records
 *    each bucket collective's device-time span itself ("reduce-scatter bN", "all-reduce bN"
 *    on the grad lane, "all-gather bN" on the param lane) and says so with traces_itself;
 *    otherwise the runtime records host times (exact for host-driven backends).
 *
 * In-place conventions (reduce_scatter, all_gather and all_reduce are one op, collective(),
 * told apart by its Zero1Collective):
 *  - reduce_scatter(buf, n): buf holds a whole bucket of n elements (n divisible by size);
 *    on completion this rank's slot buf[rank*n/size, (rank+1)*n/size) holds the sum over
 *    ranks of that slot. The rest of buf is unspecified (NCCL: recvbuff = sendbuff +
 *    rank*recvcount; MPI leaves its result at the start of a buffer, so it is moved).
 *  - all_gather(buf, n): this rank's slot of buf is its contribution; on completion all
 *    of buf holds every rank's slot.
 *  - all_reduce(buf, n): element-wise sum, in place.
 *  - all_to_all_v(send, send_counts, send_offsets, recv, recv_counts, recv_offsets): the
 *    only collective with two regions, both in flight (ordering in covers send; neither
 *    may be touched until the handle is finished). The count and offset arrays are host
 *    memory of size entries, in elements, read during the call only: to rank o goes
 *    send[send_offsets[o], +send_counts[o]), from rank s comes recv[recv_offsets[s],
 *    +recv_counts[s]). Send ranges may overlap (they are only read); recv ranges may not.
 *    Every pair of ranks agrees on its counts (the caller plans them on the host). send
 *    is unchanged afterwards. No arithmetic: the dtype only sizes the elements. Its uniform
 *    case (every count n, slice j of send for rank j, rank j's slice for this rank at
 *    recv[j*n]) is how --fp32-accumulation exchanges a bucket's bf16 slices, which the
 *    receiver sums itself in fp32 (device_ops.h's sum_slices).
 *  - host_all_gather(mine, all, bytes): blocking, host memory, for small metadata (token
 *    ids): every rank passes `bytes` bytes; on return all[r*bytes, +bytes) holds rank
 *    r's. It touches no device buffer and no stream, so it may be called while the
 *    collectives above are in flight; it counts as one collective in the issue order.
 * Sums of bf16 are rounded to bf16 after each addition; fp64 is for small scalars (norms).
 *
 * Reduce ops (reduce_scatter, all_reduce): ZERO1_SUM, or ZERO1_AVG, the sum over the
 * communicator's ranks times 1/size, where 1/size is the float nearest to it. Where the
 * scaling happens differs by backend, which shows in the last bits unless size is a power
 * of two (then scaling is exact, barring subnormals):
 *  - NCCL: ncclAvg, which for floating types is NCCL's PreMulSum: every rank's input is
 *    multiplied by 1/size rounded to the data type (bf16(1/size) for bf16), each product
 *    rounded to the type, and the products are summed (NCCL's src/enqueue.cc,
 *    hostToDevRedOp; src/device/reduce_kernel.h, FuncPreMulSum).
 *  - MPI: MPI has no average: the sum is computed as for ZERO1_SUM and multiplied by
 *    1/size on the receive side, in the pass that moves the result into the caller's
 *    region (bf16: in fp32, rounded to bf16 once, after the bf16 sum).
 *  - single: the identity (size 1).
 */
#ifndef ZERO1_COMM_H
#define ZERO1_COMM_H

#include <stddef.h>
#include <stdio.h>

#include "run/files.h"
#include "zero1/device_ops.h"
#include "zero1/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int Zero1Handle;  // -1: none

typedef enum { ZERO1_SUM = 0, ZERO1_AVG = 1 } Zero1ReduceOp;

// ZERO1_AVG's factor: the float nearest to 1/size (every backend uses this one).
static inline float zero1_avg_scale(int size) { return (float)(1.0 / (double)size); }

// Bucket labels of collectives that move no bucket.
enum { ZERO1_LABEL_NONE = -1, ZERO1_LABEL_GRAD_NORM = -2, ZERO1_LABEL_NAN_FLAGS = -3, ZERO1_LABEL_REPORT = -4 };

// What a collective does (all_to_all_v has an op of its own: two regions).
typedef enum { ZERO1_REDUCE_SCATTER = 0, ZERO1_ALL_GATHER, ZERO1_ALL_REDUCE, ZERO1_ALL_TO_ALL } Zero1Collective;
static inline const char* zero1_collective_name(Zero1Collective kind) {
    static const char* const names[] = {"reduce-scatter", "all-gather", "all-reduce", "all-to-all"};
    return names[kind];
}

typedef struct Zero1Comm Zero1Comm;

// A backend's ops (the contract above). NULL progress, group_begin/group_end and abort:
// nothing to do there.
typedef struct {
    // kind: ZERO1_REDUCE_SCATTER, ZERO1_ALL_GATHER (op unused: ZERO1_SUM) or ZERO1_ALL_REDUCE.
    Zero1Handle (*collective)(Zero1Comm* c, Zero1Collective kind, void* buf, size_t n, Zero1Dtype t, Zero1ReduceOp op,
                              int bucket);
    Zero1Handle (*all_to_all_v)(Zero1Comm* c, const void* send, const size_t* send_counts, const size_t* send_offsets,
                                void* recv, const size_t* recv_counts, const size_t* recv_offsets, Zero1Dtype t,
                                int bucket);
    void (*host_all_gather)(Zero1Comm* c, const void* mine, void* all, size_t bytes);
    void (*wait)(Zero1Comm* c, Zero1Handle h);
    int (*test)(Zero1Comm* c, Zero1Handle h);
    void (*progress)(Zero1Comm* c);
    void (*group_begin)(Zero1Comm* c);
    void (*group_end)(Zero1Comm* c);
    int (*abort)(Zero1Comm* c);
    void (*destroy)(Zero1Comm* c);  // frees what impl holds; zero1_comm_destroy frees the rest
} Zero1CommOps;

struct Zero1Comm {
    const Zero1CommOps* ops;
    void* impl;
    int rank, size;
    const char* name;  // for messages only: "single", "mpi", "mpi-staged", "nccl", "hazard(...)"
    int step;          // set by the runtime each step (0-based): for messages and traces
    double timeout_s;  // a wait longer than this ends the job; 0: wait forever
    const char* label; // for messages: what sets this communicator apart ("across instances"), or NULL
    Zero1Tracer* tracer;
    int traces_itself;
    int issue_order_matters;  // see "Every rank issues the same collectives" above
};

// For backends: a communicator with the common fields set (the rest zero).
static inline Zero1Comm* zero1_comm_new(const Zero1CommOps* ops, void* impl, int rank, int size, const char* name) {
    Zero1Comm* c = (Zero1Comm*)callocCheck(1, sizeof(Zero1Comm));
    c->ops = ops;
    c->impl = impl;
    c->rank = rank;
    c->size = size;
    c->name = name;
    return c;
}

// What every caller uses.
static inline Zero1Handle zero1_comm_reduce_scatter(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, Zero1ReduceOp op,
                                                    int bucket) {
    return c->ops->collective(c, ZERO1_REDUCE_SCATTER, buf, n, t, op, bucket);
}
static inline Zero1Handle zero1_comm_all_gather(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, int bucket) {
    return c->ops->collective(c, ZERO1_ALL_GATHER, buf, n, t, ZERO1_SUM, bucket);
}
static inline Zero1Handle zero1_comm_all_reduce(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, Zero1ReduceOp op,
                                                int bucket) {
    return c->ops->collective(c, ZERO1_ALL_REDUCE, buf, n, t, op, bucket);
}
static inline Zero1Handle zero1_comm_all_to_all_v(Zero1Comm* c, const void* send, const size_t* send_counts,
                                                  const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                                  const size_t* recv_offsets, Zero1Dtype t, int bucket) {
    return c->ops->all_to_all_v(c, send, send_counts, send_offsets, recv, recv_counts, recv_offsets, t, bucket);
}
static inline void zero1_comm_host_all_gather(Zero1Comm* c, const void* mine, void* all, size_t bytes) {
    c->ops->host_all_gather(c, mine, all, bytes);
}
static inline void zero1_comm_wait(Zero1Comm* c, Zero1Handle h) { c->ops->wait(c, h); }
static inline int zero1_comm_test(Zero1Comm* c, Zero1Handle h) { return c->ops->test(c, h); }
static inline void zero1_comm_progress(Zero1Comm* c) {
    if (c->ops->progress) c->ops->progress(c);
}
static inline void zero1_comm_group_begin(Zero1Comm* c) {
    if (c->ops->group_begin) c->ops->group_begin(c);
}
static inline void zero1_comm_group_end(Zero1Comm* c) {
    if (c->ops->group_end) c->ops->group_end(c);
}
static inline int zero1_comm_abort(Zero1Comm* c) { return c->ops->abort ? c->ops->abort(c) : 0; }
static inline void zero1_comm_destroy(Zero1Comm* c) {
    if (c->ops->destroy) c->ops->destroy(c);
    free(c);
}

// The extent of an all_to_all_v region: the largest offset + count over the size ranks.
static inline size_t zero1_extent(const size_t* counts, const size_t* offsets, int size) {
    size_t end = 0;
    for (int r = 0; r < size; r++) {
        if (counts[r] && offsets[r] + counts[r] > end) end = offsets[r] + counts[r];
    }
    return end;
}

// "zero1: reduce-scatter of bucket 1 at step 5" (step 1-based, as the step lines count),
// "zero1: all-reduce across instances of the non-finite gradient flags at step 5".
static inline const char* zero1_describe_collective(const Zero1Comm* c, const char* kind, int bucket, char* buf,
                                                    size_t n) {
    char what[64];
    if (bucket >= 0) snprintf(what, sizeof(what), "bucket %d", bucket);
    else if (bucket == ZERO1_LABEL_GRAD_NORM) snprintf(what, sizeof(what), "the grad norm");
    else if (bucket == ZERO1_LABEL_NAN_FLAGS) snprintf(what, sizeof(what), "the non-finite gradient flags");
    else if (bucket == ZERO1_LABEL_REPORT) snprintf(what, sizeof(what), "the end-of-run report");
    else snprintf(what, sizeof(what), "a buffer");
    snprintf(buf, n, "zero1: %s%s%s of %s at step %d", kind, c->label ? " " : "", c->label ? c->label : "", what,
             c->step + 1);
    return buf;
}

// Backends for host-side launch. The device is borrowed and must outlive the communicator.
Zero1Comm* zero1_comm_single_create(const Zero1Device* dev);
// MPI over MPI_COMM_WORLD (color < 0) or over the ranks of MPI_COMM_WORLD that pass the
// same color (MPI_Comm_split, ordered by world rank). MPI must be initialised. A device
// whose memory is not host-addressable is staged through page-locked host buffers.
Zero1Comm* zero1_comm_mpi_create(const Zero1Device* dev, int color);

#ifdef __cplusplus
}
#endif
#endif
