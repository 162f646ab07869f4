/*
 * What every file of llmc/ may use: checked allocation, a cheap hash, and the one error
 * call. The model and its kernels stop on a bad shape or a failed allocation through
 * fatal(), which the program that includes llmc/ defines (this project's: run/error.c,
 * where rank 0 speaks for an error every rank sees); llmc/ itself knows nothing of files,
 * flags, ranks or signals.
 */
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <stdint.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define LLMC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define LLMC_NORETURN __attribute__((noreturn))
#else
#define LLMC_PRINTF(a, b)
#define LLMC_NORETURN
#endif

// Ends the program with one line "error: MESSAGE" and exit status 1 (run/error.h says how
// several ranks share one error).
void fatal(const char* fmt, ...) LLMC_PRINTF(1, 2) LLMC_NORETURN;

// FNV-1a, 64 bits: a cheap fingerprint (parameter bytes to compare replicas, a corpus's shards).
static inline uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
#define FNV1A_START 1469598103934665603ull

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* p = malloc(size == 0 ? 1 : size);
    if (p == NULL) fatal("out of memory allocating %zu bytes (%s:%d)", size, file, line);
    return p;
}
#define mallocCheck(size) malloc_check((size), __FILE__, __LINE__)

static inline void* calloc_check(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n == 0 ? 1 : n, size == 0 ? 1 : size);
    if (p == NULL) fatal("out of memory allocating %zu x %zu bytes (%s:%d)", n, size, file, line);
    return p;
}
#define callocCheck(n, size) calloc_check((n), (size), __FILE__, __LINE__)

#ifdef __cplusplus
}
#endif
#endif
