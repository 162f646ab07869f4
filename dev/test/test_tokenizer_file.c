/*
 * Checks run/tokenizer.h (the decoder trainers use) on prepro_text's output:
 * the shards, decoded token by token through the tokenizer file, must give back the
 * input text with "<|endoftext|>" before every document, i.e.
 *     "<|endoftext|>" + input.replace("\n\n", "\n\n<|endoftext|>")
 * and invalid ids / a missing file must be handled without crashing.
 *
 * usage: test_tokenizer_file TOKENIZER.bin VAL.bin TRAIN.bin INPUT.txt
 * Prints TAP (dev/test/check.h): one line for all the checks.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev/test/check.h"
#include "run/tokenizer.h"
#include "run/files.h"

// Appends the shard's tokens to *tokens (grown as needed).
static void read_shard(const char* path, uint16_t** tokens, size_t* count) {
    FILE* f = fopenCheck(path, "rb");
    long size = file_size_of(f, path);
    int32_t header[256];
    freadCheck(header, sizeof(int32_t), 256, f, path);
    CHECK(header[0] == 20240520, "%s: magic %d", path, header[0]);
    CHECK(header[1] == 1, "%s: version %d", path, header[1]);
    CHECK(header[2] >= 0 && (long)header[2] * 2 + 1024 == size, "%s: count %d vs size %ld", path, header[2], size);
    size_t n = (size_t)(size - 1024) / 2;
    *tokens = (uint16_t*)realloc(*tokens, (*count + n) * sizeof(uint16_t) + 1);
    if (*tokens == NULL) fatal("out of memory");
    if (n > 0) freadCheck(*tokens + *count, sizeof(uint16_t), n, f, path);
    *count += n;
    fcloseCheck(f, path);
}

int main(int argc, char** argv) {
    if (argc != 5) fatal("usage: %s TOKENIZER.bin VAL.bin TRAIN.bin INPUT.txt", argv[0]);

    Tokenizer missing;
    tokenizer_init(&missing, "/nonexistent/dir/gpt2_tokenizer.bin");
    CHECK(!missing.init_ok, "a missing file must leave the tokenizer disabled");
    CHECK(tokenizer_decode(&missing, 0) == NULL, "a disabled tokenizer decodes to NULL");
    tokenizer_free(&missing);

    Tokenizer tok;
    tokenizer_init(&tok, argv[1]);
    CHECK(tok.init_ok, "tokenizer file did not load");
    CHECK(tok.vocab_size == 50257, "vocab size %u", tok.vocab_size);
    CHECK(tok.eot_token == 50256, "eot %u", tok.eot_token);
    CHECK(tokenizer_decode(&tok, tok.vocab_size) == NULL, "an id past the vocab must decode to NULL");
    CHECK(tokenizer_decode(&tok, UINT32_MAX) == NULL, "UINT32_MAX must decode to NULL");
    const char* eot = tokenizer_decode(&tok, tok.eot_token);
    CHECK(eot != NULL && strcmp(eot, "<|endoftext|>") == 0, "eot decodes to '%s'", eot ? eot : "(null)");
    const char* hello = tokenizer_decode(&tok, 15496);  // known GPT-2 ids
    const char* world = tokenizer_decode(&tok, 995);
    CHECK(hello && strcmp(hello, "Hello") == 0, "15496 -> '%s'", hello ? hello : "(null)");
    CHECK(world && strcmp(world, " world") == 0, "995 -> '%s'", world ? world : "(null)");

    uint16_t* tokens = NULL;
    size_t count = 0;
    read_shard(argv[2], &tokens, &count);
    read_shard(argv[3], &tokens, &count);

    size_t n_in;
    char* input = read_whole_file(argv[4], &n_in);
    // expected = "<|endoftext|>" + input.replace("\n\n", "\n\n<|endoftext|>")
    size_t cap = 2 * n_in + 64, len = 0, docs = 1;
    char* expected = (char*)mallocCheck(cap);
    const char* marker = "<|endoftext|>";
    size_t mlen = strlen(marker);
    memcpy(expected, marker, mlen);
    len = mlen;
    for (size_t i = 0; i < n_in;) {
        if (i + 1 < n_in && input[i] == '\n' && input[i + 1] == '\n') {
            if (len + 2 + mlen > cap) { cap *= 2; expected = (char*)realloc(expected, cap); }
            memcpy(expected + len, "\n\n", 2);
            memcpy(expected + len + 2, marker, mlen);
            len += 2 + mlen;
            i += 2;
            docs++;
        } else {
            if (len + 1 > cap) { cap *= 2; expected = (char*)realloc(expected, cap); }
            expected[len++] = input[i++];
        }
    }

    size_t eots = 0, pos = 0, first_mismatch = (size_t)-1;
    for (size_t k = 0; k < count; k++) {
        if (tokens[k] == tok.eot_token) eots++;
        const char* s = tokenizer_decode(&tok, tokens[k]);
        if (s == NULL) { CHECK(0, "token %zu (id %u) does not decode", k, tokens[k]); break; }
        size_t sl = strlen(s);
        if (pos + sl > len || memcmp(expected + pos, s, sl) != 0) { first_mismatch = k; break; }
        pos += sl;
    }
    CHECK(first_mismatch == (size_t)-1, "decoded text differs from the input at token %zu (byte %zu)", first_mismatch, pos);
    CHECK(first_mismatch != (size_t)-1 || pos == len, "decoded %zu bytes, expected %zu", pos, len);
    CHECK(eots == docs, "%zu <|endoftext|> tokens, %zu documents", eots, docs);

    free(expected);
    free(input);
    free(tokens);
    tokenizer_free(&tok);
    tap_checks("test_tokenizer_file: %zu tokens decode to the input (%zu bytes, %zu documents)", count, n_in, docs);
    return done_testing();
}
