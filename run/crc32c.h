/*
 * CRC32C (Castagnoli), the checksum of checkpoint files: reflected polynomial 0x82F63B78,
 * initial value and final xor 0xFFFFFFFF, so crc32c("123456789") = 0xE3069283.
 *
 *   crc32c_update(crc, data, n)   the CRC of everything so far followed by data[0..n);
 *                                 start with crc = 0 (like zlib's crc32())
 *   crc32c_combine(a, b, len_b)   the CRC of A||B from a = CRC(A), b = CRC(B), len_b = |B|,
 *                                 so ranks can checksum their pieces of one file in
 *                                 parallel and combine them in file order
 *   crc32c_file(path, &bytes)     the CRC and length of a whole file
 *
 * Two implementations that must agree (dev/test/test_crc32c.c checks they do): a portable
 * table-driven one (slicing-by-8: eight bytes per step through eight 256-entry tables),
 * and on x86-64 the SSE4.2 crc32 instruction, chosen at run time when the CPU has it.
 */
#ifndef RUN_CRC32C_H
#define RUN_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "run/files.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDA_ARCH__)
#include <nmmintrin.h>
#define CRC32C_HAVE_SSE42 1
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define CRC32C_POLY 0x82F63B78u  // x^32 + x^28 + ... + 1, bit-reversed (bit 31 is x^0)

// The portable implementation.
uint32_t crc32c_update_sw(uint32_t crc, const void* data, size_t n);

// 1 when crc32c_update_hw exists and this CPU can run it.
int crc32c_hw_available(void);

#ifdef CRC32C_HAVE_SSE42
// The SSE4.2 implementation (compiled for SSE4.2 whatever -march says; only called when
// crc32c_hw_available()).
__attribute__((target("sse4.2"))) uint32_t crc32c_update_hw(uint32_t crc, const void* data, size_t n);
#endif

uint32_t crc32c_update(uint32_t crc, const void* data, size_t n);

uint32_t crc32c(const void* data, size_t n);

// CRC(A||B) = CRC(A) * x^(8|B|) + CRC(B) mod P: the initial value and final xor are both
// all ones, so the ones that CRC(A)'s final xor carries into the product are exactly the
// ones B's initial value contributes, and they cancel.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b);

// CRC32C of a file's bytes; *bytes gets its length. A missing or unreadable file is fatal.
uint32_t crc32c_file(const char* path, size_t* bytes);

#ifdef __cplusplus
}
#endif
#endif
