/*
 * zero1/comm_nccl.cu: the NCCL communicator (see zero1/comm_nccl.h).
 *
 * Stream and event plan, per collective:
 *   compute: ... kernels that wrote buf ... [record compute_ready]
 *   comm:    [wait compute_ready] NCCL collective [record slot.done]
 *   wait(h): compute [wait slot.done]; later compute work runs after the collective.
 * cudaStreamWaitEvent binds the record in effect when it is queued, so one compute_ready
 * event serves every collective, and a slot's event can be recorded again once its
 * handle is finished.
 *
 * Inside an NCCL group the collectives are only queued on the comm stream at
 * ncclGroupEnd, so the completion events of a group's collectives are recorded after
 * it; until then their slots are GROUPED (not yet launched).
 *
 * In place, with count = n / size elements per rank:
 *   reduce-scatter  sendbuff = buf,                 recvbuff = buf + rank*count
 *   all-gather      sendbuff = buf + rank*count,    recvbuff = buf
 *   all-reduce      sendbuff = recvbuff = buf
 * which are exactly NCCL's in-place forms (recvbuff == sendbuff + rank*recvcount for
 * reduce-scatter, sendbuff == recvbuff + rank*sendcount for all-gather).
 * ZERO1_AVG is ncclAvg (for floating types NCCL pre-multiplies each input by 1/nranks:
 * see zero1/comm.h). all_to_all_v is one NCCL group of an ncclSend and an ncclRecv per
 * peer (itself included), ordered like the collectives.
 *
 * One communication stream per device, shared by all its NCCL communicators (the group and
 * the cross communicator of --dist-opt-instances): NCCL does not support collectives of two
 * communicators running at once on one GPU (each may wait on its peers while holding SMs
 * the other needs); on one stream they run one after another, in issue order, which every
 * rank keeps the same (issue_order_matters).
 *
 * Errors end the program (fatal, NCCL's through run/nccl_comm.h's check), except
 * abort's: it runs while the job is already ending, so it returns NCCL's result.
 */
#include <limits.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "llmc/cuda_common.cuh"
#include "run/mpi_wait.h"
#include "run/nccl_comm.h"
#include "zero1/comm_nccl.h"
#include "zero1/device_cuda.h"

enum { SLOT_FREE = 0, SLOT_GROUPED, SLOT_LAUNCHED };

typedef struct {
    int state;
    cudaEvent_t done;  // recorded on the comm stream after the collective; NULL until first used
    Zero1Collective op;  // for messages
    int bucket, step;
    Zero1Event trace_start;  // timed, on the comm stream, when tracing
} NcclSlot;

typedef struct {
    ncclComm_t comm;          // NULL after abort
    cudaStream_t stream;      // the device's communication stream (shared: comm_stream_acquire)
    cudaStream_t compute;     // the device's compute stream (borrowed)
    cudaEvent_t compute_ready;
    NcclSlot* slots;
    int num_slots;
    int in_group;
    MPI_Comm host_comm;       // the same ranks, for host_all_gather (the host never waits for the GPU)
} NcclImpl;

static NcclImpl* impl_of(Zero1Comm* c) { return (NcclImpl*)c->impl; }

// The communication streams, one per device (known by its compute stream), with the
// number of communicators using each.
#define MAX_COMM_STREAMS 16
static struct {
    cudaStream_t compute, comm;
    int users;
} comm_streams[MAX_COMM_STREAMS];

static cudaStream_t comm_stream_acquire(cudaStream_t compute) {
    int free_at = -1;
    for (int i = 0; i < MAX_COMM_STREAMS; i++) {
        if (comm_streams[i].users > 0 && comm_streams[i].compute == compute) {
            comm_streams[i].users++;
            return comm_streams[i].comm;
        }
        if (comm_streams[i].users == 0 && free_at < 0) free_at = i;
    }
    if (free_at < 0) fatal("zero1 nccl: more than %d devices with NCCL communicators in one process", MAX_COMM_STREAMS);
    comm_streams[free_at].compute = compute;
    comm_streams[free_at].users = 1;
    cudaCheck(cudaStreamCreateWithFlags(&comm_streams[free_at].comm, cudaStreamNonBlocking));
    return comm_streams[free_at].comm;
}

static void comm_stream_release(cudaStream_t comm) {
    for (int i = 0; i < MAX_COMM_STREAMS; i++) {
        if (comm_streams[i].users > 0 && comm_streams[i].comm == comm) {
            if (--comm_streams[i].users == 0) cudaCheck(cudaStreamDestroy(comm));
            return;
        }
    }
    fatal("zero1 nccl: releasing a communication stream that was not acquired");
}

static ncclDataType_t nccl_type(Zero1Dtype t) {
    switch (t) {
        case ZERO1_FP32: return ncclFloat;
        case ZERO1_BF16: return ncclBfloat16;
        case ZERO1_FP64: return ncclDouble;
    }
    fatal("zero1 nccl: no NCCL type for dtype %d", (int)t);
}

// ----------------------------------------------------------------------------
// Handles

static int take_slot(NcclImpl* im) {
    int h = 0;
    while (h < im->num_slots && im->slots[h].state != SLOT_FREE) h++;
    if (h == im->num_slots) {
        int n = im->num_slots ? 2 * im->num_slots : 16;
        im->slots = (NcclSlot*)realloc(im->slots, (size_t)n * sizeof(NcclSlot));
        if (!im->slots) fatal("out of memory growing the NCCL handle table");
        memset(im->slots + im->num_slots, 0, (size_t)(n - im->num_slots) * sizeof(NcclSlot));
        im->num_slots = n;
    }
    if (im->slots[h].done == NULL) cudaCheck(cudaEventCreateWithFlags(&im->slots[h].done, cudaEventDisableTiming));
    return h;
}

static NcclSlot* slot_in_flight(Zero1Comm* c, Zero1Handle h, const char* caller) {
    NcclImpl* im = impl_of(c);
    if (h >= im->num_slots || im->slots[h].state == SLOT_FREE) {
        fatal("zero1 nccl: %s of handle %d, which is not in flight (finished twice?)", caller, h);
    }
    return &im->slots[h];
}

static void finish_slot(NcclImpl* im, NcclSlot* s) {
    // Complete or not, the compute stream now waits for it: what the caller queues next
    // runs after the collective (when complete, the wait costs nothing).
    cudaCheck(cudaStreamWaitEvent(im->compute, s->done, 0));
    s->state = SLOT_FREE;
}

static void nccl_wait(Zero1Comm* c, Zero1Handle h) {
    if (h < 0) return;
    NcclSlot* s = slot_in_flight(c, h, "wait");
    if (s->state == SLOT_GROUPED) {
        fatal("zero1 nccl: wait for the %s of bucket %d inside its group: call group_end first",
              zero1_collective_name(s->op), s->bucket);
    }
    finish_slot(impl_of(c), s);
}

static int nccl_test(Zero1Comm* c, Zero1Handle h) {
    if (h < 0) return 1;
    NcclSlot* s = slot_in_flight(c, h, "test");
    if (s->state == SLOT_GROUPED) return 0;  // not even launched yet
    cudaError_t status = zero1_cuda_event_status(s->done);
    if (status == cudaErrorNotReady) return 0;
    if (status != cudaSuccess) {
        fatal("zero1 nccl: the %s of bucket %d (step %d) failed on the GPU: %s", zero1_collective_name(s->op),
              s->bucket, s->step, cudaGetErrorString(status));
    }
    finish_slot(impl_of(c), s);
    return 1;
}

// ----------------------------------------------------------------------------
// Collectives

// The collective is queued on the comm stream: its completion event (and trace span) follow it.
static void mark_launched(Zero1Comm* c, NcclSlot* s) {
    NcclImpl* im = impl_of(c);
    zero1_trace_end(c->tracer, s->op == ZERO1_ALL_GATHER ? TRACE_PARAM_COMM : TRACE_GRAD_COMM, s->trace_start,
                    (Zero1Stream)im->stream, "%s b%d", zero1_collective_name(s->op), s->bucket);
    s->trace_start = NULL;
    cudaCheck(cudaEventRecord(s->done, im->stream));
    s->state = SLOT_LAUNCHED;
}

// A slot for a collective about to be queued on the comm stream, which is ordered after
// what the compute stream was given so far (ordering in).
static int begin_collective(Zero1Comm* c, Zero1Collective op, int bucket) {
    NcclImpl* im = impl_of(c);
    int h = take_slot(im);
    NcclSlot* s = &im->slots[h];
    s->op = op;
    s->bucket = bucket;
    s->step = c->step;
    cudaCheck(cudaEventRecord(im->compute_ready, im->compute));
    cudaCheck(cudaStreamWaitEvent(im->stream, im->compute_ready, 0));
    s->trace_start = bucket >= 0 ? zero1_trace_begin(c->tracer, (Zero1Stream)im->stream) : NULL;
    return h;
}

// The collective's NCCL calls returned r: name it on failure, else mark it queued (or
// grouped: recorded at group_end, after NCCL has queued the work).
static Zero1Handle end_collective(Zero1Comm* c, int h, ncclResult_t r) {
    NcclImpl* im = impl_of(c);
    NcclSlot* s = &im->slots[h];
    if (r != ncclSuccess) {
        char what[96];
        snprintf(what, sizeof(what), "%s of bucket %d (step %d)", zero1_collective_name(s->op), s->bucket, c->step);
        nccl_check(r, im->comm, what, __FILE__, __LINE__);
    }
    if (im->in_group) s->state = SLOT_GROUPED;
    else mark_launched(c, s);
    return h;
}

static Zero1Handle nccl_collective(Zero1Comm* c, Zero1Collective op, void* buf, size_t n, Zero1Dtype t,
                                   Zero1ReduceOp rop, int bucket) {
    NcclImpl* im = impl_of(c);
    if (im->comm == NULL) fatal("zero1 nccl: %s after the communicator was aborted", zero1_collective_name(op));
    if (n == 0) return -1;  // every rank has the same n: nothing to do anywhere
    if (op != ZERO1_ALL_REDUCE && n % (size_t)c->size != 0) {
        fatal("zero1 nccl: %s of bucket %d: %zu elements do not split over %d ranks", zero1_collective_name(op), bucket,
              n, c->size);
    }
    ncclDataType_t type = nccl_type(t);
    ncclRedOp_t red = rop == ZERO1_AVG ? ncclAvg : ncclSum;
    size_t count = n / (size_t)c->size;
    char* whole = (char*)buf;
    char* mine = whole + (size_t)c->rank * count * zero1_dtype_size(t);
    int h = begin_collective(c, op, bucket);
    ncclResult_t r = ncclSuccess;
    if (op == ZERO1_REDUCE_SCATTER) r = ncclReduceScatter(whole, mine, count, type, red, im->comm, im->stream);
    else if (op == ZERO1_ALL_GATHER) r = ncclAllGather(mine, whole, count, type, im->comm, im->stream);
    else r = ncclAllReduce(whole, whole, n, type, red, im->comm, im->stream);
    return end_collective(c, h, r);
}

// One NCCL group of point-to-point calls (to itself too), so that all pairs progress at once.
static Zero1Handle nccl_all_to_all_v(Zero1Comm* c, const void* send, const size_t* send_counts,
                                     const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                     const size_t* recv_offsets, Zero1Dtype t, int bucket) {
    NcclImpl* im = impl_of(c);
    if (im->comm == NULL) fatal("zero1 nccl: all-to-all after the communicator was aborted");
    ncclDataType_t type = nccl_type(t);
    size_t e = zero1_dtype_size(t);
    int h = begin_collective(c, ZERO1_ALL_TO_ALL, bucket);
    ncclCheck(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (send_counts[r]) {
            ncclCheck(ncclSend((const char*)send + send_offsets[r] * e, send_counts[r], type, r, im->comm, im->stream));
        }
        if (recv_counts[r]) {
            ncclCheck(ncclRecv((char*)recv + recv_offsets[r] * e, recv_counts[r], type, r, im->comm, im->stream));
        }
    }
    ncclCheck(ncclGroupEnd());
    return end_collective(c, h, ncclSuccess);
}

static void nccl_host_all_gather(Zero1Comm* c, const void* mine, void* all, size_t bytes) {
    if (bytes > INT_MAX) fatal("zero1 nccl: a host all-gather of %zu bytes", bytes);
    mpiDeadline("zero1 nccl: the host all-gather (MPI_Allgather)",
                MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, impl_of(c)->host_comm));
}

static void nccl_group_begin(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (im->in_group) fatal("zero1 nccl: group_begin inside a group (groups do not nest)");
    ncclCheck(ncclGroupStart());
    im->in_group = 1;
}

static void nccl_group_end(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (!im->in_group) fatal("zero1 nccl: group_end without group_begin");
    im->in_group = 0;
    ncclCheck(ncclGroupEnd());
    for (int i = 0; i < im->num_slots; i++) {
        NcclSlot* s = &im->slots[i];
        if (s->state != SLOT_GROUPED) continue;
        mark_launched(c, s);
    }
}

// NCCL moves its work on by itself. This is where a peer's failure can be noticed
// early (a network error, a rank that died): NCCL reports it through
// ncclCommGetAsyncError while the collective itself may never complete. The deadline
// (zero1/watchdog_cuda.h) polls this while the host waits and, past it, calls abort().
static void nccl_progress(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (im->comm == NULL) return;
    ncclResult_t async_error = ncclSuccess;
    ncclCheck(ncclCommGetAsyncError(im->comm, &async_error));
    if (async_error == ncclInProgress) return;
    nccl_check(async_error, im->comm, "communication (reported asynchronously)", __FILE__, __LINE__);
}

static void nccl_destroy(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (im->in_group) fatal("zero1 nccl: destroy inside an open group");
    // every collective has finished (the other communicators' too)
    cudaDeadline("zero1 nccl: the collectives before ncclCommDestroy", cudaStreamSynchronize(im->stream));
    if (im->comm) nccl_comm_destroy_deadline(im->comm, "zero1 nccl: ncclCommDestroy");
    for (int i = 0; i < im->num_slots; i++) {
        if (im->slots[i].done) cudaCheck(cudaEventDestroy(im->slots[i].done));
    }
    free(im->slots);
    mpiDeadline("zero1 nccl: MPI_Comm_free of the host communicator", MPI_Comm_free(&im->host_comm));
    cudaCheck(cudaEventDestroy(im->compute_ready));
    comm_stream_release(im->stream);
    free(im);
}

static int nccl_abort(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (im->comm == NULL) return 0;
    ncclResult_t r = ncclCommAbort(im->comm);
    im->comm = NULL;
    return r == ncclSuccess ? 0 : (int)r;
}

void* zero1_comm_nccl_stream(Zero1Comm* c) { return (void*)impl_of(c)->stream; }

// ----------------------------------------------------------------------------
// Bootstrap of the ncclUniqueId

static void bootstrap_mpi(int color, ncclUniqueId* id, int* rank, int* size, MPI_Comm* host_comm) {
    int initialized = 0;
    mpiCheck(MPI_Initialized(&initialized));
    if (!initialized) fatal("zero1 nccl: the MPI bootstrap needs MPI_Init first");
    MPI_Comm group = MPI_COMM_WORLD;
    if (color >= 0) {
        int world_rank;
        mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
        mpiDeadline("zero1 nccl: the bootstrap's MPI_Comm_split", MPI_Comm_split(MPI_COMM_WORLD, color, world_rank, &group));
    }
    mpiCheck(MPI_Comm_rank(group, rank));
    mpiCheck(MPI_Comm_size(group, size));
    if (*rank == 0) ncclCheck(ncclGetUniqueId(id));
    mpiDeadline("zero1 nccl: the bootstrap's MPI_Bcast of the unique id", MPI_Bcast(id, (int)sizeof(*id), MPI_BYTE, 0, group));
    // the same ranks in the same order, for host metadata
    mpiDeadline("zero1 nccl: the bootstrap's MPI_Comm_dup", MPI_Comm_dup(group, host_comm));
    if (group != MPI_COMM_WORLD) mpiDeadline("zero1 nccl: the bootstrap's MPI_Comm_free", MPI_Comm_free(&group));
}

// Shared by every NCCL communicator; no op is NULL.
static const Zero1CommOps nccl_ops = {
    nccl_collective, nccl_all_to_all_v, nccl_host_all_gather, nccl_wait, nccl_test, nccl_progress,
    nccl_group_begin, nccl_group_end, nccl_abort, nccl_destroy,
};

Zero1Comm* zero1_comm_nccl_create(const Zero1Device* dev, int color) {
    if (!dev) fatal("zero1 nccl: the communicator needs a device");
    if (dev->ops != &zero1_device_cuda_ops) {
        fatal("zero1 nccl: the NCCL communicator moves GPU buffers; the device is '%s'", dev->ops->name);
    }
    NcclImpl* im = (NcclImpl*)callocCheck(1, sizeof(NcclImpl));
    int rank = 0, size = 0;
    ncclUniqueId id;
    bootstrap_mpi(color, &id, &rank, &size, &im->host_comm);
    im->compute = (cudaStream_t)dev->compute;
    im->stream = comm_stream_acquire(im->compute);
    cudaCheck(cudaEventCreateWithFlags(&im->compute_ready, cudaEventDisableTiming));
    ncclCheck(ncclCommInitRank(&im->comm, size, id, rank));
    Zero1Comm* c = zero1_comm_new(&nccl_ops, im, rank, size, "nccl");
    c->traces_itself = 1;  // its collectives run on the communication stream: device-time spans
    c->issue_order_matters = 1;  // NCCL kernels of all communicators queue on one GPU
    return c;
}
