/*
 * GPT-2's byte-level BPE encoder, in plain C (no Python on the data path).
 *
 *   BpeEncoder enc;
 *   bpe_init(&enc, "encoder.json", "vocab.bpe");
 *   BpeIds ids = {0};
 *   bpe_encode(&enc, text, len, &ids);      // appends token ids; no special tokens
 *   ... enc.eot_token is <|endoftext|> (50256 for GPT-2)
 *   bpe_ids_free(&ids); bpe_free(&enc);
 *
 * Three stages, as in OpenAI's encoder:
 * 1. Pre-tokenisation with GPT-2's pattern
 *      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *    written by hand over UTF-8 code points (bpe_pretoken_end), with the regex's
 *    leftmost-alternative semantics, including the backtracking of \s+(?!\S).
 * 2. Byte-to-unicode: encoder.json and vocab.bpe spell every byte as a printable code
 *    point. We undo that once at load time, so that internally a token IS its raw bytes
 *    and the text is never re-spelled.
 * 3. BPE merges: within a pre-token, repeatedly merge the adjacent pair of lowest rank
 *    (all its occurrences, left to right). Implemented with a heap over a linked list,
 *    O(n log n) per pre-token so pathological inputs (a megabyte of letters) stay fast,
 *    and a cache of finished pre-tokens, since natural text repeats its words.
 *
 * Invalid UTF-8 bytes are classified like punctuation (the [^\s\p{L}\p{N}] class); the
 * encoding stays lossless because BPE works on bytes.
 */
#ifndef LLMC_BPE_H
#define LLMC_BPE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/files.h"
#include "tools/unicode_classes.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// growable buffers

typedef struct {
    int* ids;
    size_t len, cap;
} BpeIds;

static inline void bpe_ids_push(BpeIds* v, int id) {
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        int* p = (int*)realloc(v->ids, cap * sizeof(int));
        if (p == NULL) fatal("out of memory growing a token buffer to %zu ids", cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->len++] = id;
}

static inline void bpe_ids_free(BpeIds* v) {
    free(v->ids);
    v->ids = NULL;
    v->len = v->cap = 0;
}

typedef struct {
    unsigned char* data;
    size_t len, cap;
} BpeBytes;

static inline void bpe_bytes_append(BpeBytes* b, const void* src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        unsigned char* p = (unsigned char*)realloc(b->data, cap);
        if (p == NULL) fatal("out of memory growing a byte buffer to %zu bytes", cap);
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
}

// ----------------------------------------------------------------------------
// byte string -> int hash map (open addressing; keys live in the map's own arena)

typedef struct {
    uint64_t hash;  // 0 marks an empty slot
    uint32_t key_off, key_len;
    int32_t value;
} BpeMapSlot;

typedef struct {
    BpeMapSlot* slots;
    size_t cap, count;  // cap is a power of two
    BpeBytes keys;
} BpeMap;

static inline uint64_t bpe_hash_bytes(const unsigned char* s, size_t n) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h ? h : 1;  // keep 0 free for "empty"
}

static void bpe_map_init(BpeMap* m, size_t cap_pow2) {
    m->cap = cap_pow2;
    m->count = 0;
    m->slots = (BpeMapSlot*)callocCheck(m->cap, sizeof(BpeMapSlot));
    memset(&m->keys, 0, sizeof(m->keys));
}

static void bpe_map_free(BpeMap* m) {
    free(m->slots);
    free(m->keys.data);
    memset(m, 0, sizeof(*m));
}

static void bpe_map_clear(BpeMap* m) {
    memset(m->slots, 0, m->cap * sizeof(BpeMapSlot));
    m->count = 0;
    m->keys.len = 0;
}

// Returns the slot holding key, or the empty slot where it would go.
static BpeMapSlot* bpe_map_slot(const BpeMap* m, const unsigned char* key, size_t n, uint64_t h) {
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        BpeMapSlot* s = &m->slots[i];
        if (s->hash == 0) return s;
        if (s->hash == h && s->key_len == n && memcmp(m->keys.data + s->key_off, key, n) == 0) return s;
    }
}

static int bpe_map_get(const BpeMap* m, const unsigned char* key, size_t n, int32_t* value) {
    BpeMapSlot* s = bpe_map_slot(m, key, n, bpe_hash_bytes(key, n));
    if (s->hash == 0) return 0;
    *value = s->value;
    return 1;
}

static void bpe_map_grow(BpeMap* m) {
    BpeMapSlot* old = m->slots;
    size_t old_cap = m->cap;
    m->cap *= 2;
    m->slots = (BpeMapSlot*)callocCheck(m->cap, sizeof(BpeMapSlot));
    size_t mask = m->cap - 1;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].hash == 0) continue;
        size_t j = (size_t)old[i].hash & mask;
        while (m->slots[j].hash != 0) j = (j + 1) & mask;
        m->slots[j] = old[i];
    }
    free(old);
}

// Inserts key -> value unless the key is present; returns 1 if inserted.
static int bpe_map_put_new(BpeMap* m, const unsigned char* key, size_t n, int32_t value) {
    if ((m->count + 1) * 4 > m->cap * 3) bpe_map_grow(m);
    uint64_t h = bpe_hash_bytes(key, n);
    BpeMapSlot* s = bpe_map_slot(m, key, n, h);
    if (s->hash != 0) return 0;
    if (m->keys.len + n > UINT32_MAX) fatal("BPE hash map arena over 4 GiB");
    s->hash = h;
    s->key_off = (uint32_t)m->keys.len;
    s->key_len = (uint32_t)n;
    s->value = value;
    bpe_bytes_append(&m->keys, key, n);
    m->count++;
    return 1;
}

// ----------------------------------------------------------------------------
// (left id, right id) -> merge rank and merged id

typedef struct {
    uint64_t key;  // (left + 1) << 32 | (right + 1); 0 marks an empty slot
    int32_t rank, merged;
} BpePairSlot;

static inline uint64_t bpe_pair_key(int left, int right) {
    return ((uint64_t)(uint32_t)(left + 1) << 32) | (uint32_t)(right + 1);
}

static inline size_t bpe_pair_hash(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
}

// ----------------------------------------------------------------------------
// UTF-8 and the pattern's character classes

enum { BPE_CLASS_OTHER = 0, BPE_CLASS_LETTER, BPE_CLASS_NUMBER, BPE_CLASS_SPACE };

// Decodes the code point at s[0..n); *len gets its byte length. Malformed sequences
// (bad lead, missing continuation, overlong, surrogate, > U+10FFFF) decode as one byte
// with code point UINT32_MAX, which no class contains.
static inline uint32_t bpe_utf8_decode(const unsigned char* s, size_t n, size_t* len) {
    unsigned char c = s[0];
    *len = 1;
    if (c < 0x80) return c;
    int need;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) { need = 1; cp = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { need = 2; cp = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 3; cp = c & 0x07; min = 0x10000; }
    else return UINT32_MAX;
    if ((size_t)need >= n) return UINT32_MAX;
    for (int i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) return UINT32_MAX;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return UINT32_MAX;
    *len = (size_t)need + 1;
    return cp;
}

static inline int bpe_class_of(uint32_t cp) {
    if (cp < 128) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return BPE_CLASS_LETTER;
        if (cp >= '0' && cp <= '9') return BPE_CLASS_NUMBER;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return BPE_CLASS_SPACE;
        return BPE_CLASS_OTHER;
    }
    if (cp == UINT32_MAX) return BPE_CLASS_OTHER;
    if (unicode_is_letter(cp)) return BPE_CLASS_LETTER;
    if (unicode_is_number(cp)) return BPE_CLASS_NUMBER;
    if (unicode_is_space(cp)) return BPE_CLASS_SPACE;
    return BPE_CLASS_OTHER;
}

static inline int bpe_class_at(const unsigned char* s, size_t n, size_t i, size_t* len) {
    return bpe_class_of(bpe_utf8_decode(s + i, n - i, len));
}

// End (exclusive byte offset) of the pre-token that starts at text[i], i < n.
// Follows the pattern's alternatives in order; the first that matches wins.
static size_t bpe_pretoken_end(const unsigned char* t, size_t n, size_t i) {
    // 's 't 're 've 'm 'll 'd  (ASCII apostrophe, lower case only, as in GPT-2)
    if (t[i] == '\'' && i + 1 < n) {
        unsigned char a = t[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            unsigned char b = t[i + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional U+0020, then a run of one
    // class. Without the space the run would have to start with a space, which none of
    // the three classes contains, so trying "with space" first is the whole story.
    size_t k = (t[i] == ' ') ? i + 1 : i;
    size_t len = 1;
    if (k < n) {
        int cls = bpe_class_at(t, n, k, &len);
        if (cls != BPE_CLASS_SPACE) {
            size_t j = k + len;
            while (j < n && bpe_class_at(t, n, j, &len) == cls) j += len;
            return j;
        }
    }
    // Here t[i] starts whitespace. '\s+(?!\S)': take the whole run if it reaches the end
    // of the text; otherwise backtrack one code point, so the last space stays to prefix
    // the next word. A run of a single space before a non-space falls to '\s+'.
    size_t j = i, last = i;
    while (j < n && bpe_class_at(t, n, j, &len) == BPE_CLASS_SPACE) {
        last = j;
        j += len;
    }
    if (j == i) return i + len;  // unreachable by the classes above; guarantees progress
    if (j == n) return n;
    return last > i ? last : j;
}

// ----------------------------------------------------------------------------
// the encoder

typedef struct {
    int vocab_size;     // number of ids in encoder.json (50257 for GPT-2)
    int eot_token;      // id of <|endoftext|>
    int num_merges;
    unsigned char* token_arena;  // raw bytes of every token, id order
    uint32_t* token_offset;      // [vocab_size + 1]
    int byte_token[256];         // id of each single-byte token
    BpeMap vocab;                // raw bytes -> id
    BpePairSlot* pairs;          // merge table
    size_t pair_mask;
    BpeMap cache;                // pre-token bytes -> offset into cache_ids
    BpeIds cache_ids;            // [count, ids...] per cached pre-token
    // scratch for bpe_merge_word
    int *sym, *prev, *next;
    struct BpeHeapEntry* heap;
    size_t scratch_cap;
} BpeEncoder;

typedef struct BpeHeapEntry {
    int32_t rank, pos, left, right;
} BpeHeapEntry;

// GPT-2 spells byte b as code point bpe_byte_to_cp(b): printable Latin-1 bytes stand for
// themselves, the other 68 bytes take 256, 257, ... in byte order.
static inline uint32_t bpe_byte_to_cp(int b) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (printable) return (uint32_t)b;
    int rank = 0;
    for (int x = 0; x < b; x++) {
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) rank++;
    }
    return 256u + (uint32_t)rank;
}

// Inverse table: code point (< 324) -> byte, or -1.
static void bpe_build_cp_to_byte(int cp_to_byte[324]) {
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[bpe_byte_to_cp(b)] = b;
}

// Turns GPT-2's spelling (UTF-8 text) into raw bytes, appended to out.
static void bpe_unspell(const unsigned char* s, size_t n, const int cp_to_byte[324], BpeBytes* out,
                        const char* what, size_t where) {
    size_t i = 0, len;
    while (i < n) {
        uint32_t cp = bpe_utf8_decode(s + i, n - i, &len);
        if (cp >= 324 || cp_to_byte[cp] < 0) {
            fatal("%s: token near byte %zu uses a character outside GPT-2's byte alphabet", what, where);
        }
        unsigned char b = (unsigned char)cp_to_byte[cp];
        bpe_bytes_append(out, &b, 1);
        i += len;
    }
}

static void bpe_put_utf8(BpeBytes* out, uint32_t cp) {
    unsigned char b[4];
    size_t n;
    if (cp < 0x80) { b[0] = (unsigned char)cp; n = 1; }
    else if (cp < 0x800) { b[0] = (unsigned char)(0xC0 | (cp >> 6)); b[1] = (unsigned char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | (cp >> 12)); b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | (cp >> 18)); b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)); b[3] = (unsigned char)(0x80 | (cp & 0x3F)); n = 4;
    }
    bpe_bytes_append(out, b, n);
}

static inline int bpe_hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static uint32_t bpe_json_hex4(const char* s, size_t n, size_t* i, const char* path) {
    if (*i + 4 > n) fatal("%s: truncated \\u escape at byte %zu", path, *i);
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int d = bpe_hex_digit(s[*i + k]);
        if (d < 0) fatal("%s: bad \\u escape at byte %zu", path, *i);
        v = (v << 4) | (uint32_t)d;
    }
    *i += 4;
    return v;
}

// Parses the JSON string starting at s[*i] == '"' into UTF-8 bytes (out is reset).
static void bpe_json_string(const char* s, size_t n, size_t* i, BpeBytes* out, const char* path) {
    out->len = 0;
    if (*i >= n || s[*i] != '"') fatal("%s: expected a string at byte %zu", path, *i);
    (*i)++;
    while (1) {
        if (*i >= n) fatal("%s: unterminated string", path);
        char c = s[(*i)++];
        if (c == '"') return;
        if (c != '\\') {
            bpe_bytes_append(out, &c, 1);
            continue;
        }
        if (*i >= n) fatal("%s: unterminated escape", path);
        char e = s[(*i)++];
        char lit;
        switch (e) {
            case '"': lit = '"'; break;
            case '\\': lit = '\\'; break;
            case '/': lit = '/'; break;
            case 'b': lit = '\b'; break;
            case 'f': lit = '\f'; break;
            case 'n': lit = '\n'; break;
            case 'r': lit = '\r'; break;
            case 't': lit = '\t'; break;
            case 'u': {
                uint32_t cp = bpe_json_hex4(s, n, i, path);
                if (cp >= 0xD800 && cp <= 0xDBFF) {  // high surrogate: a low one must follow
                    if (*i + 2 > n || s[*i] != '\\' || s[*i + 1] != 'u') fatal("%s: lone surrogate at byte %zu", path, *i);
                    *i += 2;
                    uint32_t lo = bpe_json_hex4(s, n, i, path);
                    if (lo < 0xDC00 || lo > 0xDFFF) fatal("%s: bad surrogate pair at byte %zu", path, *i);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    fatal("%s: lone low surrogate at byte %zu", path, *i);
                }
                bpe_put_utf8(out, cp);
                continue;
            }
            default: fatal("%s: unknown escape \\%c at byte %zu", path, e, *i);
        }
        bpe_bytes_append(out, &lit, 1);
    }
}

static inline void bpe_json_ws(const char* s, size_t n, size_t* i) {
    while (*i < n && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n' || s[*i] == '\r')) (*i)++;
}

// encoder.json: {"token": id, ...}. Fills vocab map, token table, eot_token.
static void bpe_load_encoder_json(BpeEncoder* e, const char* path, const int cp_to_byte[324]) {
    size_t n, i = 0;
    char* s = read_whole_file(path, &n);
    BpeBytes key = {NULL, 0, 0}, raw = {NULL, 0, 0};
    BpeIds key_off = {NULL, 0, 0}, key_len = {NULL, 0, 0}, key_id = {NULL, 0, 0};
    BpeBytes all = {NULL, 0, 0};  // raw bytes of every key, in file order
    int max_id = -1;
    bpe_json_ws(s, n, &i);
    if (i >= n || s[i] != '{') fatal("%s: not a JSON object (expected GPT-2's encoder.json)", path);
    i++;
    bpe_json_ws(s, n, &i);
    if (i < n && s[i] == '}') fatal("%s: empty vocabulary", path);
    while (1) {
        bpe_json_ws(s, n, &i);
        size_t at = i;
        bpe_json_string(s, n, &i, &key, path);
        bpe_json_ws(s, n, &i);
        if (i >= n || s[i] != ':') fatal("%s: expected ':' at byte %zu", path, i);
        i++;
        bpe_json_ws(s, n, &i);
        long long v = 0;
        size_t digits = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            v = v * 10 + (s[i++] - '0');
            if (v > 10000000) fatal("%s: token id too large at byte %zu", path, at);
            digits++;
        }
        if (digits == 0) fatal("%s: expected a non-negative integer id at byte %zu", path, i);
        raw.len = 0;
        bpe_unspell(key.data, key.len, cp_to_byte, &raw, path, at);
        if (raw.len == 0) fatal("%s: empty token at byte %zu", path, at);
        bpe_ids_push(&key_off, (int)all.len);
        bpe_ids_push(&key_len, (int)raw.len);
        bpe_ids_push(&key_id, (int)v);
        bpe_bytes_append(&all, raw.data, raw.len);
        if ((int)v > max_id) max_id = (int)v;
        bpe_json_ws(s, n, &i);
        if (i < n && s[i] == ',') { i++; continue; }
        if (i < n && s[i] == '}') break;
        fatal("%s: expected ',' or '}' at byte %zu", path, i);
    }
    int V = max_id + 1;
    if ((size_t)V != key_id.len) fatal("%s: ids are not exactly 0..%d (%zu entries)", path, max_id, key_id.len);
    e->vocab_size = V;
    e->token_offset = (uint32_t*)mallocCheck(((size_t)V + 1) * sizeof(uint32_t));
    e->token_arena = (unsigned char*)mallocCheck(all.len + 1);
    int* order = (int*)mallocCheck((size_t)V * sizeof(int));
    for (int t = 0; t < V; t++) order[t] = -1;
    for (size_t k = 0; k < key_id.len; k++) {
        if (order[key_id.ids[k]] >= 0) fatal("%s: id %d appears twice", path, key_id.ids[k]);
        order[key_id.ids[k]] = (int)k;
    }
    bpe_map_init(&e->vocab, 1 << 17);
    uint32_t off = 0;
    for (int t = 0; t < V; t++) {
        int k = order[t];
        const unsigned char* bytes = all.data + key_off.ids[k];
        size_t len = (size_t)key_len.ids[k];
        e->token_offset[t] = off;
        memcpy(e->token_arena + off, bytes, len);
        off += (uint32_t)len;
        if (!bpe_map_put_new(&e->vocab, bytes, len, t)) fatal("%s: two ids spell the same bytes (id %d)", path, t);
    }
    e->token_offset[V] = off;
    static const unsigned char eot[] = "<|endoftext|>";
    int32_t eot_id;
    if (!bpe_map_get(&e->vocab, eot, sizeof(eot) - 1, &eot_id)) fatal("%s: no <|endoftext|> token", path);
    e->eot_token = eot_id;
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        int32_t id;
        if (!bpe_map_get(&e->vocab, &c, 1, &id)) fatal("%s: byte 0x%02X has no token of its own", path, b);
        e->byte_token[b] = id;
    }
    free(order);
    free(s);
    free(key.data); free(raw.data); free(all.data);
    bpe_ids_free(&key_off); bpe_ids_free(&key_len); bpe_ids_free(&key_id);
}

static BpePairSlot* bpe_pair_find(const BpeEncoder* e, int left, int right) {
    uint64_t key = bpe_pair_key(left, right);
    for (size_t i = bpe_pair_hash(key, e->pair_mask);; i = (i + 1) & e->pair_mask) {
        BpePairSlot* s = &e->pairs[i];
        if (s->key == key || s->key == 0) return s;
    }
}

// vocab.bpe: a "#version" line, then "left right" per line, in rank order.
static void bpe_load_merges(BpeEncoder* e, const char* path, const int cp_to_byte[324]) {
    size_t n;
    char* s = read_whole_file(path, &n);
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += (s[i] == '\n');
    size_t cap = 1024;
    while (cap < lines * 2) cap *= 2;
    e->pairs = (BpePairSlot*)callocCheck(cap, sizeof(BpePairSlot));
    e->pair_mask = cap - 1;
    // Rank at which each token is first produced by a merge (bytes: -1). The heap merge
    // needs every merge's operands to exist before it, which trained merge lists obey.
    int* born = (int*)mallocCheck((size_t)e->vocab_size * sizeof(int));
    for (int t = 0; t < e->vocab_size; t++) born[t] = (e->token_offset[t + 1] - e->token_offset[t] == 1) ? -1 : INT32_MAX;
    BpeBytes left = {NULL, 0, 0}, right = {NULL, 0, 0}, both = {NULL, 0, 0};
    size_t i = 0;
    int rank = 0;
    while (i < n) {
        size_t line_start = i;
        while (i < n && s[i] != '\n') i++;
        size_t line_end = i;
        if (i < n) i++;
        if (line_end > line_start && s[line_end - 1] == '\r') line_end--;
        if (line_end == line_start) continue;
        // The header "#version: 0.2" is skipped only as the first line: "# #" is a merge.
        if (line_start == 0 && line_end - line_start >= 8 && memcmp(s, "#version", 8) == 0) continue;
        const char* sp = (const char*)memchr(s + line_start, ' ', line_end - line_start);
        if (sp == NULL) fatal("%s: line at byte %zu is not 'left right'", path, line_start);
        size_t sp_at = (size_t)(sp - s);
        left.len = right.len = both.len = 0;
        bpe_unspell((const unsigned char*)s + line_start, sp_at - line_start, cp_to_byte, &left, path, line_start);
        bpe_unspell((const unsigned char*)s + sp_at + 1, line_end - sp_at - 1, cp_to_byte, &right, path, line_start);
        int32_t lid, rid, mid;
        if (left.len == 0 || right.len == 0 || !bpe_map_get(&e->vocab, left.data, left.len, &lid) ||
            !bpe_map_get(&e->vocab, right.data, right.len, &rid)) {
            fatal("%s: merge at byte %zu names a token missing from the encoder", path, line_start);
        }
        bpe_bytes_append(&both, left.data, left.len);
        bpe_bytes_append(&both, right.data, right.len);
        if (!bpe_map_get(&e->vocab, both.data, both.len, &mid)) {
            fatal("%s: merge at byte %zu produces a token missing from the encoder", path, line_start);
        }
        if (born[lid] >= rank || born[rid] >= rank) {
            fatal("%s: merge at byte %zu uses a token no earlier merge produced", path, line_start);
        }
        born[mid] = rank;  // the latest producer, so later operands must follow all of them
        BpePairSlot* slot = bpe_pair_find(e, lid, rid);
        if (slot->key == 0) {  // a repeated pair keeps its first (best) rank
            slot->key = bpe_pair_key(lid, rid);
            slot->rank = rank;
            slot->merged = mid;
        }
        rank++;
    }
    e->num_merges = rank;
    free(born);
    free(left.data); free(right.data); free(both.data);
    free(s);
}

static void bpe_init(BpeEncoder* e, const char* encoder_json_path, const char* merges_path) {
    memset(e, 0, sizeof(*e));
    int cp_to_byte[324];
    bpe_build_cp_to_byte(cp_to_byte);
    bpe_load_encoder_json(e, encoder_json_path, cp_to_byte);
    bpe_load_merges(e, merges_path, cp_to_byte);
    bpe_map_init(&e->cache, 1 << 16);
}

static void bpe_free(BpeEncoder* e) {
    free(e->token_arena);
    free(e->token_offset);
    bpe_map_free(&e->vocab);
    free(e->pairs);
    bpe_map_free(&e->cache);
    bpe_ids_free(&e->cache_ids);
    free(e->sym); free(e->prev); free(e->next); free(e->heap);
    memset(e, 0, sizeof(*e));
}

// An encoder for another thread: bpe_encode writes the cache and the merge scratch, so
// each thread needs its own; the tables (vocabulary, merges, token bytes) are only read
// and are shared with e, which must outlive it. Free with bpe_free_worker().
static void bpe_init_worker(BpeEncoder* w, const BpeEncoder* e) {
    *w = *e;
    memset(&w->cache_ids, 0, sizeof(w->cache_ids));
    w->sym = w->prev = w->next = NULL;
    w->heap = NULL;
    w->scratch_cap = 0;
    bpe_map_init(&w->cache, 1 << 16);
}

static void bpe_free_worker(BpeEncoder* w) {
    bpe_map_free(&w->cache);
    bpe_ids_free(&w->cache_ids);
    free(w->sym); free(w->prev); free(w->next); free(w->heap);
    memset(w, 0, sizeof(*w));
}

// Raw bytes of a token (NULL for an invalid id).
static inline const unsigned char* bpe_token_bytes(const BpeEncoder* e, int id, size_t* len) {
    if (id < 0 || id >= e->vocab_size) { *len = 0; return NULL; }
    *len = e->token_offset[id + 1] - e->token_offset[id];
    return e->token_arena + e->token_offset[id];
}

static inline int bpe_heap_less(const BpeHeapEntry* a, const BpeHeapEntry* b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void bpe_heap_push(BpeHeapEntry* h, size_t* n, BpeHeapEntry x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bpe_heap_less(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static BpeHeapEntry bpe_heap_pop(BpeHeapEntry* h, size_t* n) {
    BpeHeapEntry top = h[0], x = h[--(*n)];
    size_t i = 0;
    while (1) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && bpe_heap_less(&h[c + 1], &h[c])) c++;
        if (!bpe_heap_less(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

static void bpe_heap_offer(const BpeEncoder* e, BpeHeapEntry* h, size_t* n, int pos, int left, int right) {
    BpePairSlot* s = bpe_pair_find(e, left, right);
    if (s->key == 0) return;
    BpeHeapEntry x = {s->rank, pos, left, right};
    bpe_heap_push(h, n, x);
}

// BPE of one pre-token. Popping pairs by (rank, position) merges every occurrence of the
// best pair left to right before any other pair, exactly like GPT-2's loop: a merge only
// creates pairs whose rank is larger (their operand was just born), so nothing jumps the
// queue. Stale heap entries are recognised by their remembered operand ids.
static void bpe_merge_word(BpeEncoder* e, const unsigned char* w, size_t n, BpeIds* out) {
    if (n > e->scratch_cap) {
        size_t cap = n < 256 ? 256 : n;
        free(e->sym); free(e->prev); free(e->next); free(e->heap);
        e->sym = (int*)mallocCheck(cap * sizeof(int));
        e->prev = (int*)mallocCheck(cap * sizeof(int));
        e->next = (int*)mallocCheck(cap * sizeof(int));
        // each merge pushes at most 2 entries on top of the initial n - 1
        e->heap = (BpeHeapEntry*)mallocCheck(3 * cap * sizeof(BpeHeapEntry));
        e->scratch_cap = cap;
    }
    int *sym = e->sym, *prev = e->prev, *next = e->next;
    BpeHeapEntry* heap = e->heap;
    size_t hn = 0;
    for (size_t k = 0; k < n; k++) {
        sym[k] = e->byte_token[w[k]];
        prev[k] = (int)k - 1;
        next[k] = (k + 1 < n) ? (int)k + 1 : -1;
    }
    for (size_t k = 0; k + 1 < n; k++) bpe_heap_offer(e, heap, &hn, (int)k, sym[k], sym[k + 1]);
    while (hn > 0) {
        BpeHeapEntry x = bpe_heap_pop(heap, &hn);
        int p = x.pos, q = next[p];
        if (sym[p] != x.left || q < 0 || sym[q] != x.right) continue;  // stale
        sym[p] = bpe_pair_find(e, x.left, x.right)->merged;
        sym[q] = -1;  // dead
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) bpe_heap_offer(e, heap, &hn, prev[p], sym[prev[p]], sym[p]);
        if (next[p] >= 0) bpe_heap_offer(e, heap, &hn, p, sym[p], sym[next[p]]);
    }
    for (int k = 0; k >= 0; k = next[k]) bpe_ids_push(out, sym[k]);
}

// Encodes one pre-token, through the cache.
static void bpe_encode_pretoken(BpeEncoder* e, const unsigned char* w, size_t n, BpeIds* out) {
    int32_t at;
    if (bpe_map_get(&e->cache, w, n, &at)) {
        int count = e->cache_ids.ids[at];
        for (int k = 0; k < count; k++) bpe_ids_push(out, e->cache_ids.ids[at + 1 + k]);
        return;
    }
    size_t start = out->len;
    bpe_merge_word(e, w, n, out);
    if (n > 1024) return;  // long runs rarely repeat; don't let them bloat the cache
    // Bound memory on huge corpora: start the cache afresh when it gets big.
    if (e->cache.count >= (1u << 21) || e->cache_ids.len >= (1u << 26)) {
        bpe_map_clear(&e->cache);
        e->cache_ids.len = 0;
    }
    int count = (int)(out->len - start);
    bpe_map_put_new(&e->cache, w, n, (int32_t)e->cache_ids.len);
    bpe_ids_push(&e->cache_ids, count);
    for (int k = 0; k < count; k++) bpe_ids_push(&e->cache_ids, out->ids[start + k]);
}

// Appends the ids of text[0..n) to out. Ordinary text only: "<|endoftext|>" in the text
// is encoded as the characters it is made of, never as the special token.
static void bpe_encode(BpeEncoder* e, const unsigned char* text, size_t n, BpeIds* out) {
    size_t i = 0;
    while (i < n) {
        size_t j = bpe_pretoken_end(text, n, i);
        bpe_encode_pretoken(e, text + i, j - i, out);
        i = j;
    }
}

// Appends the bytes of ids to out (invalid ids -> fatal: callers pass our own output).
static void bpe_decode(const BpeEncoder* e, const int* ids, size_t count, BpeBytes* out) {
    for (size_t k = 0; k < count; k++) {
        size_t len;
        const unsigned char* b = bpe_token_bytes(e, ids[k], &len);
        if (b == NULL) fatal("bpe_decode: token id %d out of range [0, %d)", ids[k], e->vocab_size);
        bpe_bytes_append(out, b, len);
    }
}

#ifdef __cplusplus
}
#endif
#endif
