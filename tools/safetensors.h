/*
 * safetensors files (the Hugging Face weights format), read and written without Python:
 *   uint64 little-endian N, then N bytes of JSON header, then the data.
 * The header maps each tensor name to {"dtype": "F32", "shape": [rows, cols],
 * "data_offsets": [begin, end]} (offsets relative to the data, end exclusive), plus an
 * optional "__metadata__" object of strings. Data is little-endian and row-major.
 *
 * Reading: safetensors_open() checks the whole header before anything is read: every
 * entry well-formed, its byte count exactly numel x element size, and the entries tiling
 * the data exactly, with no gap, overlap or trailing byte (as the format requires), so a
 * truncated or corrupt file is one error naming the file and, where it is one tensor's
 * fault, the tensor. Tensors of any dtype can be listed; safetensors_read_f32() converts
 * F32, F16 and BF16 to fp32.
 *
 * Writing: safetensors_header() lays the tensors out back to back in the given order and
 * returns the header text, padded with blanks so that the data starts 8-byte aligned.
 */
#ifndef LLMC_SAFETENSORS_H
#define LLMC_SAFETENSORS_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "llmc/bf16.h"
#include "run/files.h"
#include "tools/json.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SAFETENSORS_MAX_HEADER (100u << 20)  // the reference implementation's bound too
#define SAFETENSORS_MAX_DIMS 8
#define SAFETENSORS_NAME_MAX 512

typedef struct {
    char name[SAFETENSORS_NAME_MAX];
    char dtype[16];        // "F32", "BF16", ...
    size_t elem_bytes;
    int ndim;
    uint64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t begin, end;   // byte range in the data section
} SafetensorsTensor;

typedef struct {
    char path[PATH_MAX_LEN];
    FILE* f;
    uint64_t data_start;   // 8 + N
    uint64_t data_bytes;
    int count;
    SafetensorsTensor* tensors;
} SafetensorsFile;

// Element size of a safetensors dtype, or 0 for a name the format does not define.
static inline size_t safetensors_dtype_bytes(const char* dtype) {
    static const char* const names[] = {"F64", "I64", "U64", "F32", "I32", "U32", "F16", "BF16", "I16", "U16",
                                        "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};
    static const size_t bytes[] = {8, 8, 8, 4, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1};
    for (size_t k = 0; k < sizeof(bytes) / sizeof(bytes[0]); k++) {
        if (strcmp(dtype, names[k]) == 0) return bytes[k];
    }
    return 0;
}

static inline uint64_t safetensors_numel(const SafetensorsTensor* t) {
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];  // bounded by the size check below
    return n;
}

// "[768, 2304]" into buf.
static inline const char* safetensors_shape_text(const uint64_t* shape, int ndim, char* buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++) {
        k += (size_t)snprintf(buf + k, n - k, "%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
    }
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

// A non-negative integer of a JSON array, or an error naming the tensor and the field.
static inline uint64_t safetensors_field_u64(const char* path, const char* name, const char* field,
                                             const JsonValue* v) {
    if (v->type != JSON_NUMBER || !v->is_integer || v->integer < 0) {
        fatal("%s: tensor '%s': %s holds %s, expected non-negative integers", path, name, field,
              v->type == JSON_NUMBER ? "a number that is not one" : json_type_name(v->type));
    }
    return (uint64_t)v->integer;
}

// One header entry into t, checked on its own (the tiling is checked by the caller).
static inline void safetensors_parse_entry(const char* path, const char* name, const JsonValue* v,
                                           SafetensorsTensor* t) {
    if (strlen(name) >= sizeof(t->name)) fatal("%s: a tensor name of %zu bytes (at most %zu)", path, strlen(name),
                                               sizeof(t->name) - 1);
    snprintf(t->name, sizeof(t->name), "%s", name);
    if (v->type != JSON_OBJECT) fatal("%s: tensor '%s' is %s in the header, expected an object", path, name,
                                      json_type_name(v->type));
    const JsonValue* dtype = json_get(v, "dtype");
    const JsonValue* shape = json_get(v, "shape");
    const JsonValue* offsets = json_get(v, "data_offsets");
    if (!dtype || dtype->type != JSON_STRING) fatal("%s: tensor '%s' has no dtype string", path, name);
    if (!shape || shape->type != JSON_ARRAY) fatal("%s: tensor '%s' has no shape array", path, name);
    if (!offsets || offsets->type != JSON_ARRAY || offsets->count != 2) {
        fatal("%s: tensor '%s' has no data_offsets [begin, end]", path, name);
    }
    t->elem_bytes = safetensors_dtype_bytes(dtype->string);
    if (t->elem_bytes == 0) fatal("%s: tensor '%s' has dtype '%.20s', which safetensors does not define", path, name,
                                  dtype->string);
    snprintf(t->dtype, sizeof(t->dtype), "%s", dtype->string);
    if (shape->count > SAFETENSORS_MAX_DIMS) fatal("%s: tensor '%s' has %d dimensions (at most %d)", path, name,
                                                   shape->count, SAFETENSORS_MAX_DIMS);
    t->ndim = shape->count;
    size_t bytes = t->elem_bytes;
    for (int d = 0; d < t->ndim; d++) {
        t->shape[d] = safetensors_field_u64(path, name, "shape", &shape->items[d]);
        bytes = size_mul_check(bytes, t->shape[d], path);
    }
    t->begin = safetensors_field_u64(path, name, "data_offsets", &offsets->items[0]);
    t->end = safetensors_field_u64(path, name, "data_offsets", &offsets->items[1]);
    if (t->end < t->begin || t->end - t->begin != bytes) {
        char s[128];
        fatal("%s: tensor '%s' (%s %s) needs %zu bytes, but its data_offsets [%llu, %llu] span %lld", path, name,
              t->dtype, safetensors_shape_text(t->shape, t->ndim, s, sizeof(s)), bytes, (unsigned long long)t->begin,
              (unsigned long long)t->end, (long long)t->end - (long long)t->begin);
    }
}

static inline int safetensors_compare_begin(const void* a, const void* b) {
    const SafetensorsTensor *x = *(const SafetensorsTensor* const*)a, *y = *(const SafetensorsTensor* const*)b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

// The tensors must cover the data section exactly once, in some order.
static inline void safetensors_check_tiling(const SafetensorsFile* sf) {
    const SafetensorsTensor** by_begin = (const SafetensorsTensor**)mallocCheck((size_t)sf->count * sizeof(void*));
    for (int k = 0; k < sf->count; k++) by_begin[k] = &sf->tensors[k];
    qsort(by_begin, (size_t)sf->count, sizeof(void*), safetensors_compare_begin);
    uint64_t at = 0;
    for (int k = 0; k < sf->count; k++) {
        const SafetensorsTensor* t = by_begin[k];
        if (t->begin != at) {
            fatal("%s: tensor '%s' starts at data byte %llu, but the tensors before it end at %llu (%s)", sf->path,
                  t->name, (unsigned long long)t->begin, (unsigned long long)at,
                  t->begin < at ? "overlapping tensors" : "a gap");
        }
        at = t->end;
    }
    free(by_begin);
    if (at != sf->data_bytes) {
        fatal("%s: the header's tensors end at data byte %llu, but the file holds %llu data bytes (%s)", sf->path,
              (unsigned long long)at, (unsigned long long)sf->data_bytes,
              at > sf->data_bytes ? "truncated" : "trailing bytes");
    }
}

// Opens a safetensors file and checks its header (see the top of this file).
static inline void safetensors_open(const char* path, SafetensorsFile* sf) {
    memset(sf, 0, sizeof(*sf));
    snprintf(sf->path, sizeof(sf->path), "%s", path);
    sf->f = fopenCheck(path, "rb");
    long size = file_size_of(sf->f, path);
    unsigned char len_bytes[8];
    if (size < 8) fatal("%s: too small to be a safetensors file (%ld bytes)", path, size);
    freadCheck(len_bytes, 1, 8, sf->f, path);
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = (n << 8) | len_bytes[k];
    if (n < 2 || n > SAFETENSORS_MAX_HEADER || n > (uint64_t)size - 8) {
        fatal("%s: not a safetensors file (its first 8 bytes give a header of %llu bytes; the file has %ld)", path,
              (unsigned long long)n, size);
    }
    char* text = (char*)mallocCheck((size_t)n + 1);
    freadCheck(text, 1, (size_t)n, sf->f, path);
    text[n] = '\0';
    if (text[0] != '{') fatal("%s: not a safetensors file (its header does not start with '{')", path);
    JsonValue header;
    json_parse(text, (size_t)n, path, &header);
    free(text);
    if (header.type != JSON_OBJECT) fatal("%s: the header is not a JSON object", path);
    sf->data_start = 8 + n;
    sf->data_bytes = (uint64_t)size - sf->data_start;
    sf->tensors = (SafetensorsTensor*)callocCheck((size_t)header.count, sizeof(SafetensorsTensor));
    for (int k = 0; k < header.count; k++) {
        if (strcmp(header.keys[k], "__metadata__") == 0) {  // the format's: a map of strings to strings
            const JsonValue* m = &header.items[k];
            int strings = m->type == JSON_OBJECT;
            for (int j = 0; strings && j < m->count; j++) strings = m->items[j].type == JSON_STRING;
            if (!strings) fatal("%s: __metadata__ is not a map of strings to strings", path);
            continue;
        }
        for (int j = 0; j < k; j++) {
            if (strcmp(header.keys[j], header.keys[k]) == 0) fatal("%s: tensor '%s' appears twice", path, header.keys[k]);
        }
        safetensors_parse_entry(path, header.keys[k], &header.items[k], &sf->tensors[sf->count++]);
    }
    json_free(&header);
    safetensors_check_tiling(sf);
}

static inline void safetensors_close(SafetensorsFile* sf) {
    if (sf->f) fclose(sf->f);
    free(sf->tensors);
    memset(sf, 0, sizeof(*sf));
}

// IEEE binary16 -> fp32, exactly (subnormals, infinities and NaNs included).
static inline float safetensors_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else {  // subnormal: shift the leading 1 into the implicit bit
        int e = -1;
        do { mant <<= 1; e++; } while (!(mant & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Reads tensor t (F32, F16 or BF16) as fp32 into out (numel floats).
static inline void safetensors_read_f32(SafetensorsFile* sf, const SafetensorsTensor* t, float* out) {
    size_t n = (size_t)safetensors_numel(t);
    int f32 = strcmp(t->dtype, "F32") == 0, f16 = strcmp(t->dtype, "F16") == 0, b16 = strcmp(t->dtype, "BF16") == 0;
    if (!f32 && !f16 && !b16) fatal("%s: tensor '%s' has dtype %s; expected F32, F16 or BF16", sf->path, t->name, t->dtype);
    if (sf->data_start + t->begin > (uint64_t)LONG_MAX) fatal("%s: offset past what this system can seek", sf->path);
    fseekCheck(sf->f, (long)(sf->data_start + t->begin), SEEK_SET, sf->path);
    if (f32) {
        freadCheck(out, sizeof(float), n, sf->f, sf->path);
        return;
    }
    uint16_t* tmp = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    freadCheck(tmp, sizeof(uint16_t), n, sf->f, sf->path);
    for (size_t j = 0; j < n; j++) out[j] = f16 ? safetensors_f16_to_float(tmp[j]) : bf16_to_float(tmp[j]);
    free(tmp);
}

// Lays tensors out back to back in the given order (sets begin/end from each dtype and
// shape) and returns the header text in a new buffer, blank-padded to a multiple of 8
// bytes; *len gets its length (the N of the file). Names are written as they are, so
// they must need no JSON escape.
static inline char* safetensors_header(SafetensorsTensor* tensors, int count, size_t* len) {
    size_t cap = 64 + (size_t)count * (SAFETENSORS_NAME_MAX + 64 + 21 * (SAFETENSORS_MAX_DIMS + 2)), k = 0;
    char* text = (char*)mallocCheck(cap);
    k += (size_t)snprintf(text + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    for (int i = 0; i < count; i++) {
        SafetensorsTensor* t = &tensors[i];
        for (const char* c = t->name; *c; c++) {
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) fatal("tensor name '%s' needs escaping", t->name);
        }
        t->elem_bytes = safetensors_dtype_bytes(t->dtype);
        t->begin = at;
        t->end = at += safetensors_numel(t) * t->elem_bytes;
        k += (size_t)snprintf(text + k, cap - k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            k += (size_t)snprintf(text + k, cap - k, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
        }
        k += (size_t)snprintf(text + k, cap - k, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin,
                              (unsigned long long)t->end);
    }
    k += (size_t)snprintf(text + k, cap - k, "}");
    while (k % 8 != 0) text[k++] = ' ';
    text[k] = '\0';
    *len = k;
    return text;
}

// The 8-byte little-endian header length, then the header.
static inline void safetensors_write_header(FILE* f, const char* header, size_t len, const char* what) {
    unsigned char len_bytes[8];
    for (int k = 0; k < 8; k++) len_bytes[k] = (unsigned char)((uint64_t)len >> (8 * k));
    fwriteCheck(len_bytes, 1, 8, f, what);
    fwriteCheck(header, 1, len, f, what);
}

#ifdef __cplusplus
}
#endif
#endif
