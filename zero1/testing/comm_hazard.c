/*
 * zero1/testing/comm_hazard.c: a test communicator around a real one (inner) that makes comm.h's
 * "in flight" rule bite. For each collective it queues on the compute stream a copy of the
 * caller's region into a private snapshot, then fills the region with 0xFF bytes (NaN in
 * every Zero1Dtype), and runs the inner collective on the snapshot. The result is copied
 * back only when the handle is finished (wait, or a test that returns 1), queued on the
 * compute stream after the inner wait has ordered it. So whatever reads the region while
 * in flight, from the host or from the device, reads NaN; a reduce-scatter publishes only
 * this rank's slot, so its unspecified rest stays NaN too. test() answers "not yet" at
 * random (seeded), so code that assumes an early completion is exercised.
 *
 * The inner collectives are issued at once and in call order, as MPI requires of every
 * rank; the hazard never reorders or postpones them. It also holds the runtime to the
 * group rule: a handle issued inside group_begin/group_end is not waited for before
 * group_end (an error), and test() answers 0 for it until then.
 *
 * all_to_all_v has two regions: both are snapshotted and poisoned (the recv region gets
 * its result and the send region its own bytes back when the handle is finished).
 * host_all_gather moves host memory only and is passed through, as are progress and
 * abort (the deadline aborts the communicator it wraps: zero1/watchdog_cuda.h).
 * A broken rule ends the program (fatal), naming the collective and the step.
 */
#include <stdint.h>
#include <stdio.h>

#include "run/files.h"
#include "zero1/testing/test_doubles.h"

// One collective in flight; a free slot keeps its snapshot for the next one.
typedef struct {
    int in_flight;
    int in_open_group;     // issued inside a group that has not ended yet
    Zero1Handle inner;
    Zero1Collective kind;
    int bucket;
    char* buf;             // the caller's region (device memory)
    size_t bytes;
    void* snapshot;        // device memory, snapshot_cap bytes
    size_t snapshot_cap;
    char* send;            // all_to_all_v: the send region and its snapshot (buf is recv)
    size_t send_bytes;
    void* send_snapshot;
    size_t send_snapshot_cap;
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

// Device memory of at least bytes, kept in the slot for the next collective.
static void* ensure(Hazard* h, void** p, size_t* cap, size_t bytes) {
    if (*cap < bytes) {
        h->dev->ops->free(h->dev->ctx, *p);
        *p = h->dev->ops->alloc(h->dev->ctx, bytes);
        *cap = bytes;
    }
    return *p;
}

// The caller's bytes at buf go to the snapshot, queued on the compute stream; the region is
// poisoned behind the copy.
static void snapshot_and_poison(Hazard* h, void* snapshot, void* buf, size_t bytes) {
    const Zero1DeviceOps* ops = h->dev->ops;
    if (bytes == 0) return;
    ops->copy(h->dev->ctx, h->dev->compute, snapshot, buf, bytes);
    ops->fill(h->dev->ctx, h->dev->compute, buf, 0xFF, bytes);
}

static HazardSlot* start_slot(Hazard* h, Zero1Collective kind, void* buf, size_t bytes, int bucket, int* index) {
    int i = take_slot(h);
    HazardSlot* s = &h->slots[i];
    ensure(h, &s->snapshot, &s->snapshot_cap, bytes);
    s->in_flight = 1;
    s->in_open_group = h->in_group;
    s->kind = kind;
    s->bucket = bucket;
    s->buf = (char*)buf;
    s->bytes = bytes;
    s->send_bytes = 0;
    *index = i;
    return s;
}

static Zero1Handle hazard_collective(Zero1Comm* c, Zero1Collective kind, void* buf, size_t n, Zero1Dtype t,
                                     Zero1ReduceOp op, int bucket) {
    Hazard* h = hazard_of(c);
    int i;
    size_t bytes = n * zero1_dtype_size(t);
    HazardSlot* s = start_slot(h, kind, buf, bytes, bucket, &i);
    // The caller's data, as ordering-in defines it, goes to the snapshot; the region is
    // poisoned behind it; the inner collective's own ordering-in sees the copied snapshot.
    snapshot_and_poison(h, s->snapshot, buf, bytes);
    s->inner = h->inner->ops->collective(h->inner, kind, s->snapshot, n, t, op, bucket);
    return i;
}

static Zero1Handle hazard_all_to_all_v(Zero1Comm* c, const void* send, const size_t* send_counts,
                                       const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                       const size_t* recv_offsets, Zero1Dtype t, int bucket) {
    Hazard* h = hazard_of(c);
    int i;
    size_t e = zero1_dtype_size(t);
    size_t recv_bytes = zero1_extent(recv_counts, recv_offsets, c->size) * e;
    HazardSlot* s = start_slot(h, ZERO1_ALL_TO_ALL, recv, recv_bytes, bucket, &i);
    s->send = (char*)send;
    s->send_bytes = zero1_extent(send_counts, send_offsets, c->size) * e;
    ensure(h, &s->send_snapshot, &s->send_snapshot_cap, s->send_bytes);
    snapshot_and_poison(h, s->send_snapshot, s->send, s->send_bytes);
    snapshot_and_poison(h, s->snapshot, recv, recv_bytes);
    s->inner = zero1_comm_all_to_all_v(h->inner, s->send_snapshot, send_counts, send_offsets, s->snapshot, recv_counts,
                                      recv_offsets, t, bucket);
    return i;
}

static void hazard_host_all_gather(Zero1Comm* c, const void* mine, void* all, size_t bytes) {
    Hazard* h = hazard_of(c);
    zero1_comm_host_all_gather(h->inner, mine, all, bytes);
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
    if (s->kind == ZERO1_REDUCE_SCATTER) {
        bytes = s->bytes / (size_t)h->inner->size;
        offset = (size_t)h->inner->rank * bytes;
    }
    if (bytes) h->dev->ops->copy(h->dev->ctx, h->dev->compute, s->buf + offset, (char*)s->snapshot + offset, bytes);
    if (s->send_bytes) h->dev->ops->copy(h->dev->ctx, h->dev->compute, s->send, s->send_snapshot, s->send_bytes);
    s->in_flight = 0;
}

static void hazard_wait(Zero1Comm* c, Zero1Handle handle) {
    if (handle < 0) return;
    Hazard* h = hazard_of(c);
    HazardSlot* s = in_flight_slot(h, handle, "wait");
    if (s->in_open_group)
        fatal("hazard communicator: wait for the %s of bucket %d at step %d inside its group (before group_end)",
              zero1_collective_name(s->kind), s->bucket, c->step);
    zero1_comm_wait(h->inner, s->inner);
    publish(h, s);
}

static int hazard_test(Zero1Comm* c, Zero1Handle handle) {
    if (handle < 0) return 1;
    Hazard* h = hazard_of(c);
    HazardSlot* s = in_flight_slot(h, handle, "test");
    if (s->in_open_group) return 0;
    if (splitmix64(&h->rng) >> 63) return 0;  // "not yet", whatever the inner would say
    if (!zero1_comm_test(h->inner, s->inner)) return 0;
    publish(h, s);
    return 1;
}

static void hazard_progress(Zero1Comm* c) { zero1_comm_progress(hazard_of(c)->inner); }
static int hazard_abort(Zero1Comm* c) { return zero1_comm_abort(hazard_of(c)->inner); }
static void hazard_group_begin(Zero1Comm* c) {
    Hazard* h = hazard_of(c);
    if (h->in_group) fatal("hazard communicator: group_begin inside a group at step %d (groups do not nest)", c->step);
    h->in_group = 1;
    zero1_comm_group_begin(h->inner);
}
static void hazard_group_end(Zero1Comm* c) {
    Hazard* h = hazard_of(c);
    if (!h->in_group) fatal("hazard communicator: group_end without group_begin at step %d", c->step);
    h->in_group = 0;
    for (int i = 0; i < h->num_slots; i++) h->slots[i].in_open_group = 0;
    zero1_comm_group_end(h->inner);
}

static void hazard_destroy(Zero1Comm* c) {
    Hazard* h = (Hazard*)c->impl;
    zero1_comm_destroy(h->inner);  // first: it may still be using snapshots
    for (int i = 0; i < h->num_slots; i++) {
        h->dev->ops->free(h->dev->ctx, h->slots[i].snapshot);
        h->dev->ops->free(h->dev->ctx, h->slots[i].send_snapshot);
    }
    free(h->slots);
    free(h);
}

static const Zero1CommOps hazard_ops = {
    .collective = hazard_collective, .all_to_all_v = hazard_all_to_all_v, .host_all_gather = hazard_host_all_gather,
    .wait = hazard_wait, .test = hazard_test, .progress = hazard_progress, .group_begin = hazard_group_begin,
    .group_end = hazard_group_end, .abort = hazard_abort, .destroy = hazard_destroy};

Zero1Comm* zero1_comm_hazard_create(Zero1Comm* inner, const Zero1Device* dev, unsigned seed) {
    Hazard* h = (Hazard*)callocCheck(1, sizeof(Hazard));
    h->inner = inner;
    h->dev = dev;
    // Each rank its own sequence of answers, reproducible from the seed.
    h->rng = ((uint64_t)seed << 32) ^ (uint64_t)(unsigned)inner->rank;
    snprintf(h->name, sizeof(h->name), "hazard(%s)", inner->name);
    Zero1Comm* c = zero1_comm_new(&hazard_ops, h, inner->rank, inner->size, h->name);
    c->traces_itself = inner->traces_itself;
    c->issue_order_matters = inner->issue_order_matters;
    // The wrapper is what the runtime and the backends see: it carries the inner one's
    // deadline and label (without them a hazard run would wait forever on a stopped rank).
    c->timeout_s = inner->timeout_s;
    c->label = inner->label;
    return c;
}
