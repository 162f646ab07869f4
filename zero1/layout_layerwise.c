// zero1/layout_layerwise.c: Megatron's layer-wise buffer and the two-buffer split of ZeRO-1
// with Muon (see layout_layerwise.h). Errors go back to the caller (-1 and a message).
#include "zero1/layout_layerwise.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t zero1_layerwise_shard_divisor(int dp, int pad_busbw) {
    if (dp < 1) return 0;
    return zero1_lcm(ZERO1_PARAM_START_ALIGN, zero1_bucket_divisor(dp, pad_busbw) / (size_t)dp);
}

// One matrix of the chunk being packed; LPT sorts them.
typedef struct {
    size_t numel;
    int param;
} LptItem;

// numel descending; equal sizes in backprop order (the higher index first), as a stable sort
// of the backprop walk leaves them.
static int lpt_order(const void* a, const void* b) {
    const LptItem* x = (const LptItem*)a;
    const LptItem* y = (const LptItem*)b;
    if (x->numel != y->numel) return x->numel > y->numel ? -1 : 1;
    return y->param - x->param;
}

// The first shard with the smallest load.
static int least_loaded_shard(const size_t* load, int dp) {
    int best = 0;
    for (int s = 1; s < dp; s++) {
        if (load[s] < load[best]) best = s;
    }
    return best;
}

static size_t largest_load(const size_t* load, int dp) {
    size_t m = 0;
    for (int s = 0; s < dp; s++) {
        if (load[s] > m) m = load[s];
    }
    return m;
}

// The walk's state; load and items are scratch for the bucket being packed.
typedef struct {
    Zero1Layout* layout;
    const size_t* numels;
    size_t shard_divisor;
    size_t* load;    // dp entries
    LptItem* items;  // num_params entries
} LayerwiseWalk;

// Packs the chunk of params first..last (definition indices; the walk met last first) into
// the next bucket. Returns 0 on overflow.
static int emit_bucket(LayerwiseWalk* w, int first, int last) {
    Zero1Layout* L = w->layout;
    int dp = L->dp, count = last - first + 1;
    size_t chunk_numel = 0;
    for (int k = 0; k < count; k++) {
        w->items[k].param = last - k;
        w->items[k].numel = w->numels[last - k];
        chunk_numel += w->items[k].numel;  // no overflow: the caller summed the same numels
    }
    qsort(w->items, (size_t)count, sizeof(LptItem), lpt_order);
    memset(w->load, 0, (size_t)dp * sizeof(size_t));
    // Place each matrix at its offset in its shard for now; the shard size is known after.
    for (int k = 0; k < count; k++) {
        int s = least_loaded_shard(w->load, dp);
        size_t place;
        if (!zero1_round_up(w->load[s], ZERO1_PARAM_START_ALIGN, &place) || w->items[k].numel > SIZE_MAX - place)
            return 0;
        L->params[w->items[k].param].start = place;
        L->params[w->items[k].param].bucket = s;  // the shard, until the bucket's start is known
        w->load[s] = place + w->items[k].numel;
    }
    size_t shard_size, bucket_numel;
    size_t start = L->num_buckets ? L->buckets[L->num_buckets - 1].end : 0;
    if (!zero1_round_up(largest_load(w->load, dp), w->shard_divisor, &shard_size) ||
        __builtin_mul_overflow(shard_size, (size_t)dp, &bucket_numel) || bucket_numel > SIZE_MAX - start)
        return 0;
    for (int p = first; p <= last; p++) {
        Zero1ParamPlace* place = &L->params[p];
        place->start += start + (size_t)place->bucket * shard_size;
        place->end = place->start + w->numels[p];
        place->bucket = L->num_buckets;
    }
    Zero1Bucket* b = &L->buckets[L->num_buckets++];
    b->start = start;
    b->end = start + bucket_numel;
    b->numel_unpadded = chunk_numel;
    b->first_param = first;
    b->last_param = last;
    L->numel_unpadded += chunk_numel;
    L->numel = b->end;
    return 1;
}

// Whether the open chunk closes: numel >= max(bucket_size, int(DP x largest x 0.9)), the
// product in double and truncated, as Megatron's Python computes it.
static int chunk_closes(size_t bucket_size, int dp, size_t chunk_numel, size_t chunk_largest) {
    if (bucket_size == 0) return 0;
    double floor = (double)((unsigned long long)dp * chunk_largest) * ZERO1_LAYERWISE_PADDING_FLOOR;
    size_t threshold = floor >= 18446744073709551615.0 ? SIZE_MAX : (size_t)floor;
    if (threshold < bucket_size) threshold = bucket_size;
    return chunk_numel >= threshold;
}

int zero1_layerwise_layout_build(Zero1Layout* out, const size_t* numels, int num_params, int dp,
                                 long long bucket_size, int pad_busbw, char* err, size_t err_len) {
    if (out == NULL) return zero1_error(err, err_len, "zero1_layerwise_layout_build: out is NULL");
    memset(out, 0, sizeof(*out));
    Zero1Layout L;
    if (zero1_layout_begin(&L, numels, num_params, dp, bucket_size, pad_busbw, -1, err, err_len) != 0) return -1;
    size_t total = 0;
    for (int i = 0; i < num_params; i++) {
        if (__builtin_add_overflow(total, numels[i], &total)) {
            zero1_layout_free(&L);
            return zero1_error(err, err_len, "matrix sizes overflow 64-bit buffer offsets");
        }
    }
    LayerwiseWalk w = {&L, numels, zero1_layerwise_shard_divisor(dp, pad_busbw), NULL, NULL};
    w.load = (size_t*)calloc((size_t)dp, sizeof(size_t));
    w.items = (LptItem*)calloc((size_t)num_params, sizeof(LptItem));
    int ok = w.load && w.items;
    if (!ok) zero1_error(err, err_len, "out of memory for a layer-wise layout of %d matrices at DP %d", num_params, dp);

    int open_last = num_params - 1;  // the chunk is open_last down to the walk's matrix
    size_t chunk_numel = 0, chunk_largest = 0;
    for (int i = num_params - 1; i >= 0 && ok; i--) {
        chunk_numel += numels[i];
        if (numels[i] > chunk_largest) chunk_largest = numels[i];
        if (i == 0 || chunk_closes(L.bucket_size, dp, chunk_numel, chunk_largest)) {
            ok = emit_bucket(&w, i, open_last);
            if (!ok) zero1_error(err, err_len, "matrix sizes overflow 64-bit buffer offsets at DP %d", dp);
            open_last = i - 1;
            chunk_numel = chunk_largest = 0;
        }
    }
    free(w.load);
    free(w.items);
    if (!ok) {
        zero1_layout_free(&L);
        return -1;
    }
    *out = L;
    return 0;
}

int zero1_layerwise_owner(const Zero1Layout* layerwise, int p) {
    const Zero1ParamPlace* place = &layerwise->params[p];
    const Zero1Bucket* b = &layerwise->buckets[place->bucket];
    return (int)((place->start - b->start) / ((b->end - b->start) / (size_t)layerwise->dp));
}

int zero1_layerwise_owned(const Zero1Layout* layerwise, int rank, int* owned) {
    int n = 0;
    for (int p = 0; p < layerwise->num_params; p++) {
        if (zero1_layerwise_owner(layerwise, p) != rank) continue;
        if (owned != NULL) owned[n] = p;
        n++;
    }
    return n;
}

// ------------------------------------------------------------------ both buffers

// The numels of the params whose is_muon is `muon`, into numels and map (buffer -> model).
static int select_params(const size_t* all, const int* is_muon, int num_params, int muon, size_t* numels, int* map) {
    int n = 0;
    for (int i = 0; i < num_params; i++) {
        if ((is_muon[i] != 0) != muon) continue;
        numels[n] = all[i];
        map[n++] = i;
    }
    return n;
}

int zero1_full_layout_build(Zero1FullLayout* out, const size_t* numels, const int* is_muon, int num_params,
                            int dp, long long bucket_size, int pad_busbw, int shared_embedding, char* err,
                            size_t err_len) {
    if (out == NULL) return zero1_error(err, err_len, "zero1_full_layout_build: out is NULL");
    memset(out, 0, sizeof(*out));
    if (num_params < 1 || numels == NULL || is_muon == NULL)
        return zero1_error(err, err_len, "the parameter list is empty");
    if (shared_embedding < -1 || shared_embedding >= num_params)
        return zero1_error(err, err_len, "shared-embedding index %d is outside 0..%d", shared_embedding,
                           num_params - 1);
    if (shared_embedding >= 0 && is_muon[shared_embedding])
        return zero1_error(err, err_len, "parameter %d is both the shared embedding and a Muon matrix (an embedding "
                           "is AdamW's)", shared_embedding);
    Zero1FullLayout F;
    memset(&F, 0, sizeof(F));
    F.num_params = num_params;
    size_t* scratch = (size_t*)calloc((size_t)num_params, sizeof(size_t));
    F.adamw_param = (int*)calloc((size_t)num_params, sizeof(int));
    F.layerwise_param = (int*)calloc((size_t)num_params, sizeof(int));
    int rc = 0;
    if (scratch == NULL || F.adamw_param == NULL || F.layerwise_param == NULL) {
        rc = zero1_error(err, err_len, "out of memory for the buffers of %d parameters", num_params);
    }
    int n = rc ? 0 : select_params(numels, is_muon, num_params, 0, scratch, F.adamw_param);
    if (n > 0) {
        int shared = -1;  // the shared embedding's index in the AdamW buffer
        for (int k = 0; k < n; k++) {
            if (F.adamw_param[k] == shared_embedding) shared = k;
        }
        rc = zero1_layout_build(&F.adamw, scratch, n, dp, bucket_size, pad_busbw, shared, err, err_len);
    }
    n = rc ? 0 : select_params(numels, is_muon, num_params, 1, scratch, F.layerwise_param);
    if (n > 0) rc = zero1_layerwise_layout_build(&F.layerwise, scratch, n, dp, bucket_size, pad_busbw, err, err_len);
    free(scratch);
    if (rc != 0) {
        zero1_full_layout_free(&F);
        return -1;
    }
    F.adamw.dp = F.layerwise.dp = dp;  // an empty buffer still says its DP
    *out = F;
    return 0;
}

void zero1_full_layout_free(Zero1FullLayout* full) {
    if (full == NULL) return;
    zero1_layout_free(&full->adamw);
    zero1_layout_free(&full->layerwise);
    free(full->adamw_param);
    free(full->layerwise_param);
    memset(full, 0, sizeof(*full));
}

int zero1_full_layout_merge(const Zero1FullLayout* full, Zero1Layout* out, char* err, size_t err_len) {
    memset(out, 0, sizeof(*out));
    const Zero1Layout *A = &full->adamw, *M = &full->layerwise;
    Zero1Layout L;
    memset(&L, 0, sizeof(L));
    L.dp = A->dp;
    L.bucket_size = A->num_params ? A->bucket_size : M->bucket_size;
    L.pad_busbw = A->num_params ? A->pad_busbw : M->pad_busbw;
    L.shared_embedding = A->shared_embedding >= 0 ? full->adamw_param[A->shared_embedding] : -1;
    L.num_params = full->num_params;
    L.num_buckets = A->num_buckets + M->num_buckets;
    L.num_muon_buckets = M->num_buckets;
    L.params = (Zero1ParamPlace*)calloc((size_t)L.num_params, sizeof(Zero1ParamPlace));
    L.buckets = (Zero1Bucket*)calloc((size_t)(L.num_buckets > 0 ? L.num_buckets : 1), sizeof(Zero1Bucket));
    L.members = (int*)calloc((size_t)L.num_params, sizeof(int));
    if (L.params == NULL || L.buckets == NULL || L.members == NULL) {
        zero1_layout_free(&L);
        return zero1_error(err, err_len, "out of memory for the layout of %d parameters", L.num_params);
    }
    for (int k = 0; k < A->num_params; k++) L.params[full->adamw_param[k]] = A->params[k];
    int used = 0;
    for (int b = 0; b < A->num_buckets; b++) {  // AdamW's buckets: the Muon matrices between their params leave gaps
        Zero1Bucket* bk = &L.buckets[b];
        *bk = A->buckets[b];
        bk->members = L.members + used;
        bk->num_members = zero1_bucket_num_params(&A->buckets[b]);
        for (int i = 0; i < bk->num_members; i++) L.members[used + i] = full->adamw_param[zero1_bucket_param(&A->buckets[b], i)];
        bk->first_param = full->adamw_param[A->buckets[b].first_param];
        bk->last_param = full->adamw_param[A->buckets[b].last_param];
        used += bk->num_members;
    }
    size_t shift = A->numel;
    for (int b = 0; b < M->num_buckets; b++) {
        const Zero1Bucket* src = &M->buckets[b];
        Zero1Bucket* bk = &L.buckets[A->num_buckets + b];
        *bk = *src;
        bk->start += shift;
        bk->end += shift;
        int* members = L.members + used;
        int n = 0;
        for (int k = src->first_param; k <= src->last_param; k++) members[n++] = k;
        // buffer order: by start (insertion sort: a bucket holds a few matrices)
        for (int i = 1; i < n; i++) {
            for (int j = i; j > 0 && M->params[members[j]].start < M->params[members[j - 1]].start; j--) {
                int t = members[j];
                members[j] = members[j - 1];
                members[j - 1] = t;
            }
        }
        bk->first_param = full->num_params;
        bk->last_param = -1;
        for (int i = 0; i < n; i++) {
            int model = full->layerwise_param[members[i]];
            Zero1ParamPlace place = M->params[members[i]];
            place.start += shift;
            place.end += shift;
            place.bucket = A->num_buckets + b;
            L.params[model] = place;
            members[i] = model;
            if (model < bk->first_param) bk->first_param = model;
            if (model > bk->last_param) bk->last_param = model;
        }
        bk->members = members;
        bk->num_members = n;
        used += n;
    }
    L.numel = shift + M->numel;
    L.numel_unpadded = A->numel_unpadded + M->numel_unpadded;
    *out = L;
    return 0;
}

int zero1_run_layout_build(Zero1Layout* out, const size_t* numels, const int* is_muon, int num_params, int dp,
                           long long bucket_size, int pad_busbw, int shared_embedding, char* err, size_t err_len) {
    if (is_muon == NULL) {
        return zero1_layout_build(out, numels, num_params, dp, bucket_size, pad_busbw, shared_embedding, err, err_len);
    }
    Zero1FullLayout full;
    if (zero1_full_layout_build(&full, numels, is_muon, num_params, dp, bucket_size, pad_busbw, shared_embedding, err,
                                err_len) != 0) {
        memset(out, 0, sizeof(*out));
        return -1;
    }
    int rc = zero1_full_layout_merge(&full, out, err, err_len);
    zero1_full_layout_free(&full);
    return rc;
}

size_t zero1_layerwise_most_owned(const Zero1Layout* L) {
    size_t most = 0;
    for (int r = 0; r < L->dp; r++) {
        size_t mine = 0;
        for (int p = 0; p < L->num_params; p++) {
            if (zero1_layerwise_owner(L, p) == r) mine += L->params[p].end - L->params[p].start;
        }
        if (mine > most) most = mine;
    }
    return most;
}
