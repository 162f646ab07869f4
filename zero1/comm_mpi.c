/*
 * The MPI communicator: non-blocking collectives, for host memory or, staged through
 * page-locked host buffers, for device memory the host cannot address (several ranks
 * sharing one GPU, which NCCL refuses; the deferred test device).
 *
 * MPI details that shape this file:
 *  - MPI's in-place reduce-scatter leaves the result at the START of the buffer, not at
 *    this rank's slot. So the sum lands in a scratch shard and is moved into the slot
 *    when the request completes.
 *  - Open MPI does not progress non-blocking collectives in the background; progress()
 *    tests every outstanding request, and the runtime calls it at layer boundaries.
 *  - bf16 travels as MPI_UINT16_T with a user-defined sum (round to nearest even).
 *  - MPI has no average: ZERO1_AVG sums as ZERO1_SUM does, into scratch, and the pass that
 *    moves the result into the caller's region multiplies by 1/size (bf16: in fp32, then
 *    rounded once); an averaging all-reduce therefore reduces out of place.
 *  - all_to_all_v is MPI_Ialltoallv: direct, straight between the caller's buffers;
 *    staged, from the staged copy of send into scratch, copied into recv when it completes.
 *    Its int counts and displacements live in the request's slot until it completes.
 * Ordering (zero1/comm.h): before posting, the host waits until the compute stream has
 * produced the buffer (direct: a sync of the compute stream; staged: the copy to host is
 * queued on this communicator's stream after an event on the compute stream, then synced).
 * Staged results go back on the communicator's stream, and wait() orders the compute stream
 * after that copy with an event; a slot's host buffers are reused only once it has run.
 * wait() polls MPI_Test under the communicator's deadline (run/watchdog.h) instead of
 * blocking in MPI_Wait, so that a rank that stopped ends the job instead of hanging it.
 * Errors (MPI's, a count over MPI's int) end the program (fatal), naming the collective.
 */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>

#include "llmc/bf16.h"
#include "run/files.h"
#include "zero1/comm.h"
#include "run/mpi_wait.h"
#include "run/watchdog.h"

enum { SLOT_FREE = 0, SLOT_ACTIVE, SLOT_DONE };
// A slot's op: a Zero1Collective, or the blocking all-gather of host metadata.
enum { OP_HOST_ALL_GATHER = ZERO1_ALL_TO_ALL + 1 };

typedef struct {
    int state;
    MPI_Request request;
    int op, bucket;           // for the timeout message
    void* buf;                // the caller's (device) buffer
    size_t result_offset;     // bytes into buf where the result region starts
    size_t result_bytes;
    Zero1Dtype type;
    float scale;              // applied while the result is moved (ZERO1_AVG); 1: a plain move
    void* result;             // host memory holding the result: scratch, staged, or buf itself
    void* scratch;            // host: reduce-scatter output
    size_t scratch_cap;
    void* staged;             // page-locked host copy of buf (staged mode)
    size_t staged_cap;
    Zero1Event done;          // staged: the copy back into buf is queued before this
    int copy_back_pending;    // staged: done recorded, host buffers busy until it completes
    int* v_arrays;            // all_to_all_v: MPI's int counts and displacements
    int v_cap;
} RequestSlot;

typedef struct {
    MPI_Comm comm;
    const Zero1Device* dev;
    int staged;               // device memory is not host-addressable
    Zero1Stream stream;       // staged copies
    Zero1Event produced;      // compute stream -> communicator stream
    RequestSlot* slots;
    int num_slots;
    MPI_Op bf16_sum;
} MpiImpl;

static void mpi_fail(int status, const char* what) {
    if (status != MPI_SUCCESS) fatal("MPI %s failed with error %d", what, status);
}

static void bf16_sum_op(void* in, void* inout, int* len, MPI_Datatype* type) {
    const uint16_t* a = (const uint16_t*)in;
    uint16_t* b = (uint16_t*)inout;
    for (int i = 0; i < *len; i++) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

static MPI_Datatype mpi_type(Zero1Dtype t) {
    return t == ZERO1_FP64 ? MPI_DOUBLE : t == ZERO1_FP32 ? MPI_FLOAT : MPI_UINT16_T;
}

static MPI_Op mpi_sum(MpiImpl* m, Zero1Dtype t) { return t == ZERO1_BF16 ? m->bf16_sum : MPI_SUM; }

static void* grow(MpiImpl* m, void* p, size_t* cap, size_t bytes, int page_locked) {
    if (*cap >= bytes) return p;
    const Zero1DeviceOps* ops = m->dev->ops;
    if (p) page_locked ? ops->free_host(m->dev->ctx, p) : free(p);
    *cap = bytes;
    return page_locked ? ops->alloc_host(m->dev->ctx, bytes) : mallocCheck(bytes);
}

// A free slot whose host buffers are no longer read by a queued copy.
static RequestSlot* take_slot(MpiImpl* m, int* index) {
    int i = 0;
    while (i < m->num_slots && m->slots[i].state != SLOT_FREE) i++;
    if (i == m->num_slots) {
        int n = m->num_slots ? 2 * m->num_slots : 16;
        m->slots = (RequestSlot*)realloc(m->slots, n * sizeof(RequestSlot));
        if (!m->slots) fatal("out of memory growing the MPI request table");
        memset(m->slots + m->num_slots, 0, (n - m->num_slots) * sizeof(RequestSlot));
        for (int k = m->num_slots; k < n && m->staged; k++) m->slots[k].done = m->dev->ops->event_create(m->dev->ctx);
        m->num_slots = n;
    }
    RequestSlot* s = &m->slots[i];
    if (s->copy_back_pending) m->dev->ops->sync_event(m->dev->ctx, s->done);
    s->copy_back_pending = 0;
    *index = i;
    return s;
}

// Waits (host) until the compute stream has produced [offset, offset+bytes) of buf; in
// staged mode also brings that range into the slot's host copy. Returns the host address
// of buf's start for MPI.
static void* stage_in(MpiImpl* m, RequestSlot* s, void* buf, size_t total_bytes, size_t offset, size_t bytes) {
    const Zero1DeviceOps* ops = m->dev->ops;
    if (!m->staged) {
        ops->sync_stream(m->dev->ctx, m->dev->compute);
        return buf;
    }
    s->staged = grow(m, s->staged, &s->staged_cap, total_bytes, 1);
    ops->record(m->dev->ctx, m->produced, m->dev->compute);
    ops->wait_event(m->dev->ctx, m->stream, m->produced);
    if (bytes) ops->to_host(m->dev->ctx, m->stream, (char*)s->staged + offset, (const char*)buf + offset, bytes);
    ops->sync_stream(m->dev->ctx, m->stream);
    return s->staged;
}

// dst = src * scale for n elements of t, in one pass (dst == src allowed). bf16 is scaled
// in fp32 and rounded once.
static void scale_into(void* dst, const void* src, size_t n, Zero1Dtype t, float scale) {
    if (t == ZERO1_FP64) {
        for (size_t i = 0; i < n; i++) ((double*)dst)[i] = ((const double*)src)[i] * (double)scale;
    } else if (t == ZERO1_FP32) {
        for (size_t i = 0; i < n; i++) ((float*)dst)[i] = ((const float*)src)[i] * scale;
    } else {
        const uint16_t* a = (const uint16_t*)src;
        for (size_t i = 0; i < n; i++) ((uint16_t*)dst)[i] = float_to_bf16(bf16_to_float(a[i]) * scale);
    }
}

// MPI finished the request: put the result region into the caller's buffer (scaled on
// the way for an average).
static void finish_slot(MpiImpl* m, RequestSlot* s) {
    void* dst = (char*)s->buf + s->result_offset;
    size_t n = s->result_bytes / zero1_dtype_size(s->type);
    if (s->scale != 1.0f && !m->staged) {
        scale_into(dst, s->result, n, s->type, s->scale);
    } else if (s->scale != 1.0f) {
        scale_into(s->result, s->result, n, s->type, s->scale);  // host memory, before the copy back
    }
    if (m->staged) {
        const Zero1DeviceOps* ops = m->dev->ops;
        if (s->result_bytes) ops->from_host(m->dev->ctx, m->stream, dst, s->result, s->result_bytes);
        ops->record(m->dev->ctx, s->done, m->stream);
        s->copy_back_pending = 1;
    } else if (s->result != dst && s->result_bytes && s->scale == 1.0f) {
        memcpy(dst, s->result, s->result_bytes);
    }
    s->state = SLOT_DONE;
}

static int count_of(size_t n) {
    if (n > INT_MAX) fatal("zero1: a collective of %zu elements exceeds MPI's int count; use smaller buckets", n);
    return (int)n;
}

static Zero1Handle mpi_collective(Zero1Comm* c, Zero1Collective op, void* buf, size_t n, Zero1Dtype t,
                                  Zero1ReduceOp rop, int bucket) {
    MpiImpl* m = (MpiImpl*)c->impl;
    int h;
    RequestSlot* s = take_slot(m, &h);
    s->bucket = bucket;
    size_t elem = zero1_dtype_size(t), total = n * elem, slot = n / (size_t)c->size, slot_bytes = slot * elem;
    size_t mine = (size_t)c->rank * slot_bytes;
    s->buf = buf;
    s->state = SLOT_ACTIVE;
    s->op = op;
    s->type = t;
    s->scale = rop == ZERO1_AVG ? zero1_avg_scale(c->size) : 1.0f;
    if (op == ZERO1_REDUCE_SCATTER) {
        void* host = stage_in(m, s, buf, total, 0, total);
        s->scratch = grow(m, s->scratch, &s->scratch_cap, slot_bytes, m->staged);
        s->result = s->scratch;
        s->result_offset = mine;
        s->result_bytes = slot_bytes;
        mpi_fail(MPI_Ireduce_scatter_block(host, s->scratch, count_of(slot), mpi_type(t), mpi_sum(m, t), m->comm,
                                           &s->request),
                 "Ireduce_scatter_block");
    } else if (op == ZERO1_ALL_GATHER) {
        void* host = stage_in(m, s, buf, total, mine, slot_bytes);  // only this rank's slot is read
        s->result = host;
        s->result_offset = 0;
        s->result_bytes = total;
        mpi_fail(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host, count_of(slot), mpi_type(t), m->comm,
                                &s->request),
                 "Iallgather");
    } else if (s->scale == 1.0f) {
        void* host = stage_in(m, s, buf, total, 0, total);
        s->result = host;
        s->result_offset = 0;
        s->result_bytes = total;
        mpi_fail(MPI_Iallreduce(MPI_IN_PLACE, host, count_of(n), mpi_type(t), mpi_sum(m, t), m->comm, &s->request),
                 "Iallreduce");
    } else {  // an average: the sum lands in scratch, scaled on its way back into buf
        void* host = stage_in(m, s, buf, total, 0, total);
        s->scratch = grow(m, s->scratch, &s->scratch_cap, total, m->staged);
        s->result = s->scratch;
        s->result_offset = 0;
        s->result_bytes = total;
        mpi_fail(MPI_Iallreduce(host, s->scratch, count_of(n), mpi_type(t), mpi_sum(m, t), m->comm, &s->request),
                 "Iallreduce");
    }
    return h;
}

static void wait_request(Zero1Comm* c, RequestSlot* s);

// int counts and displacements for MPI's v-collectives, kept in the slot: MPI may read
// them until the request completes.
static int* int_arrays(RequestSlot* s, int size, const size_t* const x[4]) {
    if (s->v_cap < 4 * size) {
        free(s->v_arrays);
        s->v_arrays = (int*)mallocCheck(4 * (size_t)size * sizeof(int));
        s->v_cap = 4 * size;
    }
    for (int k = 0; k < 4; k++) {
        for (int r = 0; r < size; r++) s->v_arrays[k * size + r] = count_of(x[k][r]);
    }
    return s->v_arrays;
}

// Ialltoallv: the send region is staged in whole (staged mode), the result is the recv
// region, received into host scratch (staged) or straight into recv (direct).
static Zero1Handle mpi_all_to_all_v(Zero1Comm* c, const void* send, const size_t* send_counts,
                                    const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                    const size_t* recv_offsets, Zero1Dtype t, int bucket) {
    MpiImpl* m = (MpiImpl*)c->impl;
    int h;
    RequestSlot* s = take_slot(m, &h);
    size_t elem = zero1_dtype_size(t);
    size_t send_bytes = zero1_extent(send_counts, send_offsets, c->size) * elem;
    size_t recv_bytes = zero1_extent(recv_counts, recv_offsets, c->size) * elem;
    s->bucket = bucket;
    s->buf = recv;
    s->state = SLOT_ACTIVE;
    s->op = ZERO1_ALL_TO_ALL;
    s->type = t;
    s->scale = 1.0f;
    void* host_send = stage_in(m, s, (void*)send, send_bytes, 0, send_bytes);
    s->result = recv;
    if (m->staged) s->result = s->scratch = grow(m, s->scratch, &s->scratch_cap, recv_bytes, 1);
    s->result_offset = 0;
    s->result_bytes = recv_bytes;
    const size_t* const arrays[4] = {send_counts, send_offsets, recv_counts, recv_offsets};
    int* v = int_arrays(s, c->size, arrays);
    int n = c->size;
    mpi_fail(MPI_Ialltoallv(host_send, v, v + n, mpi_type(t), s->result, v + 2 * n, v + 3 * n, mpi_type(t), m->comm,
                            &s->request),
             "Ialltoallv");
    return h;
}

// Blocking, host memory only; polled under the deadline like every other wait.
static void mpi_host_all_gather(Zero1Comm* c, const void* mine, void* all, size_t bytes) {
    MpiImpl* m = (MpiImpl*)c->impl;
    int h;
    RequestSlot* s = take_slot(m, &h);
    s->op = OP_HOST_ALL_GATHER;
    s->bucket = ZERO1_LABEL_NONE;
    s->state = SLOT_ACTIVE;
    mpi_fail(MPI_Iallgather(mine, count_of(bytes), MPI_BYTE, all, count_of(bytes), MPI_BYTE, m->comm, &s->request),
             "Iallgather");
    wait_request(c, s);
    s->state = SLOT_FREE;
}

// The handle is finished: the compute stream is ordered after the result, the slot freed.
static void release(MpiImpl* m, RequestSlot* s) {
    if (m->staged) m->dev->ops->wait_event(m->dev->ctx, m->dev->compute, s->done);
    s->state = SLOT_FREE;
}

static void abort_world(void) { MPI_Abort(MPI_COMM_WORLD, 1); }

typedef struct {
    Zero1Comm* c;
    RequestSlot* s;
} PendingRequest;

// 1 when the slot's MPI request has completed (it never blocks).
static int request_complete(RequestSlot* s) {
    int done = 0;
    mpi_fail(MPI_Test(&s->request, &done, MPI_STATUS_IGNORE), "Test");
    return done;
}

static int request_done(void* ctx) { return request_complete(((PendingRequest*)ctx)->s); }

static const char* describe_request(void* ctx, char* buf, size_t n) {
    PendingRequest* p = (PendingRequest*)ctx;
    int op = p->s->op;
    const char* kind =
        op == OP_HOST_ALL_GATHER ? "all-gather of host metadata" : zero1_collective_name((Zero1Collective)op);
    return zero1_describe_collective(p->c, kind, p->s->bucket, buf, n);
}

// MPI_Wait with the communicator's deadline.
static void wait_request(Zero1Comm* c, RequestSlot* s) {
    PendingRequest p = {c, s};
    watchdog_poll_until(request_done, &p, c->timeout_s, describe_request, abort_world);
}

static void mpi_wait(Zero1Comm* c, Zero1Handle h) {
    if (h < 0) return;
    MpiImpl* m = (MpiImpl*)c->impl;
    RequestSlot* s = &m->slots[h];
    if (s->state == SLOT_ACTIVE) {
        wait_request(c, s);
        finish_slot(m, s);
    }
    release(m, s);
}

static int mpi_test(Zero1Comm* c, Zero1Handle h) {
    if (h < 0) return 1;
    MpiImpl* m = (MpiImpl*)c->impl;
    RequestSlot* s = &m->slots[h];
    if (s->state == SLOT_ACTIVE) {
        if (!request_complete(s)) return 0;
        finish_slot(m, s);
    }
    release(m, s);
    return 1;
}

static void mpi_progress(Zero1Comm* c) {
    MpiImpl* m = (MpiImpl*)c->impl;
    for (int i = 0; i < m->num_slots; i++) {
        RequestSlot* s = &m->slots[i];
        if (s->state == SLOT_ACTIVE && request_complete(s)) finish_slot(m, s);
    }
}

static void mpi_destroy(Zero1Comm* c) {
    MpiImpl* m = (MpiImpl*)c->impl;
    const Zero1DeviceOps* ops = m->dev->ops;
    for (int i = 0; i < m->num_slots; i++) {
        RequestSlot* s = &m->slots[i];
        if (s->state == SLOT_ACTIVE) wait_request(c, s);
        if (m->staged) {
            if (s->copy_back_pending) ops->sync_event(m->dev->ctx, s->done);
            ops->event_destroy(m->dev->ctx, s->done);
            if (s->staged) ops->free_host(m->dev->ctx, s->staged);
            if (s->scratch) ops->free_host(m->dev->ctx, s->scratch);
        } else {
            free(s->scratch);
        }
        free(s->v_arrays);
    }
    if (m->staged) {
        ops->event_destroy(m->dev->ctx, m->produced);
        ops->stream_destroy(m->dev->ctx, m->stream);
    }
    free(m->slots);
    MPI_Op_free(&m->bf16_sum);
    if (m->comm != MPI_COMM_WORLD) mpiDeadline("zero1 mpi: MPI_Comm_free of the instance communicator", MPI_Comm_free(&m->comm));
    free(m);
}

// No groups (MPI has no fused launch: each collective is posted as it comes) and no abort
// (its waits block the host, and the job's end stops them).
static const Zero1CommOps mpi_ops = {.collective = mpi_collective, .all_to_all_v = mpi_all_to_all_v,
                                     .host_all_gather = mpi_host_all_gather, .wait = mpi_wait, .test = mpi_test,
                                     .progress = mpi_progress, .destroy = mpi_destroy};

Zero1Comm* zero1_comm_mpi_create(const Zero1Device* dev, int color) {
    MpiImpl* m = (MpiImpl*)callocCheck(1, sizeof(MpiImpl));
    m->comm = MPI_COMM_WORLD;
    if (color >= 0) {
        int world_rank;
        mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
        mpiDeadline("zero1 mpi: the instances' MPI_Comm_split", MPI_Comm_split(MPI_COMM_WORLD, color, world_rank, &m->comm));
    }
    int rank, size;
    mpiCheck(MPI_Comm_rank(m->comm, &rank));
    mpiCheck(MPI_Comm_size(m->comm, &size));
    mpi_fail(MPI_Op_create(bf16_sum_op, 1, &m->bf16_sum), "Op_create");
    m->dev = dev;
    m->staged = !dev->ops->host_addressable;
    if (m->staged) {
        m->stream = dev->ops->stream_create(dev->ctx);
        m->produced = dev->ops->event_create(dev->ctx);
    }
    Zero1Comm* c = zero1_comm_new(&mpi_ops, m, rank, size, m->staged ? "mpi-staged" : "mpi");
    c->timeout_s = WATCHDOG_DEFAULT_TIMEOUT_S;
    return c;
}
