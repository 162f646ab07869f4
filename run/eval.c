// run/eval.c: what run/eval.h declares.
#include "run/eval.h"

#include <math.h>

#include "llmc/rng.h"

int validation_batches(const DataLoader* val, int M, int rank) {
    size_t have = dataloader_batches_per_epoch(val);
    if ((size_t)M <= have) return M;
    if (rank == 0) {
        printf("validation: -m %d, but the val split holds %zu batches of B=%d x T=%d tokens; reading those %zu\n", M,
               have, val->B, val->T, have);
    }
    return (int)have;
}

int validation_next_batch(DataLoader* val, int* walked, int batches, int rank, int world) {
    if (*walked == 0) dataloader_reset(val);
    while (*walked < batches) {
        int j = (*walked)++;
        if (j % world == rank) {
            dataloader_next_batch(val);
            return 1;
        }
        dataloader_skip(val, 1);
    }
    return 0;
}

// Row j of item it in T positions: inputs are the row's tokens but the last, targets its
// tokens but the first.
static void hellaswag_fill_row(const HellaswagItem* it, int j, int T, int* inputs, int* targets) {
    int len = it->ctx_len + it->end_len[j];
    for (int t = 0; t < T; t++) {
        int in = t, out = t + 1;
        inputs[t] = in < len - 1 ? (in < it->ctx_len ? it->ctx[in] : it->end[j][in - it->ctx_len]) : 0;
        targets[t] = out < len ? (out < it->ctx_len ? it->ctx[out] : it->end[j][out - it->ctx_len]) : 0;
    }
}

// The mean loss of completion j over the positions that predict its tokens.
static double hellaswag_completion_loss(const HellaswagItem* it, int j, const float* row_losses) {
    double sum = 0.0;
    for (int t = it->ctx_len - 1; t < it->ctx_len - 1 + it->end_len[j]; t++) sum += row_losses[t];
    return sum / it->end_len[j];
}

static int hellaswag_predict(const double* loss) {
    int best = 0;
    for (int j = 1; j < HELLASWAG_COMPLETIONS; j++) {
        if (loss[j] < loss[best]) best = j;
    }
    return best;
}

// This rank's share of items: [lo, hi).
static void hellaswag_share(int n, int rank, int world, int* lo, int* hi) {
    *lo = (int)((long long)n * rank / world);
    *hi = (int)((long long)n * (rank + 1) / world);
}

// The row-th row of items [lo, ...): its item and completion.
static const HellaswagItem* hellaswag_row_item(const HellaswagSet* s, int lo, int row, int* j) {
    *j = row % HELLASWAG_COMPLETIONS;
    return &s->items[lo + row / HELLASWAG_COMPLETIONS];
}

// Every completion loss of items [lo, hi): loss[(k - lo) * 4 + j]. Each forward takes up to
// B rows, padded to the longest of them (at most T positions, checked at start-up).
static void hellaswag_losses(const HellaswagSet* s, int lo, int hi, HellaswagForward forward, void* ctx, int B,
                             int T, double* loss) {
    int rows = (hi - lo) * HELLASWAG_COMPLETIONS, j;
    int* inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    int* targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    float* losses = (float*)mallocCheck((size_t)B * T * sizeof(float));
    for (int first = 0; first < rows; first += B) {
        int n = rows - first < B ? rows - first : B, width = 1;
        for (int r = 0; r < n; r++) {
            const HellaswagItem* it = hellaswag_row_item(s, lo, first + r, &j);
            if (hellaswag_row_positions(it, j) > width) width = hellaswag_row_positions(it, j);
        }
        for (int r = 0; r < n; r++) {
            const HellaswagItem* it = hellaswag_row_item(s, lo, first + r, &j);
            hellaswag_fill_row(it, j, width, inputs + (size_t)r * width, targets + (size_t)r * width);
        }
        forward(ctx, inputs, targets, n, width, losses);
        for (int r = 0; r < n; r++) {
            const HellaswagItem* it = hellaswag_row_item(s, lo, first + r, &j);
            loss[first + r] = hellaswag_completion_loss(it, j, losses + (size_t)r * width);
        }
    }
    free(inputs);
    free(targets);
    free(losses);
}

void hellaswag_dump(const HellaswagSet* s, const double* mine, int lo, int hi, int rank,
                    const char* path) {
    size_t n = (size_t)s->num_items * HELLASWAG_COMPLETIONS;
    double* all = (double*)callocCheck(n, sizeof(double));
    memcpy(all + (size_t)lo * HELLASWAG_COMPLETIONS, mine, (size_t)(hi - lo) * HELLASWAG_COMPLETIONS * sizeof(double));
    mpi_allreduce_sum_deadline(all, n, MPI_DOUBLE, "hellaswag dump all-reduce", -1);
    if (rank == 0) {
        FILE* f = fopenCheck(path, "w");
        for (int k = 0; k < s->num_items; k++) {
            const double* l = all + (size_t)k * HELLASWAG_COMPLETIONS;
            fprintf(f, "%d %d %d %d %.9g %.9g %.9g %.9g\n", k, s->items[k].index, s->items[k].label, hellaswag_predict(l),
                    l[0], l[1], l[2], l[3]);
        }
        fcloseCheck(f, path);
    }
    free(all);
}

HellaswagScore hellaswag_evaluate(const HellaswagSet* s, HellaswagForward forward, void* ctx, int B, int T,
                                  int rank, int world, const char* dump_path) {
    int lo, hi;
    hellaswag_share(s->num_items, rank, world, &lo, &hi);
    double* loss = (double*)mallocCheck(((size_t)(hi - lo) * HELLASWAG_COMPLETIONS + 1) * sizeof(double));
    hellaswag_losses(s, lo, hi, forward, ctx, B, T, loss);
    int counts[2] = {0, hi - lo};  // correct, total
    for (int k = lo; k < hi; k++) counts[0] += hellaswag_predict(loss + (size_t)(k - lo) * HELLASWAG_COMPLETIONS) == s->items[k].label;
    mpi_allreduce_sum_deadline(counts, 2, MPI_INT, "hellaswag all-reduce", -1);
    if (dump_path) hellaswag_dump(s, loss, lo, hi, rank, dump_path);
    free(loss);
    HellaswagScore score = {counts[0], counts[1]};
    return score;
}

// Samples the next token from the first V logits (softmax computed in place).
static int sample_from_logits(float* logits, int V, float coin) {
    float maxv = -INFINITY, sum = 0.0f;
    for (int v = 0; v < V; v++) maxv = fmaxf(maxv, logits[v]);
    for (int v = 0; v < V; v++) sum += (logits[v] = expf(logits[v] - maxv));
    for (int v = 0; v < V; v++) logits[v] /= sum;
    return sample_from_probs(logits, V, coin);
}

void print_sample(void* ctx, NextTokenLogits next_logits, const GPT2Config* c, int T, int gen_tokens, int rank,
                  const Tokenizer* tok, uint64_t* rng_state) {
    int* tokens = (int*)mallocCheck((size_t)T * sizeof(int));
    float* logits = (float*)mallocCheck((size_t)c->padded_vocab_size * sizeof(float));
    int eot = tok->init_ok ? (int)tok->eot_token : 50256;
    tokens[0] = eot < c->vocab_size ? eot : 0;
    if (rank == 0) printf("generating:\n---\n");
    int len = 1;
    for (int i = 0; i < gen_tokens; i++) {
        next_logits(ctx, tokens, len, logits);
        int next = sample_from_logits(logits, c->vocab_size, rng_f32(rng_state));
        if (len == T) {  // slide the context window
            memmove(tokens, tokens + 1, (size_t)(T - 1) * sizeof(int));
            len--;
        }
        tokens[len++] = next;
        if (rank == 0) {
            if (tok->init_ok) tokenizer_print(tok, (uint32_t)next);
            else printf("%d ", next);
            fflush(stdout);
        }
    }
    if (rank == 0) printf("\n---\n");
    free(tokens);
    free(logits);
}
