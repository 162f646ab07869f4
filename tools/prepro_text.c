/*
 * Text -> llm.c token shards with GPT-2's BPE, in C (Python never prepares data).
 *
 *   ./prepro_text [--encoder PATH] [--merges PATH] [--input PATH] [--out-dir DIR]
 *                 [--name NAME] [--val-tokens N]
 *
 * Like llm.c's tinyshakespeare preparation, the documents are the blank-line separated
 * sections (each ends after its "\n\n") and each is prefixed with <|endoftext|>. The first
 * N tokens are the val split, the rest train. Writes, each to a temporary name renamed
 * when complete:
 *   DIR/NAME_val.bin, DIR/NAME_train.bin   int32 header[256] {20240520, 1, count}, uint16 ids
 *   DIR/gpt2_tokenizer.bin                 llm.c tokenizer file (run/tokenizer.h)
 *   DIR/NAME_manifest.txt                  tokens, bytes and CRC32C of each shard, written last
 * (tools/shard_writer.h, shared with prepro_corpus, which reads JSONL corpora).
 *   DIR/NAME_hellaswag.bin                 a small multiple-choice eval in llm.c's HellaSwag
 *                                          format (run/hellaswag_file.h), --eval-items of them
 *
 * The eval items come from the documents of the val split (held out from training) that
 * have a first line and three more: the context is those first three lines (in
 * tinyshakespeare the speaker and two lines of the speech), the right completion the next
 * line, the true continuation; the three wrong ones are the right completions of items a
 * quarter, a half and three quarters of the set away (other speeches), and the label, the
 * right one's place among the four, is pseudo-random. Context and completions are encoded
 * on their own (the context ends with a newline, which BPE never merges across, so the
 * tokens are those of the joined text). Every row fits --eval-seq-len positions.
 *
 * Test modes:
 *   --encode-stdin     print the ids of stdin (ordinary text, no <|endoftext|>), one line
 *   --roundtrip FILE   encode FILE, decode, exit 0 only if the bytes are identical
 *   --pretokens-stdin  print each pre-token's byte length, one line (debugging the pattern)
 *   --records          with the two modes above: stdin holds NUL-separated records, each
 *                      handled on its own and printed on its own line (many edge cases,
 *                      each with its own end of text, in one run)
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "run/hellaswag_file.h"
#include "run/files.h"
#include "tools/bpe.h"
#include "tools/shard_writer.h"

static const char* DOWNLOAD_HINT =
    "The inputs are public files:\n"
    "  encoder.json, vocab.bpe: OpenAI's GPT-2 release, e.g.\n"
    "    https://openaipublic.blob.core.windows.net/gpt-2/models/124M/encoder.json\n"
    "    https://openaipublic.blob.core.windows.net/gpt-2/models/124M/vocab.bpe\n"
    "  input.txt (tinyshakespeare): karpathy/char-rnn,\n"
    "    https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt\n"
    "Put them in dev/data/{gpt2,tinyshakespeare}/ (or set LLMC_DATA_DIR for\n"
    "scripts/prepare_data.sh), or pass --encoder/--merges/--input. See docs/data.md.";

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void require_file(const char* path, const char* what) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "error: cannot read %s '%s': %s\n%s\n", what, path, strerror(errno), DOWNLOAD_HINT);
        exit(1);
    }
    fclose(f);
}

static unsigned char* read_stream(FILE* f, size_t* size) {
    BpeBytes b = {0};
    unsigned char chunk[1 << 16];
    size_t got;
    while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0) bpe_bytes_append(&b, chunk, got);
    if (ferror(f)) fatal("read error on input");
    bpe_bytes_append(&b, "", 1);  // NUL, so an empty input still has a buffer
    *size = b.len - 1;
    return b.data;
}

// ----------------------------------------------------------------------------
// The HellaSwag-format eval set

#define EVAL_MAX_COMPLETION_TOKENS 16  // a longer line is not used as a completion
#define EVAL_CONTEXT_LINES 3

typedef struct {
    size_t start, end;  // bytes of the text
    size_t tokens_end;  // the tokens of the documents up to this one's end
} DocSpan;

typedef struct {
    BpeIds ctx, end;  // the context and the right completion
} EvalCandidate;

// The end of the line starting at text[i] (just past its '\n', or n).
static size_t line_end(const unsigned char* text, size_t n, size_t i) {
    while (i < n && text[i] != '\n') i++;
    return i < n ? i + 1 : n;
}

// A candidate from the document text[a..b): its first three lines and the next one, all
// non-empty; 0 if it has fewer or they do not fit seq_len positions with any completion.
static int eval_candidate(BpeEncoder* enc, const unsigned char* text, size_t a, size_t b, int seq_len,
                          EvalCandidate* c) {
    size_t cut[EVAL_CONTEXT_LINES + 2];
    cut[0] = a;
    for (int k = 1; k <= EVAL_CONTEXT_LINES + 1; k++) {
        if (cut[k - 1] >= b || text[cut[k - 1]] == '\n') return 0;  // too few lines, or an empty one
        cut[k] = line_end(text, b, cut[k - 1]);
    }
    memset(c, 0, sizeof(*c));
    bpe_encode(enc, text + a, cut[EVAL_CONTEXT_LINES] - a, &c->ctx);
    bpe_encode(enc, text + cut[EVAL_CONTEXT_LINES], cut[EVAL_CONTEXT_LINES + 1] - cut[EVAL_CONTEXT_LINES], &c->end);
    // Any candidate's completion may become another's wrong one: all must fit any context.
    int fits = c->end.len <= EVAL_MAX_COMPLETION_TOKENS && (int)(c->ctx.len + EVAL_MAX_COMPLETION_TOKENS) - 1 <= seq_len;
    if (!fits) {
        bpe_ids_free(&c->ctx);
        bpe_ids_free(&c->end);
    }
    return fits;
}

static int same_ids(const BpeIds* x, const BpeIds* y) {
    return x->len == y->len && memcmp(x->ids, y->ids, x->len * sizeof(int)) == 0;
}

static uint16_t* ids_to_u16(const BpeIds* ids) {
    uint16_t* out = (uint16_t*)mallocCheck((ids->len ? ids->len : 1) * sizeof(uint16_t));
    for (size_t k = 0; k < ids->len; k++) out[k] = (uint16_t)ids->ids[k];
    return out;
}

// Item k of n from the candidates: the right completion at a pseudo-random place, the
// others from the candidates a quarter, a half and three quarters away (the next one
// after each whose completion differs from every one taken so far).
static void eval_item(const EvalCandidate* cands, int n, int k, HellaswagItem* it) {
    uint64_t h = (uint64_t)(k + 1) * 0x9E3779B97F4A7C15ull;
    it->index = k;
    it->label = (int)((h ^ (h >> 29)) % HELLASWAG_COMPLETIONS);
    it->ctx = ids_to_u16(&cands[k].ctx);
    it->ctx_len = (int)cands[k].ctx.len;
    const BpeIds* taken[HELLASWAG_COMPLETIONS] = {&cands[k].end};
    for (int w = 1; w < HELLASWAG_COMPLETIONS; w++) {
        int from = (k + w * n / HELLASWAG_COMPLETIONS) % n, tries = 0;
        for (;; from = (from + 1) % n) {
            int dup = 0;
            for (int q = 0; q < w; q++) dup |= same_ids(&cands[from].end, taken[q]);
            if (!dup) break;
            if (++tries == n) fatal("eval set: fewer than %d different completions", HELLASWAG_COMPLETIONS);
        }
        taken[w] = &cands[from].end;
    }
    // taken[0] is the right one: it goes to the label's place, the wrong ones in order around it.
    for (int j = 0, w = 1; j < HELLASWAG_COMPLETIONS; j++) {
        const BpeIds* e = j == it->label ? taken[0] : taken[w++];
        it->end[j] = ids_to_u16(e);
        it->end_len[j] = (int)e->len;
    }
}

// Up to `want` items from the documents whose tokens lie in the first val_tokens (the val
// split); writes path. Returns the number of items written.
static int write_eval_set(BpeEncoder* enc, const unsigned char* text, const DocSpan* spans, size_t docs,
                          size_t val_tokens, int want, int seq_len, const char* path) {
    EvalCandidate* cands = (EvalCandidate*)callocCheck((size_t)want, sizeof(EvalCandidate));
    int n = 0;
    for (size_t d = 0; d < docs && spans[d].tokens_end <= val_tokens && n < want; d++) {
        n += eval_candidate(enc, text, spans[d].start, spans[d].end, seq_len, &cands[n]);
    }
    if (n < HELLASWAG_COMPLETIONS) {
        fprintf(stderr, "warning: the val split has %d documents fit for eval items; no %s\n", n, path);
        n = 0;
    } else {
        if (n < want) fprintf(stderr, "warning: the val split has documents for %d eval items, not %d\n", n, want);
        HellaswagItem* items = (HellaswagItem*)callocCheck((size_t)n, sizeof(HellaswagItem));
        for (int k = 0; k < n; k++) eval_item(cands, n, k, &items[k]);
        char tmp[PATH_MAX_LEN];
        path_format(tmp, sizeof(tmp), "%s.tmp", path);
        hellaswag_write(tmp, items, n);
        if (rename(tmp, path) != 0) fatal("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        for (int k = 0; k < n; k++) {
            free((void*)items[k].ctx);
            for (int j = 0; j < HELLASWAG_COMPLETIONS; j++) free((void*)items[k].end[j]);
        }
        free(items);
    }
    for (int k = 0; k < want; k++) {
        bpe_ids_free(&cands[k].ctx);
        bpe_ids_free(&cands[k].end);
    }
    free(cands);
    return n;
}

static void print_ids(const BpeIds* ids) {
    for (size_t k = 0; k < ids->len; k++) printf(k ? " %d" : "%d", ids->ids[k]);
    printf("\n");
}

static void print_pretokens(const unsigned char* text, size_t n, void* unused) {
    for (size_t i = 0, first = 1; i < n; first = 0) {
        size_t j = bpe_pretoken_end(text, n, i);
        printf(first ? "%zu" : " %zu", j - i);
        i = j;
    }
    printf("\n");
}

static void print_encoding(const unsigned char* text, size_t n, void* encoder) {
    BpeIds ids = {0};
    bpe_encode((BpeEncoder*)encoder, text, n, &ids);
    print_ids(&ids);
    bpe_ids_free(&ids);
}

// Runs fn on the whole text, or with split on each NUL-separated record.
static void for_each_record(const unsigned char* text, size_t n, int split,
                            void (*fn)(const unsigned char*, size_t, void*), void* ctx) {
    if (!split) {
        fn(text, n, ctx);
        return;
    }
    size_t start = 0;
    for (size_t k = 0; k <= n; k++) {
        if (k == n || text[k] == 0) {
            if (k > start || k < n) fn(text + start, k - start, ctx);
            start = k + 1;
        }
    }
}

static long long count_arg(const char* flag, const char* v, long long min, long long max) {
    char* end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno != 0 || *end != '\0' || end == v || x < min || x > max) {
        if (max == LLONG_MAX) fatal("%s wants a count >= %lld, got '%s'", flag, min, v);
        fatal("%s wants a count in %lld..%lld, got '%s'", flag, min, max, v);
    }
    return x;
}

static void usage(void) {
    fprintf(stderr,
            "usage: ./prepro_text [--encoder PATH] [--merges PATH] [--input PATH] [--out-dir DIR]\n"
            "                     [--name NAME] [--val-tokens N] [--eval-items N] [--eval-seq-len T]\n"
            "       ./prepro_text --encode-stdin | --pretokens-stdin [--records] | --roundtrip FILE\n"
            "defaults: --encoder dev/data/gpt2/encoder.json --merges dev/data/gpt2/vocab.bpe\n"
            "          --input dev/data/tinyshakespeare/input.txt --out-dir data\n"
            "          --name tinyshakespeare --val-tokens 32768 --eval-items 40 (0: none) --eval-seq-len 64\n");
}

int main(int argc, char** argv) {
    files_size_limit_fails_writes();
    const char* encoder_path = "dev/data/gpt2/encoder.json";
    const char* merges_path = "dev/data/gpt2/vocab.bpe";
    const char* input_path = "dev/data/tinyshakespeare/input.txt";
    const char* out_dir = "data";
    const char* name = "tinyshakespeare";
    const char* roundtrip_path = NULL;
    long long val_tokens = 32768;
    long long eval_items = 40, eval_seq_len = 64;
    int encode_stdin = 0, pretokens_stdin = 0, records = 0;

    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(a, "--encode-stdin") == 0) { encode_stdin = 1; continue; }
        if (strcmp(a, "--pretokens-stdin") == 0) { pretokens_stdin = 1; continue; }
        if (strcmp(a, "--records") == 0) { records = 1; continue; }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { usage(); return 0; }
        if (!has_value) { usage(); fatal("option '%s' is unknown or needs a value", a); }
        const char* v = argv[++i];
        if (strcmp(a, "--encoder") == 0) encoder_path = v;
        else if (strcmp(a, "--merges") == 0) merges_path = v;
        else if (strcmp(a, "--input") == 0) input_path = v;
        else if (strcmp(a, "--out-dir") == 0) out_dir = v;
        else if (strcmp(a, "--name") == 0) name = v;
        else if (strcmp(a, "--roundtrip") == 0) roundtrip_path = v;
        else if (strcmp(a, "--val-tokens") == 0) val_tokens = count_arg(a, v, 0, LLONG_MAX);
        else if (strcmp(a, "--eval-items") == 0) {
            eval_items = count_arg(a, v, 0, HELLASWAG_MAX_ITEMS);
            // each item's wrong completions are the right ones of three other items
            if (eval_items > 0 && eval_items < HELLASWAG_COMPLETIONS) fatal("--eval-items: 0 (none) or at least %d", HELLASWAG_COMPLETIONS);
        }
        else if (strcmp(a, "--eval-seq-len") == 0) eval_seq_len = count_arg(a, v, EVAL_MAX_COMPLETION_TOKENS + 1, 1 << 20);
        else {
            usage();
            fatal("unknown option '%s'", a);
        }
    }

    if (pretokens_stdin) {  // needs no vocabulary
        size_t n;
        unsigned char* text = read_stream(stdin, &n);
        for_each_record(text, n, records, print_pretokens, NULL);
        free(text);
        return 0;
    }

    require_file(encoder_path, "GPT-2 encoder (encoder.json)");
    require_file(merges_path, "GPT-2 merges (vocab.bpe)");
    BpeEncoder enc;
    double t0 = now_seconds();
    bpe_init(&enc, encoder_path, merges_path);
    double t_load = now_seconds() - t0;

    if (encode_stdin) {
        size_t n;
        unsigned char* text = read_stream(stdin, &n);
        for_each_record(text, n, records, print_encoding, &enc);
        free(text);
        bpe_free(&enc);
        return 0;
    }

    if (roundtrip_path != NULL) {
        size_t n;
        unsigned char* text = (unsigned char*)read_whole_file(roundtrip_path, &n);
        BpeIds ids = {0};
        double t1 = now_seconds();
        bpe_encode(&enc, text, n, &ids);
        double t_enc = now_seconds() - t1;
        BpeBytes back = {0};
        bpe_decode(&enc, ids.ids, ids.len, &back);
        int same = back.len == n && (n == 0 || memcmp(back.data, text, n) == 0);
        printf("roundtrip %s: %zu bytes -> %zu tokens in %.3f s (%.2f MB/s): %s\n", roundtrip_path, n, ids.len,
               t_enc, t_enc > 0 ? (double)n / t_enc / 1e6 : 0.0, same ? "identical" : "DIFFERENT");
        free(back.data);
        bpe_ids_free(&ids);
        free(text);
        bpe_free(&enc);
        return same ? 0 : 1;
    }

    require_file(input_path, "input text");
    size_t n;
    unsigned char* text = (unsigned char*)read_whole_file(input_path, &n);
    BpeIds ids = {0};
    double t1 = now_seconds();
    // Documents end right after each "\n\n" (found left to right, without overlap, like
    // Python's str.replace), so the blank line stays with the section it closes.
    size_t doc_start = 0, docs = 0;
    DocSpan* spans = NULL;  // every document's bytes and where its tokens end
    size_t spans_cap = 0;
    while (1) {
        const unsigned char* hit = NULL;
        for (size_t k = doc_start; k + 1 < n; k++) {
            if (text[k] == '\n' && text[k + 1] == '\n') { hit = text + k; break; }
        }
        size_t doc_end = hit ? (size_t)(hit - text) + 2 : n;
        bpe_ids_push(&ids, enc.eot_token);
        bpe_encode(&enc, text + doc_start, doc_end - doc_start, &ids);
        if (docs == spans_cap) {
            spans_cap = spans_cap ? 2 * spans_cap : 1024;
            spans = (DocSpan*)realloc(spans, spans_cap * sizeof(DocSpan));
            if (!spans) fatal("out of memory recording %zu documents", spans_cap);
        }
        spans[docs] = (DocSpan){doc_start, doc_end, ids.len};
        docs++;
        if (!hit) break;
        doc_start = doc_end;
    }
    double t_enc = now_seconds() - t1;

    size_t n_val = (size_t)val_tokens < ids.len ? (size_t)val_tokens : ids.len;
    if (n_val == ids.len && ids.len > 0) {
        fprintf(stderr, "warning: --val-tokens %lld takes every token; the train split is empty\n", val_tokens);
    }
    shard_make_dir(out_dir);
    ShardWriter w;
    shard_writer_init(&w, out_dir, name, INT32_MAX, n_val, 0, enc.vocab_size);
    shard_writer_push(&w, ids.ids, ids.len);
    shard_writer_finish(&w);
    char tok_path[PATH_MAX_LEN];
    path_format(tok_path, sizeof(tok_path), "%s/gpt2_tokenizer.bin", out_dir);
    tokenizer_file_write(&enc, tok_path);
    shard_writer_write_manifest(&w, "prepro_text", NULL);
    char eval_path[PATH_MAX_LEN];
    path_format(eval_path, sizeof(eval_path), "%s/%s_hellaswag.bin", out_dir, name);
    int items = eval_items > 0 ? write_eval_set(&enc, text, spans, docs, n_val, (int)eval_items, (int)eval_seq_len,
                                                eval_path)
                               : 0;
    printf("prepro_text: %s: %zu bytes, %zu documents -> %zu tokens (vocab %d, %d merges; load %.2f s, encode %.2f s)\n",
           input_path, n, docs, ids.len, enc.vocab_size, enc.num_merges, t_load, t_enc);
    for (size_t k = 0; k < w.n_done; k++) printf("  %s: %zu tokens\n", w.done[k].path, w.done[k].tokens);
    printf("  %s: %d tokens\n", tok_path, enc.vocab_size);
    if (items > 0) printf("  %s: %d eval items, every row within %lld positions\n", eval_path, items, eval_seq_len);
    shard_writer_free(&w);
    free(spans);
    bpe_ids_free(&ids);
    free(text);
    bpe_free(&enc);
    return 0;
}
