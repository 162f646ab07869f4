/*
 * zero1/comm_hazard.c: a test communicator around a real one (inner) that makes comm.h's
 * "in flight" rule bite. For each collective it queues on the compute stream a copy of the
 * caller's region into a private snapshot, then fills the region with 0xFF bytes (NaN in
 * every Zero1Dtype), and runs the inner collective on the snapshot. The result is copied
 * back only when the handle is finished (wait, or a test that returns 1), queued on the
 * compute stream after the inner wait has ordered it. So whatever reads the region while
 * in flight, from the host or from the device, reads NaN; a reduce-scatter publishes only
 * this rank's slot, so its unspecified rest stays NaN too. An all_to_all poisons both its
 * send and its recv region: the snapshot holds the send data followed by room for the
 * received slices, and when finished send gets its data back and recv the slices. test() answers "not yet" at
 * random (seeded), so code that assumes an early completion is exercised.
 *
 * The inner collectives are issued at once and in call order, as MPI requires of every
 * rank; the hazard never reorders or postpones them. It also holds the runtime to the
 * group rule: a handle issued inside group_begin/group_end is not waited for before
 * group_end (an error), and test() answers 0 for it until then.
 */
#include <stdint.h>
#include <stdio.h>

#include "llmc/utils.h"
#include "zero1/comm.h"

typedef enum { REDUCE_SCATTER, ALL_GATHER, ALL_REDUCE, ALL_TO_ALL } CollectiveKind;

// One collective in flight; a free slot keeps its snapshot for the next one.
typedef struct {
    int in_flight;
    int in_open_group;     // issued inside a group that has not ended yet
    Zero1Handle inner;
    CollectiveKind kind;
    int bucket;
    char* buf;             // the caller's region (device memory); all_to_all: its send region
    char* recv;            // all_to_all: the recv region (bytes long too), else NULL
    size_t bytes;
    void* snapshot;        // device memory, snapshot_cap bytes
    size_t snapshot_cap;
} HazardSlot;

typedef struct {
    Zero1Comm* inner;
    const Zero1Device* dev;
    uint64_t rng;
    HazardSlot* slots;
    int num_slots;
    int in_group;
    char name[64];
} Hazard;

static const char* const KIND_NAMES[4] = {"reduce-scatter", "all-gather", "all-reduce", "all-to-all"};

static uint64_t splitmix64(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static Hazard* hazard_of(Zero1Comm* c) {
    Hazard* h = (Hazard*)c->impl;
    h->inner->step = c->step;  // the runtime sets these on this communicator
    h->inner->tracer = c->tracer;
    return h;
}

static int take_slot(Hazard* h) {
    for (int i = 0; i < h->num_slots; i++) {
        if (!h->slots[i].in_flight) return i;
    }
    int n = h->num_slots ? 2 * h->num_slots : 8;
    h->slots = (HazardSlot*)realloc(h->slots, (size_t)n * sizeof(HazardSlot));
    if (!h->slots) fatal("hazard communicator: out of memory");
    memset(h->slots + h->num_slots, 0, (size_t)(n - h->num_slots) * sizeof(HazardSlot));
    int first = h->num_slots;
    h->num_slots = n;
    return first;
}

// A slot for a collective over `bytes` of buf (and as many of recv, for all_to_all): the
// caller's data, as ordering-in defines it, goes to the snapshot, and its regions are
// poisoned behind it; the inner collective's own ordering-in sees the copied snapshot.
static HazardSlot* begin_slot(Hazard* h, CollectiveKind kind, void* buf, void* recv, size_t bytes, int bucket,
                              int* index) {
    const Zero1DeviceOps* ops = h->dev->ops;
    *index = take_slot(h);
    HazardSlot* s = &h->slots[*index];
    size_t need = recv ? 2 * bytes : bytes;
    if (s->snapshot_cap < need) {
        ops->free(h->dev->ctx, s->snapshot);
        s->snapshot = ops->alloc(h->dev->ctx, need);
        s->snapshot_cap = need;
    }
    s->in_flight = 1;
    s->in_open_group = h->in_group;
    s->kind = kind;
    s->bucket = bucket;
    s->buf = (char*)buf;
    s->recv = (char*)recv;
    s->bytes = bytes;
    ops->copy(h->dev->ctx, h->dev->compute, s->snapshot, buf, bytes);
    ops->fill(h->dev->ctx, h->dev->compute, buf, 0xFF, bytes);
    if (recv) ops->fill(h->dev->ctx, h->dev->compute, recv, 0xFF, bytes);
    return s;
}

static Zero1Handle issue(Zero1Comm* c, CollectiveKind kind, void* buf, size_t n, Zero1Dtype t, Zero1ReduceOp op,
                         int bucket) {
    Hazard* h = hazard_of(c);
    int i;
    HazardSlot* s = begin_slot(h, kind, buf, NULL, n * zero1_dtype_size(t), bucket, &i);
    Zero1Comm* inner = h->inner;
    if (kind == REDUCE_SCATTER) s->inner = inner->reduce_scatter(inner, s->snapshot, n, t, op, bucket);
    else if (kind == ALL_GATHER) s->inner = inner->all_gather(inner, s->snapshot, n, t, bucket);
    else s->inner = inner->all_reduce(inner, s->snapshot, n, t, op, bucket);
    return i;
}

static Zero1Handle hazard_reduce_scatter(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, Zero1ReduceOp op,
                                         int bucket) {
    return issue(c, REDUCE_SCATTER, buf, n, t, op, bucket);
}
static Zero1Handle hazard_all_gather(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, int bucket) {
    return issue(c, ALL_GATHER, buf, n, t, ZERO1_SUM, bucket);
}
static Zero1Handle hazard_all_reduce(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, Zero1ReduceOp op, int bucket) {
    return issue(c, ALL_REDUCE, buf, n, t, op, bucket);
}
// The inner one moves the snapshot's send half into its recv half.
static Zero1Handle hazard_all_to_all(Zero1Comm* c, const void* send, void* recv, size_t n_per_rank, Zero1Dtype t,
                                     int bucket) {
    Hazard* h = hazard_of(c);
    int i;
    size_t bytes = (size_t)c->size * n_per_rank * zero1_dtype_size(t);
    HazardSlot* s = begin_slot(h, ALL_TO_ALL, (void*)send, recv, bytes, bucket, &i);
    s->inner = h->inner->all_to_all(h->inner, s->snapshot, (char*)s->snapshot + bytes, n_per_rank, t, bucket);
    return i;
}

static HazardSlot* in_flight_slot(Hazard* h, Zero1Handle handle, const char* what) {
    if (handle >= h->num_slots || !h->slots[handle].in_flight)
        fatal("hazard communicator: %s of handle %d, which is not in flight (finished already?)", what, handle);
    return &h->slots[handle];
}

// The inner collective has completed (in compute-stream order): the result appears in the
// caller's region, queued after that point. A reduce-scatter publishes only this rank's slot.
static void publish(Hazard* h, HazardSlot* s) {
    size_t offset = 0, bytes = s->bytes;
    if (s->kind == ALL_TO_ALL) {  // the received slices, and send as it was
        h->dev->ops->copy(h->dev->ctx, h->dev->compute, s->recv, (char*)s->snapshot + bytes, bytes);
    }
    if (s->kind == REDUCE_SCATTER) {
        bytes = s->bytes / (size_t)h->inner->size;
        offset = (size_t)h->inner->rank * bytes;
    }
    h->dev->ops->copy(h->dev->ctx, h->dev->compute, s->buf + offset, (char*)s->snapshot + offset, bytes);
    s->in_flight = 0;
}

static void hazard_wait(Zero1Comm* c, Zero1Handle handle) {
    if (handle < 0) return;
    Hazard* h = hazard_of(c);
    HazardSlot* s = in_flight_slot(h, handle, "wait");
    if (s->in_open_group)
        fatal("hazard communicator: wait for the %s of bucket %d at step %d inside its group (before group_end)",
              KIND_NAMES[s->kind], s->bucket, c->step);
    h->inner->wait(h->inner, s->inner);
    publish(h, s);
}

static int hazard_test(Zero1Comm* c, Zero1Handle handle) {
    if (handle < 0) return 1;
    Hazard* h = hazard_of(c);
    HazardSlot* s = in_flight_slot(h, handle, "test");
    if (s->in_open_group) return 0;
    if (splitmix64(&h->rng) >> 63) return 0;  // "not yet", whatever the inner would say
    if (!h->inner->test(h->inner, s->inner)) return 0;
    publish(h, s);
    return 1;
}

static void hazard_progress(Zero1Comm* c) {
    Hazard* h = hazard_of(c);
    h->inner->progress(h->inner);
}
static void hazard_group_begin(Zero1Comm* c) {
    Hazard* h = hazard_of(c);
    if (h->in_group) fatal("hazard communicator: group_begin inside a group at step %d (groups do not nest)", c->step);
    h->in_group = 1;
    h->inner->group_begin(h->inner);
}
static void hazard_group_end(Zero1Comm* c) {
    Hazard* h = hazard_of(c);
    if (!h->in_group) fatal("hazard communicator: group_end without group_begin at step %d", c->step);
    h->in_group = 0;
    for (int i = 0; i < h->num_slots; i++) h->slots[i].in_open_group = 0;
    h->inner->group_end(h->inner);
}

static void hazard_destroy(Zero1Comm* c) {
    Hazard* h = (Hazard*)c->impl;
    h->inner->destroy(h->inner);  // first: it may still be using snapshots
    for (int i = 0; i < h->num_slots; i++) h->dev->ops->free(h->dev->ctx, h->slots[i].snapshot);
    free(h->slots);
    free(h);
    free(c);
}

Zero1Comm* zero1_comm_hazard_create(Zero1Comm* inner, const Zero1Device* dev, unsigned seed) {
    Zero1Comm* c = (Zero1Comm*)callocCheck(1, sizeof(Zero1Comm));
    Hazard* h = (Hazard*)callocCheck(1, sizeof(Hazard));
    h->inner = inner;
    h->dev = dev;
    // Each rank its own sequence of answers, reproducible from the seed.
    h->rng = ((uint64_t)seed << 32) ^ (uint64_t)(unsigned)inner->rank;
    snprintf(h->name, sizeof(h->name), "hazard(%s)", inner->name);
    c->rank = inner->rank;
    c->size = inner->size;
    c->traces_itself = inner->traces_itself;
    c->issue_order_matters = inner->issue_order_matters;
    // The wrapper is what the runtime and the backends see: it carries the inner one's
    // deadline and label (without them a hazard run would wait forever on a stopped rank).
    c->timeout_s = inner->timeout_s;
    c->label = inner->label;
    c->name = h->name;
    c->impl = h;
    c->reduce_scatter = hazard_reduce_scatter;
    c->all_gather = hazard_all_gather;
    c->all_reduce = hazard_all_reduce;
    c->all_to_all = hazard_all_to_all;
    c->wait = hazard_wait;
    c->test = hazard_test;
    c->progress = hazard_progress;
    c->group_begin = hazard_group_begin;
    c->group_end = hazard_group_end;
    c->destroy = hazard_destroy;
    return c;
}
