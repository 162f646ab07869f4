/*
 * The GPT-2 token DECODER the trainers use to print samples.
 *
 * Reads llm.c's tokenizer file (written by tools/prepro_text):
 *   uint32 header[256]: [0] = 20240328 magic, [1] = version (1 or 2), [2] = vocab size,
 *                       [3] = <|endoftext|> id (version 2; version 1 implies 50256)
 *   then per token: uint8 length, that many raw bytes.
 * Sampling is optional, so a missing file only warns and leaves the tokenizer disabled
 * (init_ok == 0, decode returns NULL); a file that exists but is not a tokenizer file is
 * an error.
 */
#ifndef RUN_TOKENIZER_H
#define RUN_TOKENIZER_H

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_MAX_VOCAB (1 << 24)  // GPT-2 has 50257 tokens, Llama 3 128256

typedef struct {
    uint32_t vocab_size;
    uint32_t eot_token;
    char** token_table;  // NUL-terminated bytes of each token
    int init_ok;
} Tokenizer;

void tokenizer_init(Tokenizer* t, const char* path);

// Bytes of a token as a C string; NULL when disabled or for an out-of-range id.
// (A token holding a NUL byte prints as empty; GPT-2's only such token is byte 0.)
const char* tokenizer_decode(const Tokenizer* t, uint32_t token);

// Prints a token without dumping control bytes on the terminal: a lone byte that is
// neither printable nor whitespace is skipped (multi-byte tokens are UTF-8 pieces and
// print as they are). Disabled tokenizer or bad id: prints the id in brackets.
void tokenizer_print(const Tokenizer* t, uint32_t token);

void tokenizer_free(Tokenizer* t);

#ifdef __cplusplus
}
#endif
#endif
