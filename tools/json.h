/*
 * A small JSON reader for the files other tools write (safetensors headers, Hugging Face
 * config.json): the whole text is parsed into a tree of JsonValue nodes, then looked up by
 * key. The text is untrusted: nesting is bounded, every index is checked, and malformed
 * input is one fatal error naming the file and the byte offset.
 *
 * Numbers keep their text's integer value exactly when the text is an integer (safetensors
 * offsets pass 2^32; a double would hold them too, but only below 2^53, and "1e3" or
 * "2.0" are not offsets).
 *
 * A key twice in one object is an error: JSON leaves its meaning open, and readers differ
 * (Python's json keeps the last value, a first-match lookup the first), so a config.json
 * with "n_layer" twice would build another model here than in transformers.
 */
#ifndef LLMC_JSON_H
#define LLMC_JSON_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonValue {
    JsonType type;
    int boolean;
    double number;
    int is_integer;           // the number was written as an integer that fits int64
    int64_t integer;
    char* string;             // JSON_STRING: decoded UTF-8, NUL-terminated
    int count;                // JSON_ARRAY / JSON_OBJECT: number of items
    struct JsonValue* items;  // the items (an object's values)
    char** keys;              // JSON_OBJECT: the keys, decoded
} JsonValue;

#define JSON_MAX_DEPTH 64

typedef struct {
    const char* s;
    size_t n, i;
    const char* what;  // the file, for messages
} JsonParser;

static inline void json_fail(const JsonParser* p, const char* why) LLMC_NORETURN;
static inline void json_fail(const JsonParser* p, const char* why) {
    fatal("%s: malformed JSON at byte %zu: %s", p->what, p->i, why);
}

static inline void json_skip_ws(JsonParser* p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static inline uint32_t json_hex4(JsonParser* p) {
    if (p->i + 4 > p->n) json_fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i + k];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) json_fail(p, "bad \\u escape");
        v = (v << 4) | (uint32_t)d;
    }
    p->i += 4;
    return v;
}

// Writes code point cp as UTF-8 at out; returns the byte count (1..4).
static inline size_t json_utf8(uint32_t cp, char* out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// The string at p->i (on its opening quote), decoded into a new NUL-terminated buffer.
// No escape decodes to more bytes than it is written with, so the raw length is enough.
static inline char* json_parse_string(JsonParser* p) {
    if (p->i >= p->n || p->s[p->i] != '"') json_fail(p, "expected a string");
    size_t start = ++p->i, end = start;
    while (end < p->n && p->s[end] != '"') end += (p->s[end] == '\\') ? 2 : 1;
    if (end >= p->n) json_fail(p, "unterminated string");
    char* out = (char*)mallocCheck(end - start + 1);
    size_t k = 0;
    while (p->s[p->i] != '"') {
        char c = p->s[p->i++];
        if ((unsigned char)c < 0x20) json_fail(p, "control character in a string");
        if (c != '\\') { out[k++] = c; continue; }
        char e = p->s[p->i++];
        const char* from = "\"\\/bfnrt";
        const char* to = "\"\\/\b\f\n\r\t";
        const char* at = e ? strchr(from, e) : NULL;
        if (at) { out[k++] = to[at - from]; continue; }
        if (e != 'u') json_fail(p, "unknown escape");
        uint32_t cp = json_hex4(p);
        if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate: its low half must follow
            if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') json_fail(p, "lone surrogate");
            p->i += 2;
            uint32_t lo = json_hex4(p);
            if (lo < 0xDC00 || lo > 0xDFFF) json_fail(p, "bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            json_fail(p, "lone low surrogate");
        }
        if (cp == 0) json_fail(p, "\\u0000 in a string");
        k += json_utf8(cp, out + k);
    }
    p->i++;  // the closing quote
    out[k] = '\0';
    return out;
}

static inline void json_parse_number(JsonParser* p, JsonValue* v) {
    size_t start = p->i;
    if (p->i < p->n && p->s[p->i] == '-') p->i++;
    size_t digits = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    if (p->i == digits) json_fail(p, "expected a value");
    int integer = 1;
    if (p->i < p->n && p->s[p->i] == '.') {
        integer = 0;
        p->i++;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        integer = 0;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    char text[64];
    size_t len = p->i - start;
    if (len >= sizeof(text)) json_fail(p, "number too long");
    memcpy(text, p->s + start, len);
    text[len] = '\0';
    v->type = JSON_NUMBER;
    v->number = strtod(text, NULL);
    errno = 0;
    long long x = integer ? strtoll(text, NULL, 10) : 0;
    v->is_integer = integer && errno == 0;
    v->integer = x;
}

static inline void json_parse_value(JsonParser* p, JsonValue* v, int depth);

typedef struct {
    const char* key;
    int index;
} JsonKeyRef;

static int json_key_order_(const void* a, const void* b) {
    const JsonKeyRef* x = (const JsonKeyRef*)a;
    const JsonKeyRef* y = (const JsonKeyRef*)b;
    int c = strcmp(x->key, y->key);
    return c ? c : x->index - y->index;
}

// Refuses an object with a key twice (see the top), naming the key and where it repeats:
// its keys sorted, so that equal ones are neighbours.
static inline void json_check_unique_keys(const JsonParser* p, const JsonValue* v, const size_t* key_at) {
    if (v->count < 2) return;
    JsonKeyRef* sorted = (JsonKeyRef*)mallocCheck((size_t)v->count * sizeof(JsonKeyRef));
    for (int k = 0; k < v->count; k++) {
        sorted[k].key = v->keys[k];
        sorted[k].index = k;
    }
    qsort(sorted, (size_t)v->count, sizeof(JsonKeyRef), json_key_order_);
    for (int k = 1; k < v->count; k++) {
        if (strcmp(sorted[k - 1].key, sorted[k].key) != 0) continue;
        int again = sorted[k].index;
        free(sorted);
        fatal("%s: key \"%s\" appears twice in one object (again at byte %zu): which value is meant is ambiguous "
              "(Python's json takes the last); remove one", p->what, v->keys[again], key_at[again]);
    }
    free(sorted);
}

// An array or an object: items (and keys) grow as they are read.
static inline void json_parse_container(JsonParser* p, JsonValue* v, int depth) {
    int object = p->s[p->i] == '{';
    char close = object ? '}' : ']';
    v->type = object ? JSON_OBJECT : JSON_ARRAY;
    p->i++;
    json_skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) { p->i++; return; }
    int cap = 0;
    size_t* key_at = NULL;  // where each key starts, for the duplicate's message
    while (1) {
        if (v->count == cap) {
            cap = cap ? 2 * cap : 8;
            v->items = (JsonValue*)realloc(v->items, (size_t)cap * sizeof(JsonValue));
            if (object) v->keys = (char**)realloc(v->keys, (size_t)cap * sizeof(char*));
            if (object) key_at = (size_t*)realloc(key_at, (size_t)cap * sizeof(size_t));
            if (!v->items || (object && (!v->keys || !key_at))) fatal("%s: out of memory parsing JSON", p->what);
        }
        json_skip_ws(p);
        if (object) {
            key_at[v->count] = p->i;
            v->keys[v->count] = json_parse_string(p);
            json_skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') json_fail(p, "expected ':'");
            p->i++;
        }
        json_parse_value(p, &v->items[v->count], depth + 1);
        v->count++;
        json_skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            if (object) json_check_unique_keys(p, v, key_at);
            free(key_at);
            return;
        }
        json_fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static inline void json_parse_value(JsonParser* p, JsonValue* v, int depth) {
    memset(v, 0, sizeof(*v));
    if (depth > JSON_MAX_DEPTH) json_fail(p, "nested too deeply");
    json_skip_ws(p);
    if (p->i >= p->n) json_fail(p, "unexpected end");
    char c = p->s[p->i];
    if (c == '{' || c == '[') {
        json_parse_container(p, v, depth);
        return;
    }
    if (c == '"') {
        v->type = JSON_STRING;
        v->string = json_parse_string(p);
        return;
    }
    static const char* const words[] = {"true", "false", "null"};
    for (int w = 0; w < 3; w++) {
        size_t len = strlen(words[w]);
        if (p->n - p->i >= len && memcmp(p->s + p->i, words[w], len) == 0) {
            p->i += len;
            v->type = w == 2 ? JSON_NULL : JSON_BOOL;
            v->boolean = w == 0;
            return;
        }
    }
    json_parse_number(p, v);
}

// The offset of the first byte of text[0..n) that is not well-formed UTF-8 (RFC 3629: no
// overlong forms, surrogates or code points past U+10FFFF), or n.
static inline size_t json_utf8_invalid_at(const unsigned char* s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || i + len > n) return i;
        uint32_t cp = len == 1 ? c : c & (0x7F >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return n;
}

// Parses text[0..n) (one JSON value, blanks around it allowed) into *out. JSON text is
// UTF-8 (RFC 8259): other bytes are refused before anything reads a name from them.
static inline void json_parse(const char* text, size_t n, const char* what, JsonValue* out) {
    JsonParser p = {text, n, 0, what};
    p.i = json_utf8_invalid_at((const unsigned char*)text, n);
    if (p.i != n) json_fail(&p, "a byte that is not UTF-8 (JSON text is UTF-8)");
    p.i = 0;
    json_parse_value(&p, out, 0);
    json_skip_ws(&p);
    if (p.i != n) json_fail(&p, "text after the value");
}

static inline void json_free(JsonValue* v) {
    for (int k = 0; k < v->count; k++) {
        json_free(&v->items[k]);
        if (v->keys) free(v->keys[k]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    memset(v, 0, sizeof(*v));
}

// The value of key in object v, or NULL (also when v is not an object).
static inline const JsonValue* json_get(const JsonValue* v, const char* key) {
    if (v->type != JSON_OBJECT) return NULL;
    for (int k = 0; k < v->count; k++) {
        if (strcmp(v->keys[k], key) == 0) return &v->items[k];
    }
    return NULL;
}

static inline const char* json_type_name(JsonType t) {
    static const char* const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return names[t];
}

#ifdef __cplusplus
}
#endif
#endif
