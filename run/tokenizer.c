// run/tokenizer.c: what run/tokenizer.h declares.
#include "run/tokenizer.h"

void tokenizer_init(Tokenizer* t, const char* path) {
    memset(t, 0, sizeof(*t));
    const char* kind = not_regular_file_kind(path);
    if (kind) fatal("tokenizer '%s' is %s, not a regular file: pass a file", path, kind);
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "warning: no tokenizer file at '%s'; samples will print as token ids "
                        "(make data writes data/gpt2_tokenizer.bin; --tokenizer FILE names another)\n", path);
        return;
    }
    // Every token takes at least 2 bytes (a length byte, and length >= 1), which bounds the
    // vocabulary size by the file size before anything is allocated for it.
    long size = file_size_of(f, path);
    uint32_t header[256];
    if (size < (long)sizeof(header)) fatal("%s: too small to be a tokenizer file (%ld bytes)", path, size);
    freadCheck(header, sizeof(uint32_t), 256, f, path);
    if (header[0] != TOKENIZER_MAGIC) fatal("%s: bad magic %u (want %d): not an llm.c tokenizer file", path, header[0], TOKENIZER_MAGIC);
    if (header[1] == 1) {
        t->eot_token = 50256;  // version 1 predates the field; GPT-2's value
    } else if (header[1] == 2) {
        t->eot_token = header[3];
    } else {
        fatal("%s: unsupported tokenizer version %u (want 1 or 2)", path, header[1]);
    }
    t->vocab_size = (uint32_t)field_range_check(path, "header field vocab size", header[2], 1, TOKENIZER_MAX_VOCAB);
    if ((long long)t->vocab_size * 2 > size - (long long)sizeof(header)) {
        fatal("%s: header field vocab size = %u needs at least %lld bytes, but the file has %ld (truncated or corrupt)",
              path, t->vocab_size, (long long)sizeof(header) + 2LL * t->vocab_size, size);
    }
    field_range_check(path, "header field <|endoftext|> id", t->eot_token, 0, (long long)t->vocab_size - 1);
    t->token_table = (char**)callocCheck(t->vocab_size, sizeof(char*));
    for (uint32_t i = 0; i < t->vocab_size; i++) {
        unsigned char len;
        freadCheck(&len, 1, 1, f, path);
        if (len == 0) fatal("%s: token %u has length 0", path, i);
        char* s = (char*)mallocCheck((size_t)len + 1);
        freadCheck(s, 1, len, f, path);
        s[len] = '\0';
        t->token_table[i] = s;
    }
    long used = ftell(f);
    if (used != size) fatal("%s: %ld bytes after the last of %u tokens: corrupt", path, size - used, t->vocab_size);
    fcloseCheck(f, path);
    t->init_ok = 1;
}

const char* tokenizer_decode(const Tokenizer* t, uint32_t token) {
    if (!t->init_ok || token >= t->vocab_size) return NULL;
    return t->token_table[token];
}

void tokenizer_print(const Tokenizer* t, uint32_t token) {
    const char* s = tokenizer_decode(t, token);
    if (s == NULL) {
        printf("[%u]", token);
        return;
    }
    if (s[0] == '\0') return;
    if (s[1] == '\0') {
        unsigned char c = (unsigned char)s[0];
        if (c < 0x80 && !(isprint(c) || isspace(c))) return;
    }
    fputs(s, stdout);
}

void tokenizer_free(Tokenizer* t) {
    if (t->token_table != NULL) {
        for (uint32_t i = 0; i < t->vocab_size; i++) free(t->token_table[i]);
        free(t->token_table);
    }
    memset(t, 0, sizeof(*t));
}
