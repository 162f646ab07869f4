/*
 * zero1/layout.h: where every parameter lives in the contiguous param/grad buffers.
 *
 * This is Megatron's DistributedOptimizer layout (distrib_optimizer.py
 * _compute_per_buffer_param_layout + param_layout.py), reproduced element for element:
 *   - parameters are walked in REVERSE definition order (backprop order), so bucket 0
 *     holds the end of the model: its gradients are final first and its reduce-scatter
 *     can start while earlier layers still run backward;
 *   - every parameter start is aligned up to a multiple of 64 elements;
 *   - the shared-embedding parameter (if any) gets a bucket of its own: the open bucket
 *     is closed at its aligned start (when non-empty), and closed again right after it;
 *   - otherwise a bucket is closed after a parameter when param_end - bucket_start >=
 *     bucket_size (a parameter never spans two buckets, so buckets may exceed bucket_size);
 *   - closing records numel_unpadded = close_point - bucket_start and pads the end up to a
 *     multiple of lcm(DP, 128), or lcm(DP, 128, 65536) with pad_busbw, so every bucket
 *     splits into DP equal shards (and, with pad_busbw, NCCL ring chunks are multiples of
 *     2^16 elements); the next bucket starts at the padded end;
 *   - whatever is open after the last parameter is the tail bucket.
 * Offsets are element counts (not bytes): the same layout serves the bf16 param buffer
 * and the fp32 grad buffer.
 *
 * Pure C, no MPI, no CUDA; never aborts: errors come back as -1 plus a message.
 */
#ifndef ZERO1_LAYOUT_H
#define ZERO1_LAYOUT_H

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZERO1_PARAM_START_ALIGN 64        // elements (Megatron's docstring says bytes; the code uses elements)
#define ZERO1_BUCKET_ALIGN 128            // bucket ends are multiples of lcm(DP, 128) ...
#define ZERO1_BUSBW_ALIGN 65536           // ... or lcm(DP, 128, 2^16) with pad_busbw

// One bucket, in buffer order. [start, end) includes the end padding.
// The bucket holds exactly the parameters with definition index first_param..last_param
// (a contiguous range); inside the bucket they sit in reverse order, last_param at start.
// A bucket of the two-buffer layout's Muon part (zero1/layout_layerwise.h) lists its
// parameters instead: members, in buffer order (first_param/last_param: the lowest and
// highest of them). zero1_bucket_param reads either kind.
typedef struct {
    size_t start, end;
    size_t numel_unpadded;  // close point - start (includes 64-element start alignment gaps)
    int first_param, last_param;
    const int* members;     // NULL: the range above; else num_members indices (the layout owns them)
    int num_members;
} Zero1Bucket;

static inline int zero1_bucket_num_params(const Zero1Bucket* k) {
    return k->members ? k->num_members : k->last_param - k->first_param + 1;
}
// The i-th parameter of bucket k in buffer order (from its start).
static inline int zero1_bucket_param(const Zero1Bucket* k, int i) {
    return k->members ? k->members[i] : k->last_param - i;
}

// One parameter, indexed by definition order: [start, end) in the buffer, and its bucket.
typedef struct {
    size_t start, end;
    int bucket;
} Zero1ParamPlace;

typedef struct {
    int dp;
    size_t bucket_size;    // resolved value in elements; 0 = no bucketing (one bucket)
    int pad_busbw;
    int shared_embedding;  // definition index of the own-bucket parameter, -1 = none
    int num_params;
    Zero1ParamPlace* params;  // num_params entries, definition order
    int num_buckets;
    Zero1Bucket* buckets;     // num_buckets entries, buffer order
    size_t numel;             // padded total = buckets[num_buckets-1].end
    size_t numel_unpadded;    // sum of buckets' numel_unpadded
    int* members;             // the storage of the buckets' member lists (NULL: none has one)
    int num_muon_buckets;     // the two-buffer layout (layout_layerwise.h): the last ones are Muon's (else 0)
} Zero1Layout;

// Megatron's default: max(40e6, 1e6 * DP) elements, so each rank's shard of a full
// bucket is about 1M elements and the ring collectives stay bandwidth-bound.
long long zero1_default_bucket_size(int dp);

// The bucket size a run lays out with, chosen as Megatron's DistributedDataParallel does:
// the default over the whole data-parallel group (every instance's ranks: data_parallel_size),
// and one bucket (0) when the reductions do not overlap the backward, since buckets only pay
// by starting early. requested: < 0 default, 0 none, > 0 elements.
long long zero1_ddp_bucket_size(long long requested, int data_parallel_size, int overlap_grad_reduce);

// Parses --bucket-size (the trainers, zero1_plan, gpt2_cost): "none" (0, one bucket) or
// N >= 1 elements. 0 is refused rather than given Megatron's meaning (a bucket closed after
// every parameter, which N = 1 also gives), since it meant one bucket here before. Returns 0,
// or -1 with a message naming flag. Inline: the plain trainer parses it without zero1/.
static inline int zero1_parse_bucket_size(const char* flag, const char* value, long long* out, char* err,
                                          size_t err_len) {
    char* end = NULL;
    unsigned long long v;
    if (strcmp(value, "none") == 0) {
        *out = 0;
        return 0;
    }
    errno = 0;
    v = strtoull(value, &end, 10);
    if (end == value || *end != '\0' || errno != 0 || value[0] < '0' || value[0] > '9' || v > (1ULL << 62)) {
        snprintf(err, err_len, "%s expects a number of elements (1 to 2^62) or none, got '%s'", flag, value);
        return -1;
    }
    if (v == 0) {
        snprintf(err, err_len, "%s 0: for one bucket use %s none (Megatron's bucket_size=0 would close a bucket "
                 "after every parameter, as %s 1 does)", flag, flag, flag);
        return -1;
    }
    *out = (long long)v;
    return 0;
}

// lcm(DP, 128) or lcm(DP, 128, 65536); 0 if dp < 1.
size_t zero1_bucket_divisor(int dp, int pad_busbw);

// Builds the layout. numels: num_params sizes in definition order (each >= 1).
// bucket_size: < 0 the default for dp (a run with instances resolves it first through
// zero1_ddp_bucket_size), 0 none, > 0 elements. shared_embedding: index or -1.
// Returns 0, or -1 with a message in err (err may be NULL). On error *out is zeroed.
int zero1_layout_build(Zero1Layout* out, const size_t* numels, int num_params, int dp,
                       long long bucket_size, int pad_busbw, int shared_embedding,
                       char* err, size_t err_len);

void zero1_layout_free(Zero1Layout* layout);

// Bucket b holds Muon's matrices, whole per shard (the two-buffer layout's second part).
static inline int zero1_bucket_is_muon(const Zero1Layout* layout, int b) {
    return b >= layout->num_buckets - layout->num_muon_buckets;
}

// What the builders (this one, layout_layerwise.h's) share: checks the arguments as above and
// starts *L (its fields set, params and buckets zeroed, num_params of each). 0 or -1.
int zero1_layout_begin(Zero1Layout* L, const size_t* numels, int num_params, int dp, long long bucket_size,
                       int pad_busbw, int shared_embedding, char* err, size_t err_len);

// The error convention of the layout and the shards (shards.h): the message into err (when
// err is not NULL), and -1 to return.
int zero1_error(char* err, size_t err_len, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// lcm(a, b) of positive a, b; and x rounded up to a multiple of m into *out: 1, or 0 on overflow.
size_t zero1_lcm(size_t a, size_t b);
int zero1_round_up(size_t x, size_t m, size_t* out);

// Elements of the largest bucket (padding included): what one all-to-all receive
// temporary holds (--fp32-accumulation, --dp-invariant).
size_t zero1_layout_largest_bucket(const Zero1Layout* layout);

#ifdef __cplusplus
}
#endif
#endif
