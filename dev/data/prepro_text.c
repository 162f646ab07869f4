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
 *   DIR/gpt2_tokenizer.bin                 llm.c tokenizer file (llmc/tokenizer.h)
 *   DIR/NAME_manifest.txt                  tokens, bytes and CRC32C of each shard, written last
 * (llmc/shard_writer.h, shared with prepro_corpus, which reads JSONL corpora).
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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "llmc/bpe.h"
#include "llmc/shard_writer.h"
#include "llmc/utils.h"

static const char* DOWNLOAD_HINT =
    "The inputs are public files:\n"
    "  encoder.json, vocab.bpe: OpenAI's GPT-2 release, e.g.\n"
    "    https://openaipublic.blob.core.windows.net/gpt-2/models/124M/encoder.json\n"
    "    https://openaipublic.blob.core.windows.net/gpt-2/models/124M/vocab.bpe\n"
    "  input.txt (tinyshakespeare): karpathy/char-rnn,\n"
    "    https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt\n"
    "Put them in dev/data/{gpt2,tinyshakespeare}/ (or set LLMC_DATA_DIR for\n"
    "scripts/prepare_data.sh), or pass --encoder/--merges/--input. See README.md.";

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

static unsigned char* read_whole_file(const char* path, size_t* size) {
    FILE* f = fopenCheck(path, "rb");
    unsigned char* data = read_stream(f, size);
    fcloseCheck(f, path);
    return data;
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

static void usage(void) {
    fprintf(stderr,
            "usage: ./prepro_text [--encoder PATH] [--merges PATH] [--input PATH] [--out-dir DIR]\n"
            "                     [--name NAME] [--val-tokens N]\n"
            "       ./prepro_text --encode-stdin | --pretokens-stdin [--records] | --roundtrip FILE\n"
            "defaults: --encoder dev/data/gpt2/encoder.json --merges dev/data/gpt2/vocab.bpe\n"
            "          --input dev/data/tinyshakespeare/input.txt --out-dir data\n"
            "          --name tinyshakespeare --val-tokens 32768\n");
}

int main(int argc, char** argv) {
    const char* encoder_path = "dev/data/gpt2/encoder.json";
    const char* merges_path = "dev/data/gpt2/vocab.bpe";
    const char* input_path = "dev/data/tinyshakespeare/input.txt";
    const char* out_dir = "data";
    const char* name = "tinyshakespeare";
    const char* roundtrip_path = NULL;
    long long val_tokens = 32768;
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
        else if (strcmp(a, "--val-tokens") == 0) {
            char* end;
            errno = 0;
            val_tokens = strtoll(v, &end, 10);
            if (errno != 0 || *end != '\0' || end == v || val_tokens < 0) fatal("--val-tokens wants a count >= 0, got '%s'", v);
        } else {
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
        unsigned char* text = read_whole_file(roundtrip_path, &n);
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
    unsigned char* text = read_whole_file(input_path, &n);
    BpeIds ids = {0};
    double t1 = now_seconds();
    // Documents end right after each "\n\n" (found left to right, without overlap, like
    // Python's str.replace), so the blank line stays with the section it closes.
    size_t doc_start = 0, docs = 0;
    while (1) {
        const unsigned char* hit = NULL;
        for (size_t k = doc_start; k + 1 < n; k++) {
            if (text[k] == '\n' && text[k + 1] == '\n') { hit = text + k; break; }
        }
        size_t doc_end = hit ? (size_t)(hit - text) + 2 : n;
        bpe_ids_push(&ids, enc.eot_token);
        bpe_encode(&enc, text + doc_start, doc_end - doc_start, &ids);
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
    printf("prepro_text: %s: %zu bytes, %zu documents -> %zu tokens (vocab %d, %d merges; load %.2f s, encode %.2f s)\n",
           input_path, n, docs, ids.len, enc.vocab_size, enc.num_merges, t_load, t_enc);
    for (size_t k = 0; k < w.n_done; k++) printf("  %s: %zu tokens\n", w.done[k].path, w.done[k].tokens);
    printf("  %s: %d tokens\n", tok_path, enc.vocab_size);
    shard_writer_free(&w);
    bpe_ids_free(&ids);
    free(text);
    bpe_free(&enc);
    return 0;
}
