// zero1/layout.c: the Megatron DistributedOptimizer buffer layout (see layout.h).
// Errors go back to the caller (-1 and a message in err), running out of memory included.
#include "zero1/layout.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int zero1_error(char* err, size_t err_len, const char* fmt, ...) {
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static size_t gcd_size(size_t a, size_t b) {
    while (b != 0) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

size_t zero1_lcm(size_t a, size_t b) { return a / gcd_size(a, b) * b; }

int zero1_round_up(size_t x, size_t m, size_t* out) {
    size_t rem = x % m;
    if (rem == 0) {
        *out = x;
        return 1;
    }
    size_t add = m - rem;
    if (x > SIZE_MAX - add) return 0;
    *out = x + add;
    return 1;
}

long long zero1_default_bucket_size(int dp) {
    long long by_dp = 1000000LL * (long long)dp;
    return by_dp > 40000000LL ? by_dp : 40000000LL;
}

long long zero1_ddp_bucket_size(long long requested, int data_parallel_size, int overlap_grad_reduce) {
    if (!overlap_grad_reduce) return 0;
    return requested < 0 ? zero1_default_bucket_size(data_parallel_size) : requested;
}

size_t zero1_bucket_divisor(int dp, int pad_busbw) {
    if (dp < 1) return 0;
    size_t d = zero1_lcm((size_t)dp, ZERO1_BUCKET_ALIGN);
    if (pad_busbw) d = zero1_lcm(d, ZERO1_BUSBW_ALIGN);  // < 2^47 for any int dp
    return d;
}

// Walk state while placing parameters; mirrors the locals of Megatron's layout loop.
typedef struct {
    Zero1Layout* layout;
    size_t divisor;
    size_t bucket_start;
    int open_params;       // parameters placed in the open bucket
    int open_lowest_index; // definition index of the last one placed (walk is reverse)
    int open_highest_index;
} LayoutWalk;

// Closes the open bucket at close_point; returns 0 on overflow. The next bucket starts
// at the padded end, which is also where the next parameter may start.
static int close_bucket(LayoutWalk* w, size_t close_point, size_t* padded_end) {
    size_t end;
    if (!zero1_round_up(close_point, w->divisor, &end)) return 0;
    Zero1Bucket* b = &w->layout->buckets[w->layout->num_buckets++];
    b->start = w->bucket_start;
    b->end = end;
    b->numel_unpadded = close_point - w->bucket_start;
    b->first_param = w->open_lowest_index;
    b->last_param = w->open_highest_index;
    w->layout->numel_unpadded += b->numel_unpadded;
    w->bucket_start = end;
    w->open_params = 0;
    *padded_end = end;
    return 1;
}

int zero1_layout_begin(Zero1Layout* L, const size_t* numels, int num_params, int dp, long long bucket_size,
                       int pad_busbw, int shared_embedding, char* err, size_t err_len) {
    memset(L, 0, sizeof(*L));
    if (dp < 1) return zero1_error(err, err_len, "data-parallel size must be >= 1 (got %d)", dp);
    if (num_params < 1 || numels == NULL)
        return zero1_error(err, err_len, "the parameter list is empty");
    if (shared_embedding < -1 || shared_embedding >= num_params)
        return zero1_error(err, err_len, "shared-embedding index %d is outside 0..%d", shared_embedding,
                            num_params - 1);
    for (int i = 0; i < num_params; i++) {
        if (numels[i] == 0)
            return zero1_error(err, err_len, "parameter %d has zero elements (every parameter needs >= 1)", i);
    }
    if (bucket_size < 0) bucket_size = zero1_default_bucket_size(dp);
    L->dp = dp;
    L->bucket_size = (size_t)bucket_size;
    L->pad_busbw = pad_busbw ? 1 : 0;
    L->shared_embedding = shared_embedding;
    L->num_params = num_params;
    L->params = (Zero1ParamPlace*)calloc((size_t)num_params, sizeof(Zero1ParamPlace));
    // Every bucket holds at least one parameter, so num_params buckets always suffice.
    L->buckets = (Zero1Bucket*)calloc((size_t)num_params, sizeof(Zero1Bucket));
    if (L->params == NULL || L->buckets == NULL) {
        zero1_layout_free(L);
        return zero1_error(err, err_len, "out of memory for a layout of %d parameters", num_params);
    }
    return 0;
}

int zero1_layout_build(Zero1Layout* out, const size_t* numels, int num_params, int dp,
                       long long bucket_size, int pad_busbw, int shared_embedding,
                       char* err, size_t err_len) {
    if (out == NULL) return zero1_error(err, err_len, "zero1_layout_build: out is NULL");
    memset(out, 0, sizeof(*out));
    Zero1Layout L;
    if (zero1_layout_begin(&L, numels, num_params, dp, bucket_size, pad_busbw, shared_embedding, err, err_len) != 0)
        return -1;

    LayoutWalk w;
    memset(&w, 0, sizeof(w));
    w.layout = &L;
    w.divisor = zero1_bucket_divisor(dp, pad_busbw);

    size_t next_start = 0, param_end = 0;
    int overflow = 0;
    for (int i = num_params - 1; i >= 0 && !overflow; i--) {
        int needs_own_bucket = (i == shared_embedding);
        size_t start;
        if (!zero1_round_up(next_start, ZERO1_PARAM_START_ALIGN, &start)) { overflow = 1; break; }
        // The own-bucket parameter must not share a bucket with what came before it.
        if (needs_own_bucket && w.open_params > 0) {
            if (!close_bucket(&w, start, &start)) { overflow = 1; break; }
        }
        if (numels[i] > SIZE_MAX - start) { overflow = 1; break; }
        param_end = start + numels[i];
        L.params[i].start = start;
        L.params[i].end = param_end;
        L.params[i].bucket = L.num_buckets;  // index of the open bucket
        if (w.open_params == 0) w.open_highest_index = i;
        w.open_lowest_index = i;
        w.open_params++;
        int bucket_full = L.bucket_size > 0 && param_end - w.bucket_start >= L.bucket_size;
        if (bucket_full || needs_own_bucket) {
            if (!close_bucket(&w, param_end, &next_start)) { overflow = 1; break; }
        } else {
            next_start = param_end;
        }
    }
    if (!overflow && w.open_params > 0) {  // the tail bucket
        size_t ignored;
        if (!close_bucket(&w, param_end, &ignored)) overflow = 1;
    }
    if (overflow) {
        free(L.params);
        free(L.buckets);
        return zero1_error(err, err_len, "parameter sizes overflow 64-bit buffer offsets");
    }
    L.numel = L.buckets[L.num_buckets - 1].end;
    *out = L;
    return 0;
}

void zero1_layout_free(Zero1Layout* layout) {
    if (layout == NULL) return;
    free(layout->params);
    free(layout->buckets);
    free(layout->members);
    memset(layout, 0, sizeof(*layout));
}

size_t zero1_layout_largest_bucket(const Zero1Layout* layout) {
    size_t largest = 0;
    for (int b = 0; b < layout->num_buckets; b++) {
        size_t n = layout->buckets[b].end - layout->buckets[b].start;
        if (n > largest) largest = n;
    }
    return largest;
}
