/*
 * zero1/exact_sum.h: --dp-invariant's arithmetic, one formula for every device (host and,
 * under nvcc, device code): the pairwise tree of a sum, and an exact sum of squares.
 *
 * Pairwise tree. count (a power of two) values summed as the complete binary tree over
 * their index, ((v0 + v1) + (v2 + v3)) + ..., computed as a binary counter: value r
 * completes as many pairs as r has trailing one bits. The runtime folds a rank's
 * micro-steps with the same counter (its levels are partial gradient buffers), so a rank's
 * sum is a subtree of the tree over the step's micro-batches and the exchange between
 * ranks, summing the ranks' subtrees with this formula, finishes that same tree.
 *
 * Exact sum of squares. A finite fp32 x is m * 2^e (m < 2^24 an integer, e >= -149), so
 * x^2 = m^2 * 2^(2e) is a 48-bit integer times a power of two >= 2^-298: a fixed-point
 * number whose lowest bit is worth 2^-298. The accumulator keeps that number in 32-bit
 * limbs, each in a 64-bit integer (room for 2^30 additions before a carry pass), and counts
 * NaNs and infinities apart. Integer addition is associative: any order and any split of
 * the same squares (threads, blocks, atomics, shards, ranks) gives the same limbs, and the
 * value is converted to double once, at the end. Between launches and ranks the limbs
 * travel as doubles holding integers below 2^32 (normalized), so an fp64 all-reduce of up
 * to 2^21 ranks sums them exactly, in any order.
 */
#ifndef ZERO1_EXACT_SUM_H
#define ZERO1_EXACT_SUM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "llmc/adamw.h"  // LLMC_HOST_DEVICE

#ifdef __cplusplus
extern "C" {
#endif

// Squares reach bit 554 above 2^-298; 20 limbs (640 bits) hold sums of 2^80 of them.
#define ZERO1_EXACT_LIMBS 20
#define ZERO1_EXACT_NAN ZERO1_EXACT_LIMBS        // word: NaNs seen
#define ZERO1_EXACT_INF (ZERO1_EXACT_LIMBS + 1)  // word: infinities seen
#define ZERO1_EXACT_WORDS (ZERO1_EXACT_LIMBS + 2)
#define ZERO1_EXACT_LSB_EXP (-298)
// Additions into one limb between carry passes (each adds less than 2^33).
#define ZERO1_EXACT_BATCH ((size_t)1 << 29)
#define ZERO1_PAIRWISE_MAX_LEVELS 32

// Element i of count slices of n fp32 values (slice r at src[r*n]) summed as the pairwise tree.
LLMC_HOST_DEVICE static inline float zero1_pairwise_slices_element(const float* src, int count, size_t n, size_t i) {
    float level[ZERO1_PAIRWISE_MAX_LEVELS];
    int top = 0;
    for (int r = 0; r < count; r++) {
        float carry = src[(size_t)r * n + i];
        for (int b = r; b & 1; b >>= 1) carry = level[--top] + carry;  // r completes a pair per trailing one
        level[top++] = carry;
    }
    return level[0];
}

// acc (ZERO1_EXACT_WORDS) += x^2, exactly.
LLMC_HOST_DEVICE static inline void zero1_exact_add_square(float x, long long* acc) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    uint32_t exponent = (u >> 23) & 0xffu, fraction = u & 0x7fffffu;
    if (exponent == 0xffu) {
        acc[fraction ? ZERO1_EXACT_NAN : ZERO1_EXACT_INF] += 1;
        return;
    }
    if (exponent == 0 && fraction == 0) return;
    uint64_t m = exponent ? (fraction | 0x800000u) : fraction;
    int e = exponent ? (int)exponent - 150 : -149;
    unsigned position = (unsigned)(2 * e - ZERO1_EXACT_LSB_EXP);  // of m^2's lowest bit
    uint64_t v = m * m, shift = position & 31u;
    uint64_t lo = (v & 0xffffffffu) << shift, hi = (v >> 32) << shift;  // v << shift = lo + hi * 2^32
    long long* limb = acc + (position >> 5);
    limb[0] += (long long)(lo & 0xffffffffu);
    limb[1] += (long long)((lo >> 32) + (hi & 0xffffffffu));
    limb[2] += (long long)(hi >> 32);
}

// Carries every limb's excess into the next: afterwards each limb but the top is below 2^32.
LLMC_HOST_DEVICE static inline void zero1_exact_normalize(long long* acc) {
    long long carry = 0;
    for (int i = 0; i < ZERO1_EXACT_LIMBS - 1; i++) {
        long long t = acc[i] + carry;
        acc[i] = t & 0xffffffffLL;
        carry = t >> 32;
    }
    acc[ZERO1_EXACT_LIMBS - 1] += carry;
}

// words (ZERO1_EXACT_WORDS doubles, normalized) += acc; acc is normalized on the way.
LLMC_HOST_DEVICE static inline void zero1_exact_merge(double* words, long long* acc) {
    for (int i = 0; i < ZERO1_EXACT_WORDS; i++) acc[i] += (long long)words[i];
    zero1_exact_normalize(acc);
    for (int i = 0; i < ZERO1_EXACT_WORDS; i++) words[i] = (double)acc[i];
}

// The sum the words hold (limbs summed over ranks need not be normalized), rounded to
// double in one fixed order: NaN if a NaN was seen, else +Inf if an infinity was.
LLMC_HOST_DEVICE static inline double zero1_exact_value(const double* words) {
    long long acc[ZERO1_EXACT_WORDS];
    for (int i = 0; i < ZERO1_EXACT_WORDS; i++) acc[i] = (long long)words[i];
    zero1_exact_normalize(acc);
    if (acc[ZERO1_EXACT_NAN]) return (double)NAN;
    if (acc[ZERO1_EXACT_INF]) return (double)INFINITY;
    double value = 0.0;
    for (int i = ZERO1_EXACT_LIMBS - 1; i >= 0; i--) value += ldexp((double)acc[i], 32 * i + ZERO1_EXACT_LSB_EXP);
    return value;
}

#ifdef __cplusplus
}
#endif
#endif
