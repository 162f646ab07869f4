/*
 * Unit tests of the zero1 core: layout, layer-wise layout (--optimizer muon), shards, ledger.
 *   make test_zero1_layout && ./test_zero1_layout
 * Hand-worked layouts (numbers derived on paper from the rules in zero1/layout.h, written
 * out in the comments), invalid arguments, and invariants + element coverage on many
 * random configurations. Prints TAP (dev/test/check.h), a line per group of checks; exit 0 on
 * pass.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero1/layout.h"
#include "zero1/layout_layerwise.h"
#include "zero1/ledger.h"
#include "zero1/shards.h"

#include "dev/test/check.h"

#define CHECK_RANGE(r, s, e, what) CHECK((r).start == (size_t)(s) && (r).end == (size_t)(e), \
    "%s = [%zu,%zu), want [%d,%d)", what, (r).start, (r).end, (int)(s), (int)(e))

static Zero1Layout build_ok(const size_t* numels, int n, int dp, long long bucket_size, int busbw, int shared) {
    Zero1Layout L;
    char err[256] = {0};
    int rc = zero1_layout_build(&L, numels, n, dp, bucket_size, busbw, shared, err, sizeof(err));
    CHECK(rc == 0, "layout build failed: %s", err);
    return L;
}

static void check_bucket(const Zero1Layout* L, int b, size_t start, size_t end, size_t unpadded, int first, int last) {
    CHECK(b < L->num_buckets, "bucket %d missing (have %d)", b, L->num_buckets);
    if (b >= L->num_buckets) return;
    const Zero1Bucket* k = &L->buckets[b];
    CHECK(k->start == start && k->end == end && k->numel_unpadded == unpadded,
          "bucket %d = [%zu,%zu) unpadded %zu, want [%zu,%zu) unpadded %zu", b, k->start, k->end, k->numel_unpadded,
          start, end, unpadded);
    CHECK(k->first_param == first && k->last_param == last, "bucket %d params %d..%d, want %d..%d", b,
          k->first_param, k->last_param, first, last);
}

static void check_param(const Zero1Layout* L, int i, size_t start, size_t end, int bucket) {
    const Zero1ParamPlace* p = &L->params[i];
    CHECK(p->start == start && p->end == end && p->bucket == bucket, "param %d = [%zu,%zu) bucket %d, want [%zu,%zu) %d",
          i, p->start, p->end, p->bucket, start, end, bucket);
}

// ------------------------------------------------------------------ hand-worked cases

// A parameter larger than bucket_size, and a rank that owns only padding.
// numels {10, 500, 20}, DP=2, bucket_size=100, divisor lcm(2,128)=128. Reverse walk:
//   p2: [0,20), 20 < 100, bucket stays open;
//   p1: start 20 -> aligned 64, [64,564); 564 >= 100 closes bucket 0: unpadded 564, end 640;
//   p0: [640,650), tail bucket 1: unpadded 10, end 768.
// Shards: bucket 0 has 320 per rank: rank 0 [0,320) holds p2 whole and p1[0,256);
// rank 1 [320,640) holds p1[256,500) at local [0,244). Bucket 1 has 64 per rank:
// rank 0 [640,704) holds p0; rank 1 [704,768) is padding only.
static void test_param_larger_than_bucket(void) {
    size_t numels[] = {10, 500, 20};
    Zero1Layout L = build_ok(numels, 3, 2, 100, 0, -1);
    CHECK(L.num_buckets == 2, "num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 640, 564, 1, 2);
    check_bucket(&L, 1, 640, 768, 10, 0, 0);
    check_param(&L, 2, 0, 20, 0);
    check_param(&L, 1, 64, 564, 0);
    check_param(&L, 0, 640, 650, 1);
    CHECK(L.numel == 768 && L.numel_unpadded == 574, "numel %zu unpadded %zu", L.numel, L.numel_unpadded);
    CHECK(L.bucket_size == 100, "bucket_size %zu", L.bucket_size);

    Zero1RankShards S0, S1;
    char err[256];
    CHECK(zero1_shards_build(&S0, &L, 0, err, sizeof(err)) == 0, "%s", err);
    CHECK(zero1_shards_build(&S1, &L, 1, err, sizeof(err)) == 0, "%s", err);
    CHECK(S0.owned_numel == 384 && S1.owned_numel == 384, "owned %zu %zu", S0.owned_numel, S1.owned_numel);
    // rank 0, bucket 0
    CHECK_RANGE(S0.buckets[0].shard, 0, 320, "r0b0 shard");
    CHECK(S0.buckets[0].num_views == 2, "r0b0 views %d", S0.buckets[0].num_views);
    const Zero1ParamView* v = &S0.buckets[0].views[0];
    CHECK(v->param == 2, "r0b0 view0 param %d", v->param);
    CHECK_RANGE(v->gbuf_world, 0, 20, "r0 p2 world");
    CHECK_RANGE(v->gbuf_local, 0, 20, "r0 p2 local");
    CHECK_RANGE(v->param_range, 0, 20, "r0 p2 param");
    v = &S0.buckets[0].views[1];
    CHECK(v->param == 1, "r0b0 view1 param %d", v->param);
    CHECK_RANGE(v->gbuf_world, 64, 320, "r0 p1 world");
    CHECK_RANGE(v->gbuf_world_in_bucket, 64, 320, "r0 p1 in bucket");
    CHECK_RANGE(v->gbuf_local, 64, 320, "r0 p1 local");
    CHECK_RANGE(v->param_range, 0, 256, "r0 p1 param");
    // rank 1, bucket 0: the second half of p1
    CHECK_RANGE(S1.buckets[0].shard, 320, 640, "r1b0 shard");
    CHECK(S1.buckets[0].num_views == 1, "r1b0 views %d", S1.buckets[0].num_views);
    v = &S1.buckets[0].views[0];
    CHECK(v->param == 1, "r1b0 view param %d", v->param);
    CHECK_RANGE(v->gbuf_world, 320, 564, "r1 p1 world");
    CHECK_RANGE(v->gbuf_world_in_bucket, 320, 564, "r1 p1 in bucket");
    CHECK_RANGE(v->gbuf_local, 0, 244, "r1 p1 local");
    CHECK_RANGE(v->param_range, 256, 500, "r1 p1 param");
    // bucket 1: rank 0 holds p0, rank 1 only padding
    CHECK_RANGE(S0.buckets[1].shard, 640, 704, "r0b1 shard");
    CHECK(S0.buckets[1].num_views == 1, "r0b1 views %d", S0.buckets[1].num_views);
    v = &S0.buckets[1].views[0];
    CHECK_RANGE(v->gbuf_world, 640, 650, "r0 p0 world");
    CHECK_RANGE(v->gbuf_world_in_bucket, 0, 10, "r0 p0 in bucket");
    CHECK_RANGE(v->gbuf_local, 0, 10, "r0 p0 local");
    CHECK_RANGE(v->param_range, 0, 10, "r0 p0 param");
    CHECK_RANGE(S1.buckets[1].shard, 704, 768, "r1b1 shard");
    CHECK(S1.buckets[1].num_views == 0, "r1b1 should be padding only, has %d views", S1.buckets[1].num_views);
    zero1_shards_free(&S0);
    zero1_shards_free(&S1);
    zero1_layout_free(&L);
}

// DP=1: one rank owns everything. numels {3, 5}, no bucketing: p1 [0,5), p0 at 64 -> [64,67),
// one bucket unpadded 67 padded to 128.
static void test_dp1(void) {
    size_t numels[] = {3, 5};
    Zero1Layout L = build_ok(numels, 2, 1, 0, 0, -1);
    CHECK(L.num_buckets == 1, "num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 128, 67, 0, 1);
    check_param(&L, 1, 0, 5, 0);
    check_param(&L, 0, 64, 67, 0);
    Zero1RankShards S;
    char err[256];
    CHECK(zero1_shards_build(&S, &L, 0, err, sizeof(err)) == 0, "%s", err);
    CHECK(S.owned_numel == 128, "owned %zu", S.owned_numel);
    CHECK_RANGE(S.buckets[0].shard, 0, 128, "dp1 shard");
    CHECK(S.buckets[0].num_views == 2 && S.buckets[0].views[0].param == 1 && S.buckets[0].views[1].param == 0,
          "dp1 views");
    CHECK_RANGE(S.buckets[0].views[1].gbuf_local, 64, 67, "dp1 p0 local");
    CHECK_RANGE(S.buckets[0].views[1].param_range, 0, 3, "dp1 p0 param");
    zero1_shards_free(&S);
    CHECK(zero1_shards_build(&S, &L, 1, err, sizeof(err)) == -1, "rank 1 at DP=1 must be rejected");
    zero1_layout_free(&L);
}

// A shared embedding that closes a non-empty bucket. numels {100, 30, 40}, shared=0, DP=3,
// no bucketing, divisor lcm(3,128)=384:
//   p2 [0,40); p1 aligned 64 -> [64,94); p0 aligned 128: bucket 0 is open and non-empty, so it
//   closes at 128 (unpadded 128, end 384); p0 [384,484) closes its own bucket (unpadded 100, end 768).
// Bucket 1 shards are 128 wide: rank 0 holds all of p0, ranks 1 and 2 only padding.
static void test_shared_embedding_closes_bucket(void) {
    size_t numels[] = {100, 30, 40};
    Zero1Layout L = build_ok(numels, 3, 3, 0, 0, 0);
    CHECK(L.num_buckets == 2, "num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 384, 128, 1, 2);
    check_bucket(&L, 1, 384, 768, 100, 0, 0);
    check_param(&L, 2, 0, 40, 0);
    check_param(&L, 1, 64, 94, 0);
    check_param(&L, 0, 384, 484, 1);
    CHECK(L.numel == 768 && L.numel_unpadded == 228, "numel %zu unpadded %zu", L.numel, L.numel_unpadded);
    char err[256];
    for (int r = 0; r < 3; r++) {
        Zero1RankShards S;
        CHECK(zero1_shards_build(&S, &L, r, err, sizeof(err)) == 0, "%s", err);
        CHECK(S.buckets[1].num_views == (r == 0 ? 1 : 0), "rank %d bucket 1 views %d", r, S.buckets[1].num_views);
        zero1_shards_free(&S);
    }
    zero1_layout_free(&L);

    // Shared embedding in the middle, DP=1: {10, 20, 30}, shared=1:
    //   p2 [0,30); p1 aligned 64 closes bucket 0 (unpadded 64, end 128); p1 [128,148) closes its own
    //   (unpadded 20, end 256); p0 [256,266) is the tail (unpadded 10, end 384).
    size_t mid[] = {10, 20, 30};
    L = build_ok(mid, 3, 1, 0, 0, 1);
    CHECK(L.num_buckets == 3, "num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 128, 64, 2, 2);
    check_bucket(&L, 1, 128, 256, 20, 1, 1);
    check_bucket(&L, 2, 256, 384, 10, 0, 0);
    zero1_layout_free(&L);

    // Shared embedding placed first (last index): nothing is open, so no early close:
    // {10, 20}, shared=1: p1 [0,20) own bucket (end 128); p0 [128,138) tail (end 256).
    size_t last[] = {10, 20};
    L = build_ok(last, 2, 1, 0, 0, 1);
    CHECK(L.num_buckets == 2, "num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 128, 20, 1, 1);
    check_bucket(&L, 1, 128, 256, 10, 0, 0);
    zero1_layout_free(&L);
}

// bucket_size hit exactly (>= closes), pad_busbw, default bucket size, ranks owning only padding.
static void test_bucket_rules(void) {
    char err[256];
    // {64, 64}, bucket_size 64, DP=1: p1 [0,64) 64>=64 closes (end 128); p0 [128,192) closes (end 256).
    size_t two[] = {64, 64};
    Zero1Layout L = build_ok(two, 2, 1, 64, 0, -1);
    CHECK(L.num_buckets == 2, "exact hit: num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 128, 64, 1, 1);
    check_bucket(&L, 1, 128, 256, 64, 0, 0);
    zero1_layout_free(&L);
    // bucket_size 65: p1 ends at 64 < 65, p0 ends at 128 >= 65: one bucket [0,128).
    L = build_ok(two, 2, 1, 65, 0, -1);
    CHECK(L.num_buckets == 1, "65: num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 128, 128, 0, 1);
    zero1_layout_free(&L);
    // pad_busbw at DP=3: divisor lcm(3,128,65536) = 196608.
    CHECK(zero1_bucket_divisor(3, 1) == 196608, "busbw divisor %zu", zero1_bucket_divisor(3, 1));
    CHECK(zero1_bucket_divisor(3, 0) == 384, "divisor %zu", zero1_bucket_divisor(3, 0));
    CHECK(zero1_bucket_divisor(256, 0) == 256, "divisor %zu", zero1_bucket_divisor(256, 0));
    size_t one[] = {1};
    L = build_ok(one, 1, 3, -1, 1, -1);
    CHECK(L.numel == 196608 && L.numel_unpadded == 1, "busbw numel %zu", L.numel);
    CHECK(L.bucket_size == 40000000, "default bucket size %zu", L.bucket_size);
    zero1_layout_free(&L);
    CHECK(zero1_default_bucket_size(8) == 40000000LL, "default(8)");
    CHECK(zero1_default_bucket_size(64) == 64000000LL, "default(64)");
    // As Megatron's DDP: the default over all data-parallel ranks (64 as 2 instances of 32 -> 64e6);
    // one bucket without overlap, whatever was asked; a size given is kept with overlap.
    CHECK(zero1_ddp_bucket_size(-1, 64, 1) == 64000000LL, "ddp default(64)");
    CHECK(zero1_ddp_bucket_size(-1, 64, 0) == 0 && zero1_ddp_bucket_size(3000, 8, 0) == 0, "ddp without overlap");
    CHECK(zero1_ddp_bucket_size(3000, 8, 1) == 3000 && zero1_ddp_bucket_size(0, 8, 1) == 0, "ddp given");
    // --bucket-size: none is 0, a count is kept, 0 and anything else are refused with a message.
    long long parsed = -1;
    CHECK(zero1_parse_bucket_size("--bucket-size", "none", &parsed, err, sizeof(err)) == 0 && parsed == 0, "none");
    CHECK(zero1_parse_bucket_size("--bucket-size", "40000", &parsed, err, sizeof(err)) == 0 && parsed == 40000, "N");
    CHECK(zero1_parse_bucket_size("--bucket-size", "0", &parsed, err, sizeof(err)) == -1 &&
              strstr(err, "use --bucket-size none") != NULL, "0: %s", err);
    CHECK(zero1_parse_bucket_size("--bucket-size", "-1", &parsed, err, sizeof(err)) == -1, "-1");
    CHECK(zero1_parse_bucket_size("--bucket-size", "12x", &parsed, err, sizeof(err)) == -1, "12x");
    // DP=4, one element: bucket [0,128), shards of 32; ranks 1..3 own only padding.
    L = build_ok(one, 1, 4, 0, 0, -1);
    for (int r = 0; r < 4; r++) {
        Zero1RankShards S;
        CHECK(zero1_shards_build(&S, &L, r, err, sizeof(err)) == 0, "%s", err);
        CHECK_RANGE(S.buckets[0].shard, 32 * r, 32 * r + 32, "dp4 shard");
        CHECK(S.buckets[0].num_views == (r == 0), "rank %d views %d", r, S.buckets[0].num_views);
        zero1_shards_free(&S);
    }
    zero1_layout_free(&L);
}

static void expect_layout_error(const size_t* numels, int n, int dp, long long bs, int shared, const char* what) {
    Zero1Layout L;
    memset(&L, 0x5a, sizeof(L));  // garbage in: the builder must zero it on error
    char err[256] = {0};
    int rc = zero1_layout_build(&L, numels, n, dp, bs, 0, shared, err, sizeof(err));
    CHECK(rc == -1, "%s: expected an error, got rc %d", what, rc);
    CHECK(err[0] != '\0', "%s: empty error message", what);
    CHECK(L.params == NULL && L.buckets == NULL && L.num_buckets == 0, "%s: out not zeroed", what);
    zero1_layout_free(&L);  // must be harmless on a zeroed layout
}

static void test_invalid_arguments(void) {
    size_t ok[] = {10, 20};
    expect_layout_error(ok, 2, 0, 0, -1, "dp 0");
    expect_layout_error(ok, 2, -3, 0, -1, "dp -3");
    expect_layout_error(ok, 0, 1, 0, -1, "empty list");
    expect_layout_error(NULL, 2, 1, 0, -1, "NULL numels");
    size_t with_zero[] = {10, 0, 5};
    expect_layout_error(with_zero, 3, 1, 0, -1, "zero-size parameter");
    expect_layout_error(ok, 2, 1, 0, 2, "shared index == num_params");
    expect_layout_error(ok, 2, 1, 0, -2, "shared index -2");
    size_t huge[] = {SIZE_MAX - 10, 100};
    expect_layout_error(huge, 2, 1, 0, -1, "overflow in a sum");
    size_t huge_pad[] = {SIZE_MAX - 10};
    expect_layout_error(huge_pad, 1, 1, 0, -1, "overflow in end padding");
    size_t halves[] = {SIZE_MAX / 2, SIZE_MAX / 2, 1000};
    expect_layout_error(halves, 3, 7, 5, -1, "overflow across buckets");
    CHECK(zero1_layout_build(NULL, ok, 2, 1, 0, 0, -1, NULL, 0) == -1, "NULL out");

    Zero1Layout L = build_ok(ok, 2, 2, 0, 0, -1);
    Zero1RankShards S;
    char err[256] = {0};
    CHECK(zero1_shards_build(&S, &L, 2, err, sizeof(err)) == -1 && err[0], "rank == dp");
    CHECK(zero1_shards_build(&S, &L, -1, err, sizeof(err)) == -1, "rank -1");
    CHECK(S.buckets == NULL, "shards not zeroed on error");
    zero1_layout_free(&L);
    Zero1Layout empty;
    memset(&empty, 0, sizeof(empty));
    CHECK(zero1_shards_build(&S, &empty, 0, err, sizeof(err)) == -1, "unbuilt layout");
}

// The ledger of a small layout, numbers by hand: numel 1024, DP 4, owned 256.
static void test_ledger(void) {
    Zero1Ledger g = zero1_ledger_compute(1024, 4, 2, 4);
    CHECK(g.owned_numel == 256 && g.state_bytes == 12, "owned %llu", (unsigned long long)g.owned_numel);
    CHECK(g.param_buffer == 2048 && g.grad_buffer == 4096, "buffers");
    CHECK(g.total_replicated == 2048 + 4096 + 12288, "replicated %llu", (unsigned long long)g.total_replicated);
    CHECK(g.total_zero1 == 2048 + 4096 + 3072, "zero1 %llu", (unsigned long long)g.total_zero1);
    CHECK(g.sent_all_reduce == 6144 && g.sent_reduce_scatter == 3072 && g.sent_all_gather == 1536,
          "sent %llu %llu %llu", (unsigned long long)g.sent_all_reduce, (unsigned long long)g.sent_reduce_scatter,
          (unsigned long long)g.sent_all_gather);
    g = zero1_ledger_compute(1024, 4, 4, 4);
    CHECK(g.state_bytes == 8 && g.total_replicated == 4096 + 4096 + 8192 && g.total_zero1 == 4096 + 4096 + 2048,
          "fp32 variant");
    CHECK(g.sent_all_gather == 3072, "fp32 all-gather");
    g = zero1_ledger_compute(1024, 1, 2, 4);
    CHECK(g.sent_all_reduce == 0 && g.sent_zero1 == 0 && g.total_zero1 == g.total_replicated, "dp 1");
    g = zero1_ledger_compute(UINT64_MAX / 4, 1, 2, 4);
    CHECK(g.overflow == 1, "overflow flag");
    // 3 instances of DP 4 (12 ranks): owned 256; inside the group as above; across the groups
    // the 256-element fp32 shard in a ring of 3: 2*2/3*1024 B = 1365 (rounded down); the
    // replicated all-reduce over 12 ranks: 2*11/12*4096 B = 7509.
    g = zero1_ledger_compute_instances(1024, 4, 3, 2, 4);
    CHECK(g.owned_numel == 256 && g.total_zero1 == 2048 + 4096 + 3072 && g.instances == 3, "instances: state");
    CHECK(g.sent_reduce_scatter == 3072 && g.sent_all_gather == 1536 && g.sent_cross_all_reduce == 1365,
          "instances: sent %llu %llu %llu", (unsigned long long)g.sent_reduce_scatter,
          (unsigned long long)g.sent_all_gather, (unsigned long long)g.sent_cross_all_reduce);
    CHECK(g.sent_zero1 == 3072 + 1536 + 1365 && g.sent_all_reduce == 7509, "instances: totals %llu %llu",
          (unsigned long long)g.sent_zero1, (unsigned long long)g.sent_all_reduce);
    g = zero1_ledger_compute(1024, 4, 2, 4);
    CHECK(g.instances == 1 && g.sent_cross_all_reduce == 0, "one instance sends nothing across");
}

// ------------------------------------------------------------------ random coverage

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint32_t rng_next(void) {  // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ULL) >> 32);
}
static int rng_int(int lo, int hi) { return lo + (int)(rng_next() % (uint32_t)(hi - lo + 1)); }

// Invariants of one layout plus exact element coverage over all ranks.
static void check_layout_and_coverage(const size_t* numels, int n, int dp, long long bs, int busbw, int shared) {
    Zero1Layout L;
    char err[256];
    if (zero1_layout_build(&L, numels, n, dp, bs, busbw, shared, err, sizeof(err)) != 0) {
        CHECK(0, "random layout failed: %s", err);
        return;
    }
    size_t divisor = zero1_bucket_divisor(dp, busbw);
    CHECK(L.buckets[0].start == 0, "first bucket starts at %zu", L.buckets[0].start);
    CHECK(L.numel == L.buckets[L.num_buckets - 1].end && L.numel % (size_t)dp == 0, "numel %zu", L.numel);
    size_t unpadded_sum = 0;
    for (int b = 0; b < L.num_buckets; b++) {
        const Zero1Bucket* k = &L.buckets[b];
        unpadded_sum += k->numel_unpadded;
        CHECK(b == 0 || k->start == L.buckets[b - 1].end, "bucket %d not contiguous", b);
        CHECK(k->start % divisor == 0 && k->end % divisor == 0 && k->end > k->start, "bucket %d alignment", b);
        CHECK(k->numel_unpadded <= k->end - k->start && k->end - k->start - k->numel_unpadded < divisor,
              "bucket %d padding", b);
        CHECK(b == 0 || k->last_param == L.buckets[b - 1].first_param - 1, "bucket %d param ranges", b);
        // Only the last parameter placed may push the bucket past bucket_size.
        for (int p = k->first_param + 1; p <= k->last_param && L.bucket_size > 0; p++)
            CHECK(L.params[p].end - k->start < L.bucket_size || p == shared, "bucket %d closed late", b);
        // A bucket ends where its last-placed parameter ends, except when the shared embedding
        // closed it early: then at that parameter's 64-aligned start.
        size_t last_end = L.params[k->first_param].end;
        int full = L.bucket_size > 0 && last_end - k->start >= L.bucket_size;
        int closed_by_shared = shared >= 0 && !full && k->first_param == shared + 1;
        size_t want_end = closed_by_shared ? (last_end + 63) / 64 * 64 : last_end;
        CHECK(k->start + k->numel_unpadded == want_end, "bucket %d unpadded end: start %zu unpadded %zu want_end %zu shared %d first %d last %d nb %d dp %d bs %zu", b, k->start, k->numel_unpadded, want_end, shared, k->first_param, k->last_param, L.num_buckets, dp, L.bucket_size);
    }
    CHECK(L.buckets[0].last_param == n - 1 && L.buckets[L.num_buckets - 1].first_param == 0, "param coverage");
    CHECK(unpadded_sum == L.numel_unpadded, "numel_unpadded");
    for (int i = 0; i < n; i++) {
        const Zero1ParamPlace* p = &L.params[i];
        const Zero1Bucket* k = &L.buckets[p->bucket];
        CHECK(p->start % 64 == 0 && p->end - p->start == numels[i], "param %d place", i);
        CHECK(p->start >= k->start && p->end <= k->end, "param %d outside bucket %d", i, p->bucket);
        CHECK(i == n - 1 || p->start >= L.params[i + 1].end, "param %d overlaps %d", i, i + 1);
        if (i == shared) CHECK(k->first_param == i && k->last_param == i, "shared param %d not alone", i);
    }
    // Coverage: count owners of every element of every parameter.
    size_t total = 0;
    size_t* offset = (size_t*)malloc((size_t)n * sizeof(size_t));
    for (int i = 0; i < n; i++) { offset[i] = total; total += numels[i]; }
    unsigned char* owners = (unsigned char*)calloc(total, 1);
    size_t owned_total = 0;
    for (int r = 0; r < dp; r++) {
        Zero1RankShards S;
        if (zero1_shards_build(&S, &L, r, err, sizeof(err)) != 0) { CHECK(0, "%s", err); continue; }
        CHECK(S.owned_numel == L.numel / (size_t)dp, "owned %zu", S.owned_numel);
        owned_total += S.owned_numel;
        for (int b = 0; b < S.num_buckets; b++) {
            const Zero1BucketShard* bs = &S.buckets[b];
            const Zero1Bucket* k = &L.buckets[b];
            for (int v = 0; v < bs->num_views; v++) {
                const Zero1ParamView* pv = &bs->views[v];
                size_t len = pv->gbuf_world.end - pv->gbuf_world.start;
                const Zero1ParamPlace* p = &L.params[pv->param];
                CHECK(pv->gbuf_world.start >= bs->shard.start && pv->gbuf_world.end <= bs->shard.end && len > 0,
                      "view outside shard");
                CHECK(pv->gbuf_world_in_bucket.start == pv->gbuf_world.start - k->start &&
                      pv->gbuf_local.start == pv->gbuf_world.start - bs->shard.start &&
                      pv->param_range.start == pv->gbuf_world.start - p->start, "view origins");
                CHECK(pv->gbuf_world_in_bucket.end - pv->gbuf_world_in_bucket.start == len &&
                      pv->gbuf_local.end - pv->gbuf_local.start == len &&
                      pv->param_range.end - pv->param_range.start == len, "view sizes");
                CHECK(pv->param_range.end <= numels[pv->param], "param range past the tensor");
                CHECK(v == 0 || pv->gbuf_world.start >= bs->views[v - 1].gbuf_world.end, "views out of order");
                if (pv->param_range.end > numels[pv->param]) continue;
                for (size_t e = pv->param_range.start; e < pv->param_range.end; e++) {
                    unsigned char* c = &owners[offset[pv->param] + e];
                    if (*c < 255) (*c)++;
                }
            }
        }
        zero1_shards_free(&S);
    }
    CHECK(owned_total == L.numel, "shards do not tile the buffer");
    size_t bad = 0;
    for (size_t e = 0; e < total; e++) bad += owners[e] != 1;
    CHECK(bad == 0, "%zu parameter elements not owned exactly once (dp %d, %d params)", bad, dp, n);
    free(owners);
    free(offset);
    zero1_layout_free(&L);
}

static void test_random_coverage(int configs) {
    static const int primes[] = {2, 3, 5, 7, 11, 13, 17, 31, 37, 61};
    for (int c = 0; c < configs; c++) {
        int dp = (c % 3 == 0) ? primes[rng_int(0, 9)] : rng_int(1, 64);
        int n = rng_int(1, 12);
        int mode = rng_int(0, 2);
        long long bs = mode == 0 ? 0 : rng_int(1, 3000);
        size_t numels[12];
        int max_size = mode == 0 ? 5000 : (int)(3 * bs + 1);
        for (int i = 0; i < n; i++) numels[i] = (size_t)rng_int(1, max_size);
        int shared_choice = rng_int(0, 4);
        int shared = shared_choice == 0 ? 0 : shared_choice == 1 ? n - 1 : shared_choice == 2 ? n / 2 : -1;
        check_layout_and_coverage(numels, n, dp, bs, rng_int(0, 3) == 0, shared);
    }
}

// ------------------------------------------------------------------ the layer-wise layout (Muon)

static Zero1Layout layerwise_ok(const size_t* numels, int n, int dp, long long bucket_size) {
    Zero1Layout L;
    char err[256] = {0};
    CHECK(zero1_layerwise_layout_build(&L, numels, n, dp, bucket_size, 0, err, sizeof(err)) == 0, "%s", err);
    return L;
}

static void check_owned(const Zero1Layout* L, int rank, const int* want, int n) {
    int got[8];
    int count = zero1_layerwise_owned(L, rank, got);
    CHECK(count == n, "rank %d owns %d matrices, want %d", rank, count, n);
    for (int k = 0; k < n && k < count; k++) CHECK(got[k] == want[k], "rank %d's matrix %d is %d, want %d", rank, k, got[k], want[k]);
}

// One chunk (no bucket size), DP=2, numels {100, 200, 100, 300}; shards padded to
// lcm(64, lcm(2,128)/2) = 64. LPT order: 300 (p3), 200 (p1), then the two 100s in backprop
// order, p2 before p0. Loads [0,0]: p3 -> shard 0 at 0, load 300; p1 -> shard 1 at 0, load 200;
// p2 -> shard 1 (200 < 300) at 256 (200 up to 64), load 356; p0 -> shard 0 (300 < 356) at 320,
// load 420. Shard size 420 -> 448, bucket [0, 896): p3 [0,300), p0 [320,420) in shard 0,
// p1 [448,648), p2 [704,804) in shard 1; unpadded 700.
static void test_layerwise_lpt(void) {
    size_t numels[] = {100, 200, 100, 300};
    Zero1Layout L = layerwise_ok(numels, 4, 2, 0);
    CHECK(L.num_buckets == 1, "num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 896, 700, 0, 3);
    check_param(&L, 3, 0, 300, 0);
    check_param(&L, 0, 320, 420, 0);
    check_param(&L, 1, 448, 648, 0);
    check_param(&L, 2, 704, 804, 0);
    const int rank0[] = {0, 3}, rank1[] = {1, 2};
    check_owned(&L, 0, rank0, 2);
    check_owned(&L, 1, rank1, 2);
    CHECK(L.numel == 896 && L.numel_unpadded == 700, "numel %zu unpadded %zu", L.numel, L.numel_unpadded);
    zero1_layout_free(&L);
}

// The chunk rule, DP=2, bucket_size 120, numels {300, 50, 50, 50}. Backprop: p3 50 (threshold
// max(120, int(2*50*0.9)=90) = 120), p2 100, p1 150 >= 120 closes {p3, p2, p1}: all 50, so
// backprop order: p3 -> shard 0 at 0, p2 -> shard 1 at 0, p1 -> shard 0 (tie: lowest) at 64,
// load 114 -> shard 128, bucket 0 [0,256). p0 300: threshold int(2*300*0.9) = 540, the walk
// ends: bucket 1 = p0 in shard 0, [256,556), shard 300 -> 320, [256,896); shard 1 all padding.
// The floor: {64, 64, 640} at bucket 100 stays one chunk (640 + 64 + 64 < int(2*640*0.9) = 1152):
// p2 [0,640) in shard 0, p1 [640,704) and p0 [704,768) in shard 1, bucket [0,1280).
static void test_layerwise_chunks(void) {
    size_t numels[] = {300, 50, 50, 50};
    Zero1Layout L = layerwise_ok(numels, 4, 2, 120);
    CHECK(L.num_buckets == 2, "num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 256, 150, 1, 3);
    check_bucket(&L, 1, 256, 896, 300, 0, 0);
    check_param(&L, 3, 0, 50, 0);
    check_param(&L, 1, 64, 114, 0);
    check_param(&L, 2, 128, 178, 0);
    check_param(&L, 0, 256, 556, 1);
    const int rank0[] = {0, 1, 3}, rank1[] = {2};
    check_owned(&L, 0, rank0, 3);
    check_owned(&L, 1, rank1, 1);
    zero1_layout_free(&L);

    size_t dominated[] = {64, 64, 640};
    L = layerwise_ok(dominated, 3, 2, 100);
    CHECK(L.num_buckets == 1, "the floor keeps one chunk: num_buckets %d", L.num_buckets);
    check_bucket(&L, 0, 0, 1280, 768, 0, 2);
    check_param(&L, 2, 0, 640, 0);
    check_param(&L, 1, 640, 704, 0);
    check_param(&L, 0, 704, 768, 0);
    zero1_layout_free(&L);
}

// Both buffers, DP=1, no bucket size: numels {10, 192, 5, 128}, Muon's p1 and p3. AdamW's
// {10, 5} element-wise: 5 at [0,5), 10 at [64,74), end 128. Layer-wise: 192 at [0,192), 128
// at [192,320), shard lcm(64, 128/1) = 128: 320 -> 384. The shared embedding may not be Muon's.
static void test_full_layout(void) {
    size_t numels[] = {10, 192, 5, 128};
    int is_muon[] = {0, 1, 0, 1};
    Zero1FullLayout F;
    char err[256] = {0};
    CHECK(zero1_full_layout_build(&F, numels, is_muon, 4, 1, 0, 0, -1, err, sizeof(err)) == 0, "%s", err);
    CHECK(F.adamw.num_params == 2 && F.adamw_param[0] == 0 && F.adamw_param[1] == 2, "AdamW's params");
    CHECK(F.layerwise.num_params == 2 && F.layerwise_param[0] == 1 && F.layerwise_param[1] == 3, "Muon's params");
    check_param(&F.adamw, 1, 0, 5, 0);
    check_param(&F.adamw, 0, 64, 74, 0);
    CHECK(F.adamw.numel == 128, "AdamW numel %zu", F.adamw.numel);
    check_param(&F.layerwise, 0, 0, 192, 0);
    check_param(&F.layerwise, 1, 192, 320, 0);
    CHECK(F.layerwise.numel == 384, "layer-wise numel %zu", F.layerwise.numel);
    zero1_full_layout_free(&F);
    is_muon[0] = 1;
    CHECK(zero1_full_layout_build(&F, numels, is_muon, 4, 2, 0, 0, 0, err, sizeof(err)) == -1 && strstr(err, "AdamW"),
          "a Muon shared embedding must be refused: %s", err);
    CHECK(zero1_layerwise_layout_build(&F.layerwise, numels, 0, 2, 0, 0, err, sizeof(err)) == -1, "no matrices");
}

// Random lists: every matrix once, whole in its owner's shard, starts on 64, shards on the
// divisor, buckets back to back; the shards' views (shards.h) are whole matrices.
static void test_layerwise_random(int configs) {
    for (int c = 0; c < configs; c++) {
        int dp = rng_int(1, 9), n = rng_int(1, 12), pad_busbw = rng_int(0, 4) == 0;
        long long bucket_size = rng_int(0, 2) == 0 ? 0 : rng_int(1, 4000);
        size_t numels[12];
        for (int i = 0; i < n; i++) numels[i] = (size_t)rng_int(1, 1500);
        Zero1Layout L;
        char err[256];
        if (zero1_layerwise_layout_build(&L, numels, n, dp, bucket_size, pad_busbw, err, sizeof(err)) != 0) {
            CHECK(0, "%s", err);
            continue;
        }
        size_t divisor = zero1_layerwise_shard_divisor(dp, pad_busbw), next = 0, unpadded = 0;
        for (int b = 0; b < L.num_buckets; b++) {
            const Zero1Bucket* k = &L.buckets[b];
            CHECK(k->start == next && (k->end - k->start) % ((size_t)dp * divisor) == 0, "bucket %d bounds", b);
            next = k->end;
            unpadded += k->numel_unpadded;
        }
        CHECK(L.numel == next && L.numel_unpadded == unpadded, "numel %zu unpadded %zu", L.numel, L.numel_unpadded);
        int seen = 0;
        for (int r = 0; r < dp; r++) seen += zero1_layerwise_owned(&L, r, NULL);
        CHECK(seen == n, "%d matrices owned, want %d", seen, n);
        for (int p = 0; p < n; p++) {
            const Zero1ParamPlace* q = &L.params[p];
            const Zero1Bucket* k = &L.buckets[q->bucket];
            size_t shard = (k->end - k->start) / (size_t)dp, lo = k->start + (size_t)zero1_layerwise_owner(&L, p) * shard;
            CHECK(q->start % 64 == 0 && q->end - q->start == numels[p], "matrix %d place", p);
            CHECK(q->start >= lo && q->end <= lo + shard, "matrix %d [%zu,%zu) crosses its shard [%zu,%zu)", p,
                  q->start, q->end, lo, lo + shard);
            CHECK(p == 0 || q->bucket <= L.params[p - 1].bucket, "buckets follow backprop order");
            for (int o = 0; o < p; o++) CHECK(L.params[o].end <= q->start || q->end <= L.params[o].start, "overlap");
        }
        for (int r = 0; r < dp; r++) {
            Zero1RankShards S;
            CHECK(zero1_shards_build(&S, &L, r, err, sizeof(err)) == 0, "%s", err);
            for (int b = 0; b < S.num_buckets; b++) {
                for (int v = 0; v < S.buckets[b].num_views; v++) {
                    const Zero1ParamView* pv = &S.buckets[b].views[v];
                    CHECK(pv->param_range.start == 0 && pv->param_range.end == numels[pv->param] &&
                          zero1_layerwise_owner(&L, pv->param) == r, "rank %d's view of matrix %d is not whole", r,
                          pv->param);
                }
            }
            zero1_shards_free(&S);
        }
        zero1_layout_free(&L);
    }
}

int main(void) {
    CHECK_GROUP(test_param_larger_than_bucket());
    CHECK_GROUP(test_dp1());
    CHECK_GROUP(test_shared_embedding_closes_bucket());
    CHECK_GROUP(test_bucket_rules());
    CHECK_GROUP(test_invalid_arguments());
    CHECK_GROUP(test_ledger());
    CHECK_GROUP(test_random_coverage(3000));
    CHECK_GROUP(test_layerwise_lpt());
    CHECK_GROUP(test_layerwise_chunks());
    CHECK_GROUP(test_full_layout());
    CHECK_GROUP(test_layerwise_random(1000));
    return done_testing();
}
