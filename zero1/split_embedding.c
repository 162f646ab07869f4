/*
 * zero1/split_embedding.c: the tied embedding's gradient in two parts (--split-embedding).
 *
 * wte is read twice, by the encoder and by the classifier, so its gradient has two
 * contributions, and the classifier's is final at the very start of the backward while
 * the encoder's comes last. With the split, wte's bucket (a bucket of its own) fires on
 * the classifier's part alone, and the last micro-step's encoder part, which touches only
 * the rows of this rank's tokens, goes to the owners of those rows only:
 *
 *   1. zero1_embedding_rows (split_embedding_plan), before the encoder's backward: the
 *      distinct tokens U of this rank, sorted; one blocking host all-gather of every
 *      rank's U (counts, then ids); from that every rank plans the whole exchange on the
 *      host: what rank s sends owner o is the contiguous run of U_s whose rows
 *      [start + id*C, +C) intersect o's slot of the bucket (a row across two slots goes to
 *      both; each owner adds only its part). The model accumulates into compact rows (one
 *      per element of U) instead of dwte.
 *   2. The encoder's zero1_register_grad_ready (split_embedding_send): all_to_all_v of
 *      those runs (comm.h), straight out of the compact rows, since each run is contiguous
 *      there.
 *   3. Once the bucket's dense reduction and the exchange are both complete
 *      (split_embedding_add): add_rows (device_ops.h) sums, for each distinct id in this
 *      rank's slot, its received rows in source-rank order, in fp32, into the reduced
 *      shard. Then (instances) the shard's all-reduce across the groups.
 *
 * Earlier micro-steps accumulate their encoder part densely, as without the split:
 * nothing is in flight then. The optimizer's math is unchanged; the sum over ranks is
 * reassociated (classifier parts first, then encoder parts), so it agrees with the dense
 * path to fp32 rounding, not bitwise.
 * Errors end the program (fatal).
 */
#include "zero1/split_embedding.h"

#include <stdlib.h>

#include "run/files.h"
#include "zero1/ledger.h"

// Device buffers sized once for the worst case; the host arrays that are uploaded are
// page-locked and rewritten only after the upload event of the step before has completed.
struct SplitEmbedding {
    SplitEmbeddingShape shape;
    int max_recv_rows, max_adds;
    // This step's plan.
    int num_rows;                // this rank's distinct tokens
    size_t rows_sent;            // to other ranks, over all steps
    size_t *send_counts, *send_offsets, *recv_counts, *recv_offsets;  // host, per rank, elements
    Zero1RowPlan plan;           // the owner's add (device arrays)
    // Device memory.
    float* rows;                 // max_positions x width: the model's compact rows, sent from here
    float* recv;                 // max_recv_rows x width
    int* row_of_position;        // max_positions
    Zero1RowAdd* adds;           // max_adds
    int* sources;                // max_recv_rows
    // Host memory.
    int* host_row_of_position;   // page-locked, uploaded into row_of_position
    Zero1RowAdd* host_adds;      // page-locked
    int* host_sources;           // page-locked
    int* ids;                    // this rank's distinct tokens (max_positions)
    int* counts;                 // every rank's number of distinct tokens
    int* all_ids;                // every rank's, size x max_positions
    int* pairs;                  // scratch for sorting: (key, value) pairs
    Zero1Event uploaded;
    int upload_pending;
};

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

// Owner o's slot of the embedding's bucket, in buffer elements.
static void slot_of(const SplitEmbedding* sp, int size, int o, size_t* lo, size_t* hi) {
    const Zero1Range* bk = &sp->shape.bucket;
    size_t n = (bk->end - bk->start) / (size_t)size;
    *lo = bk->start + (size_t)o * n;
    *hi = *lo + n;
}

SplitEmbedding* split_embedding_create(const SplitEmbeddingShape* shape, const Zero1Comm* comm,
                                       const Zero1Device* dev) {
    SplitEmbedding* sp = (SplitEmbedding*)callocCheck(1, sizeof(SplitEmbedding));
    sp->shape = *shape;
    int size = comm->size, max_positions = shape->max_positions;
    size_t width = shape->width;
    size_t lo, hi;
    slot_of(sp, size, 0, &lo, &hi);
    // A slot meets at most its length / width + 2 rows; each source sends it at most
    // max_positions of them.
    size_t slot_rows = (hi - lo) / width + 2;
    sp->max_adds = (int)min_size(slot_rows, (size_t)size * max_positions);
    sp->max_recv_rows = (int)zero1_split_recv_rows(size, hi - lo, width, (uint64_t)max_positions);
    const Zero1DeviceOps* ops = dev->ops;
    void* c = dev->ctx;
    sp->rows = (float*)ops->alloc(c, (size_t)max_positions * width * sizeof(float));
    sp->recv = (float*)ops->alloc(c, (size_t)sp->max_recv_rows * width * sizeof(float));
    sp->row_of_position = (int*)ops->alloc(c, (size_t)max_positions * sizeof(int));
    sp->adds = (Zero1RowAdd*)ops->alloc(c, (size_t)sp->max_adds * sizeof(Zero1RowAdd));
    sp->sources = (int*)ops->alloc(c, (size_t)sp->max_recv_rows * sizeof(int));
    sp->host_row_of_position = (int*)ops->alloc_host(c, (size_t)max_positions * sizeof(int));
    sp->host_adds = (Zero1RowAdd*)ops->alloc_host(c, (size_t)sp->max_adds * sizeof(Zero1RowAdd));
    sp->host_sources = (int*)ops->alloc_host(c, (size_t)sp->max_recv_rows * sizeof(int));
    sp->ids = (int*)mallocCheck((size_t)max_positions * sizeof(int));
    sp->counts = (int*)mallocCheck((size_t)size * sizeof(int));
    sp->all_ids = (int*)mallocCheck((size_t)size * max_positions * sizeof(int));
    size_t max_pairs = max_size((size_t)max_positions, (size_t)sp->max_recv_rows);
    sp->pairs = (int*)mallocCheck(2 * max_pairs * sizeof(int));
    sp->send_counts = (size_t*)callocCheck(4 * (size_t)size, sizeof(size_t));
    sp->send_offsets = sp->send_counts + size;
    sp->recv_counts = sp->send_counts + 2 * size;
    sp->recv_offsets = sp->send_counts + 3 * size;
    sp->uploaded = ops->event_create(c);
    return sp;
}

void split_embedding_destroy(SplitEmbedding* sp, const Zero1Device* dev) {
    if (!sp) return;
    const Zero1DeviceOps* ops = dev->ops;
    void* device[] = {sp->rows, sp->recv, sp->row_of_position, sp->adds, sp->sources};
    for (size_t i = 0; i < sizeof(device) / sizeof(device[0]); i++) {
        if (device[i]) ops->free(dev->ctx, device[i]);
    }
    ops->free_host(dev->ctx, sp->host_row_of_position);
    ops->free_host(dev->ctx, sp->host_adds);
    ops->free_host(dev->ctx, sp->host_sources);
    ops->event_destroy(dev->ctx, sp->uploaded);
    free(sp->ids);
    free(sp->counts);
    free(sp->all_ids);
    free(sp->pairs);
    free(sp->send_counts);
    free(sp);
}

const SplitEmbeddingShape* split_embedding_shape(const SplitEmbedding* sp) { return &sp->shape; }

// (key, value) pairs, by key then value.
static int compare_pairs(const void* a, const void* b) {
    const int* x = (const int*)a;
    const int* y = (const int*)b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

// This rank's distinct tokens, ascending, into sp->ids, and each position's row into
// sp->host_row_of_position. Returns how many.
static int distinct_tokens(SplitEmbedding* sp, const int* tokens, int n) {
    size_t rows_total = sp->shape.rows;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || (size_t)tokens[i] >= rows_total)
            fatal("zero1: token %d at position %d is outside the embedding's %zu rows", tokens[i], i, rows_total);
        sp->pairs[2 * i] = tokens[i];
        sp->pairs[2 * i + 1] = i;
    }
    qsort(sp->pairs, (size_t)n, 2 * sizeof(int), compare_pairs);
    int u = -1;
    for (int i = 0; i < n; i++) {
        if (i == 0 || sp->pairs[2 * i] != sp->pairs[2 * i - 2]) sp->ids[++u] = sp->pairs[2 * i];
        sp->host_row_of_position[sp->pairs[2 * i + 1]] = u;
    }
    return u + 1;
}

// Every rank's distinct tokens: counts, then the ids, each rank's padded to the largest count.
// Returns that largest count (the stride of sp->all_ids).
static int gather_tokens(SplitEmbedding* sp, Zero1Comm* c) {
    zero1_comm_host_all_gather(c, &sp->num_rows, sp->counts, sizeof(int));
    int stride = 0;
    for (int r = 0; r < c->size; r++) stride = sp->counts[r] > stride ? sp->counts[r] : stride;
    zero1_comm_host_all_gather(c, sp->ids, sp->all_ids, (size_t)stride * sizeof(int));
    return stride;
}

// The run [*first, *first + *count) of the sorted ids whose rows meet [lo, hi).
static void rows_meeting(const SplitEmbedding* sp, const int* ids, int n, size_t lo, size_t hi, int* first,
                         int* count) {
    size_t start = sp->shape.start, w = sp->shape.width;
    int f = 0;
    while (f < n && start + (size_t)(ids[f] + 1) * w <= lo) f++;
    int e = f;
    while (e < n && start + (size_t)ids[e] * w < hi) e++;
    *first = f;
    *count = e - f;
}

// What this rank sends each owner and receives from each source; the received rows'
// ids go to sp->pairs as (id, received row), which are in source order.
static int plan_exchange(SplitEmbedding* sp, const Zero1Comm* comm, int stride) {
    int me = comm->rank, received = 0, first, count;
    size_t lo, hi, w = sp->shape.width;
    for (int o = 0; o < comm->size; o++) {
        slot_of(sp, comm->size, o, &lo, &hi);
        rows_meeting(sp, sp->ids, sp->num_rows, lo, hi, &first, &count);
        sp->send_offsets[o] = (size_t)first * w;
        sp->send_counts[o] = (size_t)count * w;
        if (o != me) sp->rows_sent += (size_t)count;
    }
    slot_of(sp, comm->size, me, &lo, &hi);
    for (int s = 0; s < comm->size; s++) {
        const int* ids = sp->all_ids + (size_t)s * stride;
        rows_meeting(sp, ids, sp->counts[s], lo, hi, &first, &count);
        sp->recv_offsets[s] = (size_t)received * w;
        sp->recv_counts[s] = (size_t)count * w;
        for (int k = 0; k < count; k++, received++) {
            sp->pairs[2 * received] = ids[first + k];
            sp->pairs[2 * received + 1] = received;
        }
    }
    if (received > sp->max_recv_rows) fatal("zero1: split embedding: %d rows to receive, room for %d", received,
                                            sp->max_recv_rows);
    return received;
}

// The owner's add: one entry per distinct received id, its rows in source order.
static void plan_add(SplitEmbedding* sp, const Zero1Comm* comm, int received) {
    size_t lo, hi, start = sp->shape.start, w = sp->shape.width;
    slot_of(sp, comm->size, comm->rank, &lo, &hi);
    qsort(sp->pairs, (size_t)received, 2 * sizeof(int), compare_pairs);  // by id, then source order
    int count = 0;
    for (int i = 0; i < received; i++) {
        sp->host_sources[i] = sp->pairs[2 * i + 1];
        if (i > 0 && sp->pairs[2 * i] == sp->pairs[2 * i - 2]) {
            sp->host_adds[count - 1].count++;
            continue;
        }
        size_t row = start + (size_t)sp->pairs[2 * i] * w;
        size_t dst = max_size(row, lo), end = min_size(row + w, hi);
        Zero1RowAdd a = {dst, (int)(dst - row), (int)(end - dst), i, 1};
        if (count == sp->max_adds) fatal("zero1: split embedding: more than %d rows to add", sp->max_adds);
        sp->host_adds[count++] = a;
    }
    // --average-in-collective: the dense reduction averages over the group, so the rows do too.
    float scale = sp->shape.average ? zero1_avg_scale(comm->size) : 1.0f;
    Zero1RowPlan plan = {count, received, w, sp->adds, sp->sources, sp->shape.buffer_numel,
                         (size_t)sp->max_recv_rows * w, scale};
    sp->plan = plan;
}

float* split_embedding_plan(SplitEmbedding* sp, Zero1Comm* comm, const Zero1Device* dev, const int* tokens, int n,
                            const int** row_of_position) {
    if (n > sp->shape.max_positions)
        fatal("zero1: split embedding: %d positions, room for %d", n, sp->shape.max_positions);
    const Zero1DeviceOps* ops = dev->ops;
    void* c = dev->ctx;
    // The host arrays are uploaded from: last step's uploads must have run.
    if (sp->upload_pending) ops->sync_event(c, sp->uploaded);
    sp->num_rows = distinct_tokens(sp, tokens, n);
    int received = plan_exchange(sp, comm, gather_tokens(sp, comm));
    plan_add(sp, comm, received);
    Zero1Stream s = dev->compute;
    ops->from_host(c, s, sp->row_of_position, sp->host_row_of_position, (size_t)n * sizeof(int));
    ops->from_host(c, s, sp->adds, sp->host_adds, (size_t)sp->plan.count * sizeof(Zero1RowAdd));
    ops->from_host(c, s, sp->sources, sp->host_sources, (size_t)received * sizeof(int));
    ops->record(c, sp->uploaded, s);
    sp->upload_pending = 1;
    ops->fill(c, s, sp->rows, 0, (size_t)sp->num_rows * sp->shape.width * sizeof(float));
    *row_of_position = sp->row_of_position;
    return sp->rows;
}

Zero1Handle split_embedding_send(SplitEmbedding* sp, Zero1Comm* comm, int bucket) {
    return zero1_comm_all_to_all_v(comm, sp->rows, sp->send_counts, sp->send_offsets, sp->recv, sp->recv_counts,
                                   sp->recv_offsets, ZERO1_FP32, bucket);
}

void split_embedding_add(const SplitEmbedding* sp, const Zero1Device* dev, float* grads) {
    dev->ops->add_rows(dev->ctx, dev->compute, grads, sp->recv, &sp->plan);
}

size_t split_embedding_rows_sent(const SplitEmbedding* sp) { return sp->rows_sent; }
