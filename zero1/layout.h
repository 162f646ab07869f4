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

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZERO1_PARAM_START_ALIGN 64        // elements (Megatron's docstring says bytes; the code uses elements)
#define ZERO1_BUCKET_ALIGN 128            // bucket ends are multiples of lcm(DP, 128) ...
#define ZERO1_BUSBW_ALIGN 65536           // ... or lcm(DP, 128, 2^16) with pad_busbw

// One bucket, in buffer order. [start, end) includes the end padding.
// The bucket holds exactly the parameters with definition index first_param..last_param
// (a contiguous range); inside the bucket they sit in reverse order, last_param at start.
typedef struct {
    size_t start, end;
    size_t numel_unpadded;  // close point - start (includes 64-element start alignment gaps)
    int first_param, last_param;
} Zero1Bucket;

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
} Zero1Layout;

// Megatron's default: max(40e6, 1e6 * DP) elements, so each rank's shard of a full
// bucket is about 1M elements and the ring collectives stay bandwidth-bound.
long long zero1_default_bucket_size(int dp);

// lcm(DP, 128) or lcm(DP, 128, 65536); 0 if dp < 1.
size_t zero1_bucket_divisor(int dp, int pad_busbw);

// Builds the layout. numels: num_params sizes in definition order (each >= 1).
// bucket_size: < 0 default, 0 none, > 0 elements. shared_embedding: index or -1.
// Returns 0, or -1 with a message in err (err may be NULL). On error *out is zeroed.
int zero1_layout_build(Zero1Layout* out, const size_t* numels, int num_params, int dp,
                       long long bucket_size, int pad_busbw, int shared_embedding,
                       char* err, size_t err_len);

void zero1_layout_free(Zero1Layout* layout);

// The error convention of the layout and the shards (shards.h): the message into err (when
// err is not NULL), and -1 to return.
int zero1_error(char* err, size_t err_len, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// Elements of the largest bucket (padding included): what one all-to-all receive
// temporary holds (--fp32-accumulation, --dp-invariant).
size_t zero1_layout_largest_bucket(const Zero1Layout* layout);

#ifdef __cplusplus
}
#endif
#endif
