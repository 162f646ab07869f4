/*
 * Numbers read from files are untrusted input: people load model files and token shards
 * they downloaded. Every header field is checked against a stated range BEFORE any
 * arithmetic uses it, and sizes derived from fields are computed in size_t with overflow
 * checks, so a crafted header can never wrap a size check into passing and then ask
 * malloc for 2^64 bytes. Each error names the file and the field.
 */
#ifndef LLMC_UNTRUSTED_H
#define LLMC_UNTRUSTED_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/utils.h"

#ifdef __cplusplus
extern "C" {
#endif

// "PATH: FIELD = VALUE is out of range (MIN..MAX)" unless MIN <= VALUE <= MAX.
// field names the kind and the name: "header field L", "field step".
static inline long long field_range_check(const char* path, const char* field, long long value, long long min,
                                          long long max) {
    if (value < min || value > max) fatal("%s: %s = %lld is out of range (%lld..%lld)", path, field, value, min, max);
    return value;
}

static inline size_t size_mul_check(size_t a, size_t b, const char* path) {
    if (a != 0 && b > SIZE_MAX / a) fatal("%s: size %zu x %zu overflows size_t (corrupt header?)", path, a, b);
    return a * b;
}

static inline size_t size_add_check(size_t a, size_t b, const char* path) {
    if (b > SIZE_MAX - a) fatal("%s: size %zu + %zu overflows size_t (corrupt header?)", path, a, b);
    return a + b;
}

// Parses a whole string as a non-negative decimal integer (digits only: no sign, no
// blanks); returns 0 and leaves *out alone if it is not one or exceeds UINT64_MAX.
static inline int parse_u64_strict(const char* s, uint64_t* out) {
    if (s == NULL || *s == '\0') return 0;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return 0;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

#ifdef __cplusplus
}
#endif
#endif
