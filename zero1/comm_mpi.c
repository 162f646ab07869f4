/*
 * The MPI communicator: non-blocking collectives on MPI_COMM_WORLD, for CPU buffers.
 *
 * Two MPI details shape this file:
 *  - MPI's in-place reduce-scatter leaves the result at the START of the buffer, not at
 *    this rank's slot. So the sum lands in a scratch shard and is copied into the slot
 *    when the request completes (in wait, test or progress).
 *  - Open MPI does not progress non-blocking collectives in the background; progress()
 *    tests every outstanding request, and the runtime calls it at layer boundaries.
 * bf16 travels as MPI_UINT16_T with a user-defined sum (round to nearest even).
 */
#include <mpi.h>
#include <stdint.h>

#include "llmc/bf16.h"
#include "llmc/utils.h"
#include "zero1/comm.h"

enum { SLOT_FREE = 0, SLOT_ACTIVE, SLOT_DONE };

typedef struct {
    int state;
    MPI_Request request;
    void* scratch;        // reduce-scatter result, copied to dst on completion
    size_t scratch_cap;
    void* dst;
    size_t copy_bytes;
} RequestSlot;

typedef struct {
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

static int take_slot(MpiImpl* m) {
    for (int i = 0; i < m->num_slots; i++) {
        if (m->slots[i].state == SLOT_FREE) return i;
    }
    int n = m->num_slots ? 2 * m->num_slots : 16;
    m->slots = (RequestSlot*)realloc(m->slots, n * sizeof(RequestSlot));
    if (!m->slots) fatal("out of memory growing the MPI request table");
    memset(m->slots + m->num_slots, 0, (n - m->num_slots) * sizeof(RequestSlot));
    int first = m->num_slots;
    m->num_slots = n;
    return first;
}

static void finish_slot(RequestSlot* s) {
    if (s->dst) memcpy(s->dst, s->scratch, s->copy_bytes);
    s->state = SLOT_DONE;
}

static Zero1Handle mpi_reduce_scatter(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t) {
    MpiImpl* m = (MpiImpl*)c->impl;
    int h = take_slot(m);
    RequestSlot* s = &m->slots[h];
    size_t slot_elems = n / (size_t)c->size, bytes = slot_elems * zero1_dtype_size(t);
    if (s->scratch_cap < bytes) {
        free(s->scratch);
        s->scratch = mallocCheck(bytes);
        s->scratch_cap = bytes;
    }
    s->dst = (char*)buf + (size_t)c->rank * bytes;
    s->copy_bytes = bytes;
    s->state = SLOT_ACTIVE;
    mpi_fail(MPI_Ireduce_scatter_block(buf, s->scratch, (int)slot_elems, mpi_type(t), mpi_sum(m, t), MPI_COMM_WORLD,
                                       &s->request),
             "Ireduce_scatter_block");
    return h;
}

static Zero1Handle mpi_all_gather(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t) {
    MpiImpl* m = (MpiImpl*)c->impl;
    int h = take_slot(m);
    RequestSlot* s = &m->slots[h];
    s->dst = NULL;
    s->state = SLOT_ACTIVE;
    mpi_fail(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)(n / (size_t)c->size), mpi_type(t),
                            MPI_COMM_WORLD, &s->request),
             "Iallgather");
    return h;
}

static Zero1Handle mpi_all_reduce(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t) {
    MpiImpl* m = (MpiImpl*)c->impl;
    int h = take_slot(m);
    RequestSlot* s = &m->slots[h];
    s->dst = NULL;
    s->state = SLOT_ACTIVE;
    mpi_fail(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(t), mpi_sum(m, t), MPI_COMM_WORLD, &s->request),
             "Iallreduce");
    return h;
}

static void mpi_wait(Zero1Comm* c, Zero1Handle h) {
    if (h < 0) return;
    RequestSlot* s = &((MpiImpl*)c->impl)->slots[h];
    if (s->state == SLOT_ACTIVE) {
        mpi_fail(MPI_Wait(&s->request, MPI_STATUS_IGNORE), "Wait");
        finish_slot(s);
    }
    s->state = SLOT_FREE;
}

static int mpi_test(Zero1Comm* c, Zero1Handle h) {
    if (h < 0) return 1;
    RequestSlot* s = &((MpiImpl*)c->impl)->slots[h];
    if (s->state == SLOT_ACTIVE) {
        int done = 0;
        mpi_fail(MPI_Test(&s->request, &done, MPI_STATUS_IGNORE), "Test");
        if (!done) return 0;
        finish_slot(s);
    }
    s->state = SLOT_FREE;
    return 1;
}

static void mpi_progress(Zero1Comm* c) {
    MpiImpl* m = (MpiImpl*)c->impl;
    for (int i = 0; i < m->num_slots; i++) {
        RequestSlot* s = &m->slots[i];
        if (s->state != SLOT_ACTIVE) continue;
        int done = 0;
        mpi_fail(MPI_Test(&s->request, &done, MPI_STATUS_IGNORE), "Test");
        if (done) finish_slot(s);
    }
}

static void mpi_destroy(Zero1Comm* c) {
    MpiImpl* m = (MpiImpl*)c->impl;
    for (int i = 0; i < m->num_slots; i++) {
        if (m->slots[i].state == SLOT_ACTIVE) MPI_Wait(&m->slots[i].request, MPI_STATUS_IGNORE);
        free(m->slots[i].scratch);
    }
    free(m->slots);
    MPI_Op_free(&m->bf16_sum);
    free(m);
    free(c);
}

Zero1Comm* zero1_comm_mpi_create(void) {
    Zero1Comm* c = (Zero1Comm*)callocCheck(1, sizeof(Zero1Comm));
    MpiImpl* m = (MpiImpl*)callocCheck(1, sizeof(MpiImpl));
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    mpi_fail(MPI_Op_create(bf16_sum_op, 1, &m->bf16_sum), "Op_create");
    c->name = "mpi";
    c->impl = m;
    c->reduce_scatter = mpi_reduce_scatter;
    c->all_gather = mpi_all_gather;
    c->all_reduce = mpi_all_reduce;
    c->wait = mpi_wait;
    c->test = mpi_test;
    c->progress = mpi_progress;
    c->destroy = mpi_destroy;
    return c;
}
