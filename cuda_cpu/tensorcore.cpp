/*
 * cuda_cpu/tensorcore.cpp: how tensor cores add (a build with CUDA_CPU_NUMERICS=gpu): the
 * products and sums of wmma::mma_sync (include/mma.h) and of the BF16 cuBLAS/cuBLASLt
 * matmuls (blas.cpp). docs/cuda_cpu.md, "GPU numerics", is the manual.
 *
 * The rule, as measured on the hardware:
 *   Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ
 *   Comput. Sci. 7:e330 (2021): products exact; a group of products and the accumulator
 *   added at once, each significand aligned to the largest exponent and truncated; the
 *   sum normalized with truncation (round toward zero); groups of 4 (V100, T4), 8 (A100).
 *   Xie, Wang, Yang, Yang, "MMA-Sim: Bit-Accurate Reference Model of Tensor Cores and
 *   Matrix Cores", arXiv:2511.10909 (2025), bitwise against the hardware: for fp16/bf16
 *   with fp32 accumulation, Hopper (H100) fuses all 16 products of an m16n8k16 (and of
 *   wgmma's k16) with the accumulator and keeps 25 bits below the largest exponent (fp32's
 *   23 + 2 extra); Ampere (A100) two groups of 8 with 24 (1 extra); Volta 23 (0).
 * So, for a group: the exponent of a product a b is ea + eb (each operand's exponent, at
 * least its format's smallest: -126 bf16, -14 fp16), of the accumulator c its own; emax is
 * the largest among the nonzero terms; every term is truncated toward zero to a multiple
 * of 2^(emax - 23 - CUDA_CPU_TC_EXTRA_BITS); their sum (exact) is rounded toward zero to
 * fp32, a zero sum is +0, and a NaN or infinite operand gives the IEEE double sum's result
 * (NaN as 0x7fffffff), as MMA-Sim's model. CUDA_CPU_TC_GROUP products per group (default
 * 16 and 2 extra bits: the H100's; 8 and 1: the A100's); 0 is the layer before: exact
 * products added one by one in fp32, round to nearest, in k order.
 * Two exact ways to the same bits: integers (fused_group), which no CPU denormal mode
 * touches, and doubles (a bf16 product and its scaling by a power of two are exact), used
 * for groups of normal values only where a kernel may run with the CPU's flush-to-zero and
 * denormals-are-zero modes (--use_fast_math), which a tensor core does not apply.
 */
#include "tensorcore.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cudacpu {

namespace {
struct TcSettings {
    int group;  // products per fused group; 0: the model is off
    int frac;   // bits kept below the largest exponent: 23 + extra
};
const TcSettings& settings() {
    static const TcSettings s = [] {
        long g = env_long("TC_GROUP", 16), x = env_long("TC_EXTRA_BITS", 2);
        if (g < 0 || g > 64) {
            fprintf(stderr,
                    "error: cuda_cpu: CUDA_CPU_TC_GROUP=%ld: use 1 to 64 products per group, or 0 (no "
                    "tensor-core model: exact products added in fp32)\n",
                    g);
            exit(1);
        }
        if (x < 0 || x > 16) {
            fprintf(stderr, "error: cuda_cpu: CUDA_CPU_TC_EXTRA_BITS=%ld: use 0 to 16\n", x);
            exit(1);
        }
        return TcSettings{(int)g, 23 + (int)x};
    }();
    return s;
}

const int kZeroExp = -30000;  // a zero term's exponent: below every other, even summed

// A float's parts: |x| = mant 2^low, exponent (for emax) at least min_exp; special: Inf/NaN.
struct Term {
    uint32_t mant;
    int low, exp;
    bool neg, special;
};
Term decode(float x, int min_exp) {
    uint32_t u;
    memcpy(&u, &x, 4);
    Term t;
    t.neg = u >> 31;
    int e = (int)(u >> 23 & 0xff);
    uint32_t f = u & 0x7fffff;
    t.special = e == 255;
    if (e == 0)
        t.mant = f, t.low = -149;
    else
        t.mant = f | 0x800000u, t.low = e - 150;
    t.exp = t.mant == 0 ? kZeroExp : (e == 0 ? -126 : e - 127);
    if (t.mant && t.exp < min_exp) t.exp = min_exp;
    return t;
}

// m 2^sh truncated toward zero (sh < 0 shifts right).
int64_t shifted(uint64_t m, int sh) {
    if (sh >= 0) return (int64_t)(m << sh);
    return -sh >= 64 ? 0 : (int64_t)(m >> -sh);
}

// sum 2^q rounded toward zero to fp32 (+0 for 0); past fp32's range: infinity.
__attribute__((always_inline)) inline float rz_float(int64_t sum, int q) {
    if (sum == 0) return 0.0f;
    uint64_t a = sum < 0 ? (uint64_t)-sum : (uint64_t)sum;
    int top = 63 - __builtin_clzll(a) + q;  // the leading bit's exponent
    int lsb = top - 23 < -149 ? -149 : top - 23;
    uint64_t m = lsb >= q ? (lsb - q >= 64 ? 0 : a >> (lsb - q)) : a << (q - lsb);
    uint32_t bits;
    if (m >= 0x800000u) {
        int field = lsb + 23 + 127;
        bits = field >= 255 ? 0x7f800000u : (uint32_t)field << 23 | (uint32_t)(m - 0x800000u);
    } else {
        bits = (uint32_t)m;  // subnormal (lsb = -149)
    }
    if (sum < 0) bits |= 0x80000000u;
    float r;
    memcpy(&r, &bits, 4);
    return r;
}

// One group: c + sum a[i] b[i], i < n (the file's rule).
float fused_group(const Term& c, const Term* a, const Term* b, int n, int frac) {
    int emax = c.exp;
    bool special = c.special;
    for (int i = 0; i < n; i++) {
        special |= a[i].special | b[i].special;
        if (a[i].mant && b[i].mant && a[i].exp + b[i].exp > emax) emax = a[i].exp + b[i].exp;
    }
    if (special) return NAN;  // the caller takes the IEEE path
    if (emax == kZeroExp) return 0.0f;
    int q = emax - frac;  // the grid: multiples of 2^q
    int64_t s = shifted(c.mant, c.low - q) * (c.neg ? -1 : 1);
    for (int i = 0; i < n; i++) {
        if (!a[i].mant || !b[i].mant) continue;
        int64_t t = shifted((uint64_t)a[i].mant * b[i].mant, a[i].low + b[i].low - q);
        s += a[i].neg != b[i].neg ? -t : t;
    }
    return rz_float(s, q);
}

// A group with an Inf or NaN operand: the IEEE double sum (MMA-Sim's model), NaN canonical.
float special_group(float c, const float* a, const float* b, int n) {
    double s = c;
    for (int i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    if (std::isnan(s)) {
        uint32_t u = 0x7fffffffu;
        float r;
        memcpy(&r, &u, 4);
        return r;
    }
    return (float)s;
}

// c + a . b over k, in groups (the model) or one product at a time (group 0).
float chain(float c, const float* a, const float* b, int64_t k, int min_exp) {
    const TcSettings& st = settings();
    if (st.group == 0) {
        for (int64_t i = 0; i < k; i++) c = c + a[i] * b[i];
        return c;
    }
    Term ta[64], tb[64];
    for (int64_t g = 0; g < k; g += st.group) {
        int n = (int)(k - g < st.group ? k - g : st.group);
        for (int i = 0; i < n; i++) ta[i] = decode(a[g + i], min_exp), tb[i] = decode(b[g + i], min_exp);
        float r = fused_group(decode(c, -126), ta, tb, n, st.frac);
        c = std::isnan(r) ? special_group(c, a + g, b + g, n) : r;
    }
    return c;
}

// ---- the matmuls' fast path: the same rule on packed operands ------------------------------------
// Operands of bf16 values as floats with their exponents (int16, at least -126; kZero16 for
// 0), along k. Off the thread of a kernel: the CPU's denormal modes are IEEE here, and a
// product of two bf16 values, and its scaling by a power of two, are exact in double.
const int16_t kZero16 = -16000;  // a zero operand's exponent: sums stay below every other
__attribute__((always_inline)) inline int16_t exp16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    int e = (int)(u >> 23 & 0xff);
    return (u & 0x7fffffffu) == 0 ? kZero16 : (int16_t)(e == 0 ? -126 : e - 127);
}
__attribute__((always_inline)) inline double pow2(int e) {  // 2^e, |e| < 1023
    uint64_t u = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &u, 8);
    return d;
}
// The group's sum, total 2^q (total an integer below 2^53), rounded toward zero to fp32: in
// double (exact), then its last 29 bits cleared where the result is a normal float.
__attribute__((always_inline)) inline float rz_total(double total, int q) {
    double v = total * pow2(q), a = fabs(v);
    if ((a < 0x1p-126 && a != 0) || a >= 0x1p128) return rz_float((int64_t)total, q);
    uint64_t u;
    memcpy(&u, &v, 8);
    u &= ~((1ull << 29) - 1);
    memcpy(&v, &u, 8);
    return (float)v;  // exact
}
// One group of n products with the accumulator c (the file's rule; operands finite).
inline float packed_group_scalar(float c, const float* a, const float* b, const int16_t* ea, const int16_t* eb, int n,
                                 int frac) {
    int emax = c == 0.0f ? kZero16 : exp16(c);
    for (int i = 0; i < n; i++) emax = ea[i] + eb[i] > emax ? ea[i] + eb[i] : emax;
    if (emax < -1000) return 0.0f;  // every term zero
    double scale = pow2(frac - emax);
    int64_t s = (int64_t)((double)c * scale);  // the conversion truncates toward zero
    for (int i = 0; i < n; i++) s += (int64_t)((double)a[i] * (double)b[i] * scale);
    return rz_total((double)s, emax - frac);
}
#if defined(__x86_64__)
// The same for n = 16 with AVX2: exponents 16 at a time, products 4 at a time (each truncated
// value an integer below 2^(frac + 2): their sum in double is exact).
__attribute__((target("avx2"))) inline float packed_group16_avx2(float c, const float* a, const float* b,
                                                                 const int16_t* ea, const int16_t* eb, int frac) {
    __m256i e = _mm256_add_epi16(_mm256_loadu_si256((const __m256i*)ea), _mm256_loadu_si256((const __m256i*)eb));
    __m128i m = _mm_max_epi16(_mm256_castsi256_si128(e), _mm256_extracti128_si256(e, 1));
    m = _mm_max_epi16(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epi16(m, _mm_shuffle_epi32(m, 0xb1));
    m = _mm_max_epi16(m, _mm_shufflelo_epi16(m, 0xb1));
    int emax = (int16_t)_mm_extract_epi16(m, 0), ec = c == 0.0f ? kZero16 : exp16(c);
    emax = ec > emax ? ec : emax;
    if (emax < -1000) return 0.0f;
    double scale = pow2(frac - emax);
    __m256d sc = _mm256_set1_pd(scale), acc = _mm256_setzero_pd();
    for (int i = 0; i < 16; i += 4) {
        __m256d p = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + i)), _mm256_cvtps_pd(_mm_loadu_ps(b + i)));
        acc = _mm256_add_pd(acc, _mm256_round_pd(_mm256_mul_pd(p, sc), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
    }
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd(acc, 1));
    double sum = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    return rz_total(sum + trunc((double)c * scale), emax - frac);
}
#endif

// The packed operands of a matmul and the slice's running sums (cur, m x n).
struct Packed {
    const float *ar, *bc;
    const int16_t *ea, *eb;
    const char *a_special, *b_special;
    int64_t m, n, k, group;
    int frac;
    float* cur;
};
// Adds k in [k0, k1) (whole groups) to every running sum. Cache blocks: a chunk of k for a
// block of rows, against every column; each (i, j) still takes its groups in k order, and the
// block's 16 chains advance a group at a time together (each group waits for its chain's last
// one: 16 chains at once keep the CPU busy). Inlined into one function per instruction set.
template <bool Avx2>
__attribute__((always_inline)) inline void add_range(const Packed& p, int64_t k0, int64_t k1) {
    const int64_t kc = p.group * (256 / p.group > 0 ? 256 / p.group : 1), rows = 16;
    for (int64_t c0 = k0; c0 < k1; c0 += kc) {
        int64_t c1 = c0 + kc < k1 ? c0 + kc : k1;
        for (int64_t i0 = 0; i0 < p.m; i0 += rows) {
            int64_t i1 = i0 + rows < p.m ? i0 + rows : p.m;
            for (int64_t j = 0; j < p.n; j++) {
                float acc[rows];
                bool special = p.b_special[j];
                for (int64_t i = i0; i < i1; i++) acc[i - i0] = p.cur[i + j * p.m], special |= p.a_special[i];
                for (int64_t g = c0; g < c1 && !special; g += p.group) {
                    int len = (int)(c1 - g < p.group ? c1 - g : p.group);
                    int64_t y = j * p.k + g;
                    for (int64_t i = i0; i < i1; i++) {
                        int64_t x = i * p.k + g;
#if defined(__x86_64__)
                        if constexpr (Avx2) {
                            if (len == 16) {
                                acc[i - i0] =
                                    packed_group16_avx2(acc[i - i0], p.ar + x, p.bc + y, p.ea + x, p.eb + y, p.frac);
                                continue;
                            }
                        }
#endif
                        acc[i - i0] =
                            packed_group_scalar(acc[i - i0], p.ar + x, p.bc + y, p.ea + x, p.eb + y, len, p.frac);
                    }
                }
                for (int64_t i = i0; i < i1 && special; i++)  // an Inf or NaN: the general chain
                    acc[i - i0] = chain(acc[i - i0], p.ar + i * p.k + c0, p.bc + j * p.k + c0, c1 - c0, -126);
                for (int64_t i = i0; i < i1; i++) p.cur[i + j * p.m] = acc[i - i0];
            }
        }
    }
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) void add_range_avx2(const Packed& p, int64_t k0, int64_t k1) {
    add_range<true>(p, k0, k1);
}
#endif
void add_range_any(const Packed& p, int64_t k0, int64_t k1) {
#if defined(__x86_64__)
    static const bool avx2 = (__builtin_cpu_init(), __builtin_cpu_supports("avx2"));
    if (avx2) return add_range_avx2(p, k0, k1);
#endif
    add_range<false>(p, k0, k1);
}

uint64_t mix(uint64_t z) {  // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
}  // namespace

// mma_sync runs in a kernel, where the CPU may flush denormals (--use_fast_math): a group with
// a subnormal (or Inf, NaN) term takes the integer path, the others the double one.
float tc_dot(float c, const float* a, const float* b, int k, int min_exp) {
    const TcSettings& st = settings();
    if (st.group == 0 || min_exp != -126) return chain(c, a, b, k, min_exp);
    auto plain = [](float x) {  // zero or normal
        uint32_t u;
        memcpy(&u, &x, 4);
        uint32_t e = u >> 23 & 0xff;
        return e != 255 && (e != 0 || (u & 0x7fffff) == 0);
    };
    int16_t ea[64], eb[64];
    for (int g = 0; g < k; g += st.group) {
        int n = k - g < st.group ? k - g : st.group;
        bool ok = plain(c);
        for (int i = 0; i < n; i++)
            ok &= plain(a[g + i]) & plain(b[g + i]), ea[i] = exp16(a[g + i]), eb[i] = exp16(b[g + i]);
        c = ok ? packed_group_scalar(c, a + g, b + g, ea, eb, n, st.frac) : chain(c, a + g, b + g, n, min_exp);
    }
    return c;
}

bool tc_gemm_modelled() { return numerics_gpu() && settings().group > 0; }

int tc_splits(int64_t m, int64_t n, int64_t k, int batch, size_t workspace_bytes) {
    if (settings().group == 0) return 1;
    int64_t groups = (k + settings().group - 1) / settings().group;
    uint64_t h = mix(mix(mix((uint64_t)m) ^ (uint64_t)n) ^ (uint64_t)k) ^ (uint64_t)env_long("SEED", 1);
    int64_t s = 1 + (int64_t)(mix(h) % 8), per = m * n * (int64_t)batch * 4;
    if (s > groups) s = groups;
    while (s > 1 && (size_t)(s * per) > workspace_bytes) s--;
    return s < 1 ? 1 : (int)s;
}

void tc_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_i, int64_t a_k, const float* b,
             int64_t b_j, int64_t b_k, int splits, float* out) {
    // Rows of op(A) and columns of op(B) packed along k, with their exponents; a row or
    // column holding an Inf or NaN takes the general chain (chain()).
    std::vector<float> ar((size_t)(m * k)), bc((size_t)(n * k));
    std::vector<int16_t> ea((size_t)(m * k)), eb((size_t)(n * k));
    std::vector<char> a_special((size_t)m), b_special((size_t)n);
    for (int64_t i = 0; i < m; i++)
        for (int64_t kk = 0; kk < k; kk++) {
            float x = a[i * a_i + kk * a_k];
            ar[(size_t)(i * k + kk)] = x, ea[(size_t)(i * k + kk)] = exp16(x),
                                a_special[(size_t)i] |= !std::isfinite(x);
        }
    for (int64_t j = 0; j < n; j++)
        for (int64_t kk = 0; kk < k; kk++) {
            float x = b[j * b_j + kk * b_k];
            bc[(size_t)(j * k + kk)] = x, eb[(size_t)(j * k + kk)] = exp16(x),
                                b_special[(size_t)j] |= !std::isfinite(x);
        }
    const int64_t group = settings().group, groups = (k + group - 1) / group;
    std::vector<float> cur((size_t)(m * n));
    Packed p{ar.data(), bc.data(), ea.data(), eb.data(), a_special.data(), b_special.data(),
             m,         n,         k,         group,     settings().frac,  cur.data()};
    for (int s = 0; s < splits; s++) {
        int64_t k0 = groups * s / splits * group, k1 = groups * (s + 1) / splits * group;
        std::fill(cur.begin(), cur.end(), 0.0f);
        add_range_any(p, k0, k1 < k ? k1 : k);
        for (int64_t x = 0; x < m * n; x++)
            out[x] = s == 0 ? cur[(size_t)x] : out[x] + cur[(size_t)x];  // fp32, slice order
    }
    for (int64_t x = 0; x < m * n; x++) out[x] = alpha * out[x];
}

}  // namespace cudacpu
