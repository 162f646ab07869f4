/*
 * dev/test/test_kernels_cuda.cu: every CUDA kernel of llmc/*.cuh, forward and backward,
 * through its host wrapper, against double-precision references written here from the
 * math (never llmc/*.h's CPU code), in the precision the build chose:
 *   make test_kernels_cuda PRECISION=FP32|BF16 [CUDA_ON_CPU=1] && ./test_kernels_cuda [long-sum]
 * (long-sum: only test_matmul_long_sum).
 * TAP (dev/test/check.h): one "ok|not ok N - name [shape] (max err X, tol Y)" line per checked
 * buffer, then the plan; exit 1 on any failure.
 *
 * Inputs. The reference is computed from the exact values the kernel reads: every input
 * is rounded to its device type (floatX, float) on the host first, and the reference
 * takes those values converted to double. So the only differences left are the kernels'
 * own roundings, which the tolerances below bound.
 *
 * Tolerances: first-order error bounds, element by element, never a blanket epsilon.
 *   U  = 2^-24, fp32's unit roundoff: every kernel computes in fp32 (cuBLAS with
 *        CUBLAS_COMPUTE_32F), in both builds. A float sum of k terms in any order (warp
 *        trees, chunked column sums, blocked gemms, FMAs) is within sum_err(k) times the
 *        sum of the terms' magnitudes of the exact sum: gam(k) = kU/(1-kU) in the worst
 *        case (Higham, Accuracy and Stability of Numerical Algorithms, Thm. 3.1) for up to
 *        100 terms, the probabilistic 10 sqrt(k) U beyond (see sum_err). So each reference
 *        also computes that magnitude ("mass") next to its value, and the tolerance is
 *        sum_err(length) * mass plus a few U per elementwise operation on the way. Real
 *        errors sit 10-100x below these bounds; an indexing or masking bug moves a result
 *        by about one term's size or more, well above them for the lengths used here.
 *   XR = 2^-8 in the BF16 build (bf16's unit roundoff), 0 in FP32: the cost of storing
 *        an fp32 result as floatX, once per output, and once more wherever the kernels
 *        keep a floatX intermediate (attention's probabilities and dpreatt).
 *   FAST, FAST_TANH: the BF16 build on a GPU compiles with --use_fast_math, whose expf,
 *        logf, division and sqrt are approximations (relative error below 2^-19 for the
 *        arguments used here; CUDA Programming Guide, "Intrinsic Functions") and whose
 *        tanhf is tanh.approx (relative error 2^-11). 0 in the FP32 build. The CPU
 *        execution layer computes IEEE math by default and, built with
 *        CUDA_CPU_NUMERICS=gpu, each function at its documented worst (docs/cuda_cpu.md);
 *        the bounds hold for both.
 * Bounds are first order (products of two rounding errors dropped); check() multiplies
 * them by 1.05 for that. Outputs that must be exact (masked zeros, floatX(master)) get 0.
 *
 * Buffers. Every device buffer has GUARD elements of a sentinel byte pattern before and
 * after it (checked after each kernel: an off-by-one in a bound shows even where no guard
 * page is hit), and its body starts as 0xff bytes (NaN in fp32 and bf16, -1 as int), so an
 * output element a kernel fails to write fails the comparison. Accumulating outputs (+=)
 * are pre-filled with known values instead, and the reference adds to them.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <initializer_list>
#include <vector>

#include "dev/test/check.h"
#include "llmc/cuda_common.cuh"
#include "llmc/adamw.cuh"
#include "llmc/attention.cuh"
#include "llmc/batch_upload.cuh"
#include "llmc/attention_flash.cuh"
#include "llmc/classifier.cuh"
#include "llmc/encoder.cuh"
#include "llmc/gelu.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/residual.cuh"

typedef std::vector<double> Vec;

// ---- the error model (see the header comment) --------------------------------------------
static const double U = 0x1p-24;
static const double XR = FLOATX_IS_BF16 ? 0x1p-8 : 0.0;
static const double FAST = FLOATX_IS_BF16 ? 0x1p-19 : 0.0;
static const double FAST_TANH = FLOATX_IS_BF16 ? 0x1p-11 : 0.0;
// expf and tanhf are documented within 2 ulps of the correctly rounded result (CUDA C++
// Programming Guide, "Standard Functions"), which is itself within half an ulp: 2.5 ulps of
// the exact value, 5U relative.
static const double F2 = 5 * U;
static double gam(double k) { return k * U / (1.0 - k * U); }
// The error of a float sum of k terms, in any order, over the sum of the terms' magnitudes:
// the worst case gam(k) for up to 100 terms; beyond, Higham & Mary's probabilistic bound
// (SIAM J. Sci. Comput. 41(5), 2019, Thm. 3.1 and its sums/inner products corollary)
// lambda sqrt(k) U with lambda = 10, which fails with probability below 2k exp(-50) (1e-17
// for the lengths here) when the roundings are independent and of mean zero, as with
// random inputs. Without it a 16415-row column sum's bound, gam(16415) = 1e-3 of the mass,
// would be larger than one row's contribution: a dropped row would pass.
static double sum_err(double k) { return k <= 100 ? gam(k) : 10.0 * sqrt(k) * U; }
// Tensor cores (the BF16 build: cuBLAS/cuBLASLt's matmuls, the flash kernels' WMMA) add
// otherwise: a group of TC_G products and the running sum at once, each term truncated toward
// zero to 2^-TC_F of the largest term's exponent, the exact sum rounded toward zero to fp32
// (Fasi et al., PeerJ Comput. Sci. 7:e330, 2021; MMA-Sim, arXiv:2511.10909, 2025: an H100's,
// and an H200's (the same Hopper tensor cores) TC_G 16, TC_F 25; the layer plays them under
// CUDA_CPU_NUMERICS=gpu, docs/cuda_cpu.md). A group's error is then below (its terms + 1)
// 2^-TC_F times its largest term (2^emax is at most that term's magnitude) plus 2U of its
// result (rounding toward zero: an ulp, not half); with U more for an fp32 addition of a
// split-K slice's partial sum. These errors are one-sided (truncation is biased toward zero),
// so they do not cancel like round-to-nearest's (the sqrt(k) bound above needs mean-zero
// errors): over a chain of ceil(k/TC_G) groups they add up, each bounded by B, the largest
// magnitude the chain holds (running sums and products). B <= the mass; for a chain over a
// contiguous range of k (the k loop in order, a split-K slice) every running sum is a
// difference of two prefix sums, so B <= 2 max|prefix sum| + max|product| (Partial).
// In an all-positive sum B is the mass and the bias grows like k, not sqrt(k): a 32778-long
// one's error measured 1.5x 10 sqrt(k) U of it (test_matmul's positive case).
static const int TC_G = 16;
static const int TC_F = 25;
static double tc_err(double k, double B) {
    if (!FLOATX_IS_BF16 || k <= 0) return 0.0;
    double groups = ceil(k / TC_G);
    return ((k + groups) * ldexp(1.0, -TC_F) + groups * 3 * U) * B;
}
// A dot product of length k (mass M, chain bound B <= M) in either model: the fp32 sum (the
// FP32 build, and the CPU layer's IEEE builds) or the tensor cores (a GPU's BF16 build, the
// layer's GPU numerics), 3U of M for the epilogue's alpha, beta C and bias beside the latter.
static double dot_err(double k, double M, double B) { return fmax(sum_err(k) * M, tc_err(k, B) + 3 * U * M); }
static double dot_rel(double k) { return dot_err(k, 1.0, 1.0); }  // of the mass, where B is not tracked
// B for a chain in k order: 2 max|prefix sum| + max|term|, at most the mass.
struct Partial {
    double sum = 0, mass = 0, top = 0, term = 0;
    void add(double t) {
        sum += t, mass += fabs(t), top = fmax(top, fabs(sum)), term = fmax(term, fabs(t));
    }
    double bound() const { return fmin(mass, 2 * top + term); }
};

// ---- host conversions ----------------------------------------------------------------------
// bf16 by its bits (round to nearest even, as __float2bfloat16_rn): the test's own, so
// that the expected rounding does not come from the library under test.
static uint16_t bf16_round_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_bits_value(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// inline, not static: in the FP32 build the bf16 overloads go unused (no warning).
inline void put(float* p, double d) { *p = (float)d; }
inline void put(int* p, double d) { *p = (int)d; }
inline void put(__nv_bfloat16* p, double d) {
    uint16_t b = bf16_round_bits((float)d);
    memcpy((void*)p, &b, 2);
}
inline double get(float x) { return x; }
inline double get(int x) { return x; }
inline double get(__nv_bfloat16 x) {
    uint16_t b;
    memcpy(&b, (const void*)&x, 2);
    return bf16_bits_value(b);
}
// The floatX value a float f becomes (exact for FP32).
static double round_x(float f) {
    floatX t;
    put(&t, f);
    return get(t);
}

// ---- deterministic inputs ------------------------------------------------------------------
static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t next_u64(void) {  // splitmix64
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uni(double lo, double hi) { return lo + (hi - lo) * (double)(next_u64() >> 11) * 0x1p-53; }
static int rand_int(int n) { return (int)(next_u64() % (uint64_t)n); }
static Vec rand_vec(size_t n, double lo, double hi) {
    Vec v(n);
    for (size_t i = 0; i < n; i++) v[i] = uni(lo, hi);
    return v;
}

// ---- device errors ---------------------------------------------------------------------------
static char where[160];  // the case under test, printed with every line

// A device fault is sticky (as on a GPU): report it as a failure of the case, and stop.
static void die_on_error(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    tap_ok(0, "%s [%s]: %s", what, where, cudaGetErrorString(e));
    printf("# stopped at a device error\n");
    exit(done_testing());
}

// ---- device buffers with sentinels ---------------------------------------------------------
#define GUARD 64
static const unsigned char SENTINEL = 0xA5;

template <typename T>
struct Buf {
    T* base;  // the allocation: GUARD + skew sentinel elements, n elements, GUARD sentinels
    T* p;     // what the kernels get
    size_t n, head;
    // skew > 0 moves p off the 128/256-byte alignment the allocator gives, as the views
    // into the trainer's flat parameter and gradient buffers are.
    explicit Buf(size_t n_, size_t skew = 0) : n(n_), head(GUARD + skew) {
        cudaCheck(cudaMalloc((void**)&base, (head + n + GUARD) * sizeof(T)));
        p = base + head;
        cudaCheck(cudaMemset(base, SENTINEL, head * sizeof(T)));
        if (n) cudaCheck(cudaMemset(p, 0xff, n * sizeof(T)));
        cudaCheck(cudaMemset(p + n, SENTINEL, GUARD * sizeof(T)));
    }
    // cudaFree checks the allocation's canary (the CPU layer): a write past the end shows.
    ~Buf() { die_on_error(cudaFree(base), "cudaFree (a write past a buffer's end?)"); }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
};

// Rounds `want` to T, uploads it, returns the exact values uploaded.
template <typename T>
static Vec upload(Buf<T>& b, const Vec& want) {
    std::vector<T> h(b.n);
    Vec exact(b.n);
    for (size_t i = 0; i < b.n; i++) {
        put(&h[i], want[i]);
        exact[i] = get(h[i]);
    }
    if (b.n) cudaCheck(cudaMemcpy(b.p, h.data(), b.n * sizeof(T), cudaMemcpyHostToDevice));
    return exact;
}

template <typename T>
static Vec download(const Buf<T>& b) {
    std::vector<T> h(b.n);
    if (b.n) cudaCheck(cudaMemcpy(h.data(), b.p, b.n * sizeof(T), cudaMemcpyDeviceToHost));
    Vec v(b.n);
    for (size_t i = 0; i < b.n; i++) v[i] = get(h[i]);
    return v;
}

// Whether both sentinel regions are intact; else *at = the first damaged element's index
// relative to p (negative: before the buffer, >= n: after it).
template <typename T>
static bool guards_intact(const Buf<T>& b, long* at) {
    size_t bytes = (b.head + b.n + GUARD) * sizeof(T);
    std::vector<unsigned char> h(bytes);
    cudaCheck(cudaMemcpy(h.data(), b.base, bytes, cudaMemcpyDeviceToHost));
    size_t body0 = b.head * sizeof(T), body1 = (b.head + b.n) * sizeof(T);
    for (size_t i = 0; i < bytes; i++) {
        if (i >= body0 && i < body1) continue;
        if (h[i] != SENTINEL) {
            *at = (long)(i / sizeof(T)) - (long)b.head;
            return false;
        }
    }
    return true;
}

// ---- reporting -----------------------------------------------------------------------------
static void set_case(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(where, sizeof(where), fmt, ap);
    va_end(ap);
}

static void report(bool ok, const char* name, const char* fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    tap_ok(ok, "%s [%s] %s", name, where, detail);
}

// Second-order slack of the first-order bounds (header comment).
#define TOL_SLACK 1.05

// The buffer against ref element by element (|got - ref| <= tol, NaN fails), and its
// sentinels. One line: the largest error and the tolerance of that element; on failure
// the first element out of tolerance as well.
template <typename T>
static void check(const char* name, const Buf<T>& b, const Vec& ref, const Vec& tol) {
    Vec got = download(b);
    double max_err = 0.0, tol_at_max = tol.empty() ? 0.0 : tol[0] * TOL_SLACK;
    long bad = -1;
    for (size_t i = 0; i < b.n; i++) {
        double t = tol[i] * TOL_SLACK, e = fabs(got[i] - ref[i]);
        if (!(e <= t) && bad < 0) bad = (long)i;
        double ek = isnan(e) ? INFINITY : e;
        if (ek > max_err) {
            max_err = ek;
            tol_at_max = t;
        }
    }
    long at = 0;
    bool intact = guards_intact(b, &at);
    if (bad < 0 && intact) {
        report(true, name, "(max err %.3g, tol %.3g)", max_err, tol_at_max);
    } else if (bad >= 0) {
        report(false, name, "(max err %.3g, tol %.3g): element %ld is %.9g, want %.9g +- %.3g%s", max_err, tol_at_max, bad,
               got[bad], ref[bad], tol[bad] * TOL_SLACK, intact ? "" : "; sentinel overwritten too");
    } else {
        report(false, name, "(max err %.3g, tol %.3g): sentinel overwritten at element %ld of %zu", max_err, tol_at_max,
               at, b.n);
    }
}

// Scratch buffers are not compared, but nothing may be written outside them: one line per
// kernel for all of its scratch buffers, naming the first damaged one.
struct Scratch {
    const char* name;
    bool ok;
    long at;
};
template <typename T>
static Scratch scratch(const char* name, const Buf<T>& b) {
    Scratch s = {name, true, 0};
    s.ok = guards_intact(b, &s.at);
    return s;
}
static void report_scratch(const char* what, std::initializer_list<Scratch> list) {
    for (const Scratch& s : list) {
        if (!s.ok) {
            report(false, what, "(sentinel of %s overwritten at element %ld)", s.name, s.at);
            return;
        }
    }
    report(true, what, "(sentinels intact)");
}

// Waits for the stream; a device fault ends the test (it is sticky, as on a GPU).
static void sync(cudaStream_t st, const char* what) {
    cudaError_t e = cudaStreamSynchronize(st);
    if (e == cudaSuccess) e = cudaGetLastError();
    die_on_error(e, what);
}

static Vec zeros(size_t n) { return Vec(n, 0.0); }

// ============================================================================================
// LayerNorm: y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + 1e-5), biased variance.
// ============================================================================================
// Rows with their own offset and spread, so that the mean subtraction and the variance
// matter; row 0 constant (variance 0: rstd = 1/sqrt(eps)).
static Vec layernorm_rows(int N, int C) {
    Vec want((size_t)N * C);
    for (int r = 0; r < N; r++) {
        double off = uni(-2, 2), spread = r == 0 ? 0.0 : uni(0.2, 3.0);
        for (int c = 0; c < C; c++) want[(size_t)r * C + c] = off + spread * uni(-1, 1);
    }
    return want;
}

struct LayerNormRef {
    Vec ro, to, rm, tm, rs, ts;  // output, mean, rstd: values and tolerances
};

// The forward's reference for rows x (N x C, the exact values the kernel reads).
static LayerNormRef layernorm_reference(const Vec& x, const Vec& wv, const Vec& bv, int N, int C) {
    const size_t NC = (size_t)N * C;
    LayerNormRef R{Vec(NC), Vec(NC), Vec(N), Vec(N), Vec(N), Vec(N)};
    Vec &ro = R.ro, &to = R.to, &rm = R.rm, &tm = R.tm, &rs = R.rs, &ts = R.ts;
    const double eps = 1e-5;
    for (int r = 0; r < N; r++) {
        const double* xr = &x[(size_t)r * C];
        double sum = 0, asum = 0;
        for (int c = 0; c < C; c++) sum += xr[c], asum += fabs(xr[c]);
        double m = sum / C, var = 0;
        for (int c = 0; c < C; c++) var += (xr[c] - m) * (xr[c] - m);
        var /= C;
        double s = 1.0 / sqrt(var + eps);
        // The float mean is off by dm; the float variance then is var + dm^2 (the first-order
        // cross term is the mean of x - m, 0) plus its own sum's rounding; rstd's relative
        // error is half the variance's, plus sqrtf and the division (and 1e-5f != 1e-5).
        double dm = sum_err(C + 1) * asum / C + FAST * fabs(m);
        double ds = 0.5 * (sum_err(C + 4) * (var + eps) + dm * dm + 1e-12) / (var + eps) + 2 * U + 2 * FAST;
        rm[r] = m, tm[r] = dm;
        rs[r] = s, ts[r] = s * ds;
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)r * C + c;
            double norm = (xr[c] - m) * s, y = norm * wv[c] + bv[c];
            ro[i] = y;
            // dm and rstd's error through the formula, 3 roundings, the +b rounding, floatX
            to[i] = fabs(wv[c]) * s * dm + fabs(norm * wv[c]) * (ds + 3 * U) + (U + XR) * fabs(y);
        }
    }
    return R;
}

// skew moves the row data off the 16-byte alignment: the element-by-element path.
static void test_layernorm(int B, int T, int C, cudaStream_t st, int skew = 0) {
    set_case("B=%d T=%d C=%d skew=%d", B, T, C, skew);
    const int N = B * T;
    const size_t NC = (size_t)N * C;
    Buf<floatX> inp(NC, skew), w(C), bias(C), out(NC, skew), dout(NC), dinp(NC);
    Buf<float> mean(N), rstd(N), dw(C), db(C);
    Vec x = upload(inp, layernorm_rows(N, C)), wv = upload(w, rand_vec(C, -1.5, 1.5)), bv = upload(bias, rand_vec(C, -1, 1));

    layernorm_forward(out.p, mean.p, rstd.p, inp.p, w.p, bias.p, B, T, C, st);
    sync(st, "layernorm_forward");

    LayerNormRef R = layernorm_reference(x, wv, bv, N, C);
    const Vec &rm = R.rm, &rs = R.rs;
    check("layernorm_forward out", out, R.ro, R.to);
    check("layernorm_forward mean", mean, R.rm, R.tm);
    check("layernorm_forward rstd", rstd, R.rs, R.ts);

    // Backward at the reference statistics (as floats, what the kernel reads), so that it is
    // tested on its own. dinp, dweight and dbias accumulate: pre-filled, the reference adds.
    Vec mf = upload(mean, rm), sf = upload(rstd, rs);
    Vec dy = upload(dout, rand_vec(NC, -1, 1));
    Vec pre_dx = upload(dinp, rand_vec(NC, -1, 1));
    Vec pre_dw = upload(dw, rand_vec(C, -1, 1)), pre_db = upload(db, rand_vec(C, -1, 1));
    const int chunks = colreduce_num_chunks(N);
    Buf<float> partials((size_t)2 * chunks * C);  // exactly what layernorm_backward documents
    layernorm_backward(dinp.p, dw.p, db.p, partials.p, dout.p, inp.p, w.p, mean.p, rstd.p, B, T, C, st);
    sync(st, "layernorm_backward");

    Vec rdx(NC), tdx(NC), rdw(pre_dw), mdw(C), rdb(pre_db), mdb(C);
    for (int c = 0; c < C; c++) mdw[c] = fabs(pre_dw[c]), mdb[c] = fabs(pre_db[c]);
    for (int r = 0; r < N; r++) {
        double m = mf[r], s = sf[r], A = 0, Bm = 0, aA = 0, aB = 0;
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)r * C + c;
            double norm = (x[i] - m) * s, dn = wv[c] * dy[i];
            A += dn, Bm += dn * norm, aA += fabs(dn), aB += fabs(dn * norm);
            rdw[c] += dy[i] * norm, mdw[c] += fabs(dy[i] * norm);
            rdb[c] += dy[i], mdb[c] += fabs(dy[i]);
        }
        A /= C, Bm /= C, aA /= C, aB /= C;
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)r * C + c;
            double norm = (x[i] - m) * s, dn = wv[c] * dy[i];
            double g = (dn - A - norm * Bm) * s;
            rdx[i] = pre_dx[i] + g;
            // the two row means (gam of the row length, over their magnitudes), the
            // elementwise chain, then dinp + g rounded in fp32 and stored as floatX
            tdx[i] = s * (sum_err(C + 8) + FAST) * (fabs(dn) + aA + fabs(norm) * (fabs(Bm) + aB)) + gam(4) * fabs(g) +
                     (U + XR) * fabs(rdx[i]);
        }
    }
    Vec tdw(C), tdb(C);
    // column sums over N rows (any chunking) plus the pre-filled value; each dy*norm term
    // carries 3 roundings of its own
    for (int c = 0; c < C; c++) tdw[c] = sum_err(N + 6) * mdw[c], tdb[c] = sum_err(N + 2) * mdb[c];
    check("layernorm_backward dinp (+=)", dinp, rdx, tdx);
    check("layernorm_backward dweight (+=)", dw, rdw, tdw);
    check("layernorm_backward dbias (+=)", db, rdb, tdb);
    report_scratch("layernorm_backward scratch", {scratch("partials", partials)});
}

// The residual add fused into LayerNorm: residual = floatX(a + b) (fp32 sum, one rounding:
// exact in the reference too, the sum of two floatX being exact in double), then the
// LayerNorm of that rounded residual, whose reference is layernorm_reference's. Also the
// property the model relies on: the same bits as residual_forward + layernorm_forward.
static void test_layernorm_fused_residual(int B, int T, int C, cudaStream_t st, int skew = 0) {
    set_case("B=%d T=%d C=%d skew=%d", B, T, C, skew);
    const int N = B * T;
    const size_t NC = (size_t)N * C;
    Buf<floatX> a(NC, skew), b(NC), w(C), bias(C), res(NC), out(NC, skew), res2(NC), out2(NC, skew);
    Buf<float> mean(N), rstd(N), mean2(N), rstd2(N);
    Vec want = layernorm_rows(N, C), half = rand_vec(NC, -1, 1);
    Vec A = upload(a, want), Bv = upload(b, half);
    Vec wv = upload(w, rand_vec(C, -1.5, 1.5)), bv = upload(bias, rand_vec(C, -1, 1));
    layernorm_fused_residual_forward(res.p, out.p, mean.p, rstd.p, a.p, b.p, w.p, bias.p, B, T, C, st);
    sync(st, "layernorm_fused_residual_forward");
    Vec rr(NC);
    for (size_t i = 0; i < NC; i++) rr[i] = round_x((float)(A[i] + Bv[i]));
    check("layernorm_fused_residual residual = floatX(a + b)", res, rr, zeros(NC));
    LayerNormRef R = layernorm_reference(rr, wv, bv, N, C);
    check("layernorm_fused_residual out", out, R.ro, R.to);
    check("layernorm_fused_residual mean", mean, R.rm, R.tm);
    check("layernorm_fused_residual rstd", rstd, R.rs, R.ts);
    residual_forward(res2.p, a.p, b.p, NC, st);
    layernorm_forward(out2.p, mean2.p, rstd2.p, res2.p, w.p, bias.p, B, T, C, st);
    sync(st, "residual_forward + layernorm_forward");
    check("layernorm_fused_residual out == unfused bits", out, download(out2), zeros(NC));
    check("layernorm_fused_residual mean == unfused bits", mean, download(mean2), zeros(N));
    check("layernorm_fused_residual rstd == unfused bits", rstd, download(rstd2), zeros(N));
}

// ============================================================================================
// Linear: out = inp @ W^T + bias; dinp = dout @ W; dW += dout^T @ inp; db += colsum(dout).
// ============================================================================================
// The references, each with the magnitude ("mass") of its sum next to its value.
// out (BT,OC) = x (BT,C) @ W (OC,C)^T (+ b)
// part: each chain's bound B (Partial; the bias is the epilogue's, not the chain's).
static void ref_linear(const Vec& x, const Vec& W, const Vec* b, int BT, int C, int OC, Vec* out, Vec* mass,
                       Vec* part) {
    out->assign((size_t)BT * OC, 0.0), mass->assign((size_t)BT * OC, 0.0), part->assign((size_t)BT * OC, 0.0);
    for (int r = 0; r < BT; r++) {
        for (int o = 0; o < OC; o++) {
            Partial p;
            for (int c = 0; c < C; c++) p.add(x[(size_t)r * C + c] * W[(size_t)o * C + c]);
            double bias = b ? (*b)[o] : 0.0;
            (*out)[(size_t)r * OC + o] = bias + p.sum, (*mass)[(size_t)r * OC + o] = fabs(bias) + p.mass;
            (*part)[(size_t)r * OC + o] = p.bound();
        }
    }
}
// dinp (BT,C) = dy (BT,OC) @ W (OC,C)
static void ref_linear_dinp(const Vec& dy, const Vec& W, int BT, int C, int OC, Vec* out, Vec* mass, Vec* part) {
    out->assign((size_t)BT * C, 0.0), mass->assign((size_t)BT * C, 0.0), part->assign((size_t)BT * C, 0.0);
    for (int r = 0; r < BT; r++) {
        for (int c = 0; c < C; c++) {
            Partial p;
            for (int o = 0; o < OC; o++) p.add(dy[(size_t)r * OC + o] * W[(size_t)o * C + c]);
            size_t i = (size_t)r * C + c;
            (*out)[i] = p.sum, (*mass)[i] = p.mass, (*part)[i] = p.bound();
        }
    }
}
// dW (OC,C) = pre + dy^T @ x, and the bound of its fp32 sum (an fp32 output: no floatX rounding)
static void ref_linear_dweight(const Vec& dy, const Vec& x, const Vec& pre, int BT, int C, int OC, Vec* out, Vec* tol) {
    out->assign((size_t)OC * C, 0.0), tol->assign((size_t)OC * C, 0.0);
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            Partial p;
            for (int r = 0; r < BT; r++) p.add(dy[(size_t)r * OC + o] * x[(size_t)r * C + c]);
            double pre_oc = pre[(size_t)o * C + c];
            (*out)[(size_t)o * C + c] = pre_oc + p.sum;
            (*tol)[(size_t)o * C + c] = dot_err(BT + 2, fabs(pre_oc) + p.mass, p.bound());
        }
    }
}
// db (OC) = pre + column sums of dy (BT,OC), and the bound of its fp32 sum
static void ref_colsum(const Vec& dy, const Vec& pre, int BT, int OC, Vec* out, Vec* tol) {
    out->assign(OC, 0.0), tol->assign(OC, 0.0);
    for (int o = 0; o < OC; o++) {
        double s = pre[o], m = fabs(s);
        for (int r = 0; r < BT; r++) s += dy[(size_t)r * OC + o], m += fabs(dy[(size_t)r * OC + o]);
        (*out)[o] = s, (*tol)[o] = sum_err(BT + 2) * m;
    }
}
// The bound of a dot product of length k (its mass and chain bound given) stored as floatX.
static Vec dot_tol(const Vec& ref, const Vec& mass, const Vec& part, int k) {
    Vec t(ref.size());
    for (size_t i = 0; i < ref.size(); i++) t[i] = dot_err(k, mass[i], part[i]) + XR * fabs(ref[i]);
    return t;
}

// Which way an epilogue's call went: its plan (the key llmc/matmul.cuh makes from these
// operands) never asked for, run fused, or refused by the heuristic (a GPU's cuBLASLt may
// have no algorithm; on the layer CUDA_CPU_BLASLT_HEURISTIC plays it), so that the product's
// separate kernels ran. The tests accept both of the last two and check the numerics of the
// one taken.
enum EpiloguePath { NOT_ASKED, FUSED, SEPARATE };
static const char* path_name(EpiloguePath p) {
    return p == FUSED ? "fused" : p == SEPARATE ? "refused by the heuristic: separate kernels" : "never asked for";
}
static EpiloguePath epilogue_path(cublasLtEpilogue_t e, int m, int n, int k, const void* a, const void* b,
                                  const void* d, const void* bias, const void* aux) {
    int align[6] = {ptr_alignment(a), ptr_alignment(b), ptr_alignment(d), ptr_alignment(d),
                    bias ? ptr_alignment(bias) : 0, aux ? ptr_alignment(aux) : 0};
    for (int i = 0; i < cuda_libs.num_plans; i++) {
        const MatmulPlanKey& key = cuda_libs.plans[i]->key;
        if (key.epilogue == (int)e && key.m == m && key.n == n && key.k == k &&
            memcmp(key.align, align, sizeof(align)) == 0)
            return cuda_libs.plans[i]->found ? FUSED : SEPARATE;
    }
    return NOT_ASKED;
}

// lo: the inputs' lower end (-1; 0 makes every sum one-sided, where tensor cores' truncation
// does not cancel: tc_err).
static void test_matmul(int BT, int C, int OC, bool with_bias, int skew, cudaStream_t st, double lo = -1) {
    set_case("BT=%d C=%d OC=%d bias=%d skew=%d%s", BT, C, OC, (int)with_bias, skew, lo < 0 ? "" : " positive");
    Buf<floatX> inp((size_t)BT * C), weight((size_t)OC * C, skew), bias(OC, skew), out((size_t)BT * OC, skew);
    Vec x = upload(inp, rand_vec((size_t)BT * C, lo, 1));
    Vec W = upload(weight, rand_vec((size_t)OC * C, lo, 1));
    Vec bv = upload(bias, rand_vec(OC, lo, 1));
    matmul_forward(out.p, inp.p, weight.p, with_bias ? bias.p : NULL, BT, C, OC, st);
    sync(st, "matmul_forward");
    Vec ro, mo, po;
    ref_linear(x, W, with_bias ? &bv : NULL, BT, C, OC, &ro, &mo, &po);
    // fp32 dot + bias, one floatX store; without the BIAS epilogue the dot is stored first
    // (one more floatX rounding of |out - bias|), then add_bias_kernel adds it
    EpiloguePath path = with_bias ? epilogue_path(CUBLASLT_EPILOGUE_BIAS, OC, BT, C, weight.p, inp.p, out.p, bias.p,
                                                  NULL)
                                  : NOT_ASKED;
    Vec to = dot_tol(ro, mo, po, C + 2);
    for (size_t i = 0; path == SEPARATE && i < to.size(); i++) to[i] += XR * (fabs(ro[i]) + fabs(bv[i % OC]));
    check(with_bias ? "matmul_forward out (bias)" : "matmul_forward out (no bias)", out, ro, to);
    if (with_bias) report(path != NOT_ASKED, "matmul_forward bias path", "(BIAS epilogue %s)", path_name(path));

    Buf<floatX> dout((size_t)BT * OC), dinp((size_t)BT * C);  // dinp: poison, must be overwritten
    Buf<float> dW((size_t)OC * C, skew), db(OC, skew);
    const int chunks = colreduce_num_chunks(BT);
    Buf<float> partials((size_t)chunks * OC);  // exactly what matmul_backward documents
    Vec dy = upload(dout, rand_vec((size_t)BT * OC, lo, 1));
    Vec pre_dW = upload(dW, rand_vec((size_t)OC * C, lo, 1)), pre_db = upload(db, rand_vec(OC, lo, 1));
    matmul_backward(dinp.p, dW.p, with_bias ? db.p : NULL, partials.p, dout.p, inp.p, weight.p, BT, C, OC, st);
    sync(st, "matmul_backward");

    Vec rdx, mdx, pdx, rdW, tdW;
    ref_linear_dinp(dy, W, BT, C, OC, &rdx, &mdx, &pdx);
    ref_linear_dweight(dy, x, pre_dW, BT, C, OC, &rdW, &tdW);
    check("matmul_backward dinp", dinp, rdx, dot_tol(rdx, mdx, pdx, OC + 1));
    check("matmul_backward dweight (+=)", dW, rdW, tdW);
    if (with_bias) {
        Vec rdb, tdb;
        ref_colsum(dy, pre_db, BT, OC, &rdb, &tdb);
        check("matmul_backward dbias (+=)", db, rdb, tdb);
    } else {
        // dbias NULL (the tied classifier): nothing may touch the buffer.
        check("matmul_backward dbias untouched (NULL)", db, pre_db, zeros(OC));
    }
    report_scratch("matmul_backward scratch", {scratch("partials", partials)});
}

// GELU's value and derivative in double, with the bounds of their fp32 evaluation (the
// kernels' formulas): u = sqrt(2/pi) (x + 0.044715 x^3) in float, 6 roundings (constants
// included); tanhf F2, plus tanh_err (an approximate tanh's relative error).
struct GeluRef {
    double y, ty;  // gelu(x), its bound before the output's rounding to floatX
    double g, tg;  // gelu'(x), its bound
};
static GeluRef gelu_ref(double x, double tanh_err) {
    const double GS = sqrt(2.0 / M_PI), K = 0.044715;
    double u = GS * (x + K * x * x * x), th = tanh(u);
    double dth = (1 - th * th) * 6 * U * fabs(u) + (F2 + tanh_err) * fabs(th);
    GeluRef r;
    r.y = 0.5 * x * (1 + th);
    r.ty = 0.5 * fabs(x) * dth + 3 * U * fabs(r.y);
    // d/dx: (1 + tanh u)/2 + x/2 sech^2(u) du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    double sech2 = 1 - th * th, dudx = GS * (1 + 3 * K * x * x);
    double t1 = 0.5 * (1 + th), t2 = 0.5 * x * sech2 * dudx;
    r.g = t1 + t2;
    // sech2 = 1 - th*th in float: 2|th| dth + 2U absolute; the second term: 8 roundings
    r.tg = 0.5 * dth + U * t1 + 8 * U * fabs(t2) + fabs(0.5 * x * dudx) * (2 * fabs(th) * dth + 2 * U) + U * fabs(r.g);
    return r;
}

// cuBLASLt's GELU epilogue: the layer computes it as the kernels do (tanhf); a GPU's
// cuBLASLt does not document its tanh, so there tanh.approx's bound (2^-11) is assumed.
#ifdef __CUDA_CPU__
static const double LT_TANH = FAST_TANH;
#else
static const double LT_TANH = 0x1p-11;
#endif

// The fc layer's forward with GELU: pre = inp @ W^T + b, out = gelu(pre). Fused (one
// GELU_AUX_BIAS call) where OC % 8 == 0 and the heuristic has an algorithm, separate
// kernels otherwise (matmul_forward, whose BIAS epilogue may be refused too, then gelu of
// the floatX pre).
static void test_matmul_gelu(int BT, int C, int OC, int skew, cudaStream_t st) {
    set_case("BT=%d C=%d OC=%d skew=%d", BT, C, OC, skew);
    Buf<floatX> inp((size_t)BT * C), weight((size_t)OC * C, skew), bias(OC, skew), out((size_t)BT * OC),
        pre((size_t)BT * OC);
    Vec x = upload(inp, rand_vec((size_t)BT * C, -1, 1));
    Vec W = upload(weight, rand_vec((size_t)OC * C, -1, 1));
    Vec bv = upload(bias, rand_vec(OC, -1, 1));
    matmul_forward_gelu(out.p, pre.p, inp.p, weight.p, bias.p, BT, C, OC, st);
    sync(st, "matmul_forward_gelu");
    EpiloguePath gelu = epilogue_path(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, OC, BT, C, weight.p, inp.p, out.p, bias.p, pre.p);
    bool fused = gelu == FUSED;  // else matmul_forward ran, with or without its BIAS epilogue
    EpiloguePath bias_path =
        fused ? NOT_ASKED : epilogue_path(CUBLASLT_EPILOGUE_BIAS, OC, BT, C, weight.p, inp.p, pre.p, bias.p, NULL);
    Vec rp, mp, pp;
    ref_linear(x, W, &bv, BT, C, OC, &rp, &mp, &pp);
    Vec tp = dot_tol(rp, mp, pp, C + 2), ry(rp.size()), ty(rp.size());
    for (size_t i = 0; i < rp.size(); i++) {
        if (bias_path == SEPARATE) tp[i] += XR * (fabs(rp[i]) + fabs(bv[i % OC]));  // the dot stored, then + bias
        // GELU of an input off by at most tp (the fp32 sum, and the floatX pre in the
        // separate path): |gelu'| tp to first order, |gelu''| <= 0.8 bounds the second.
        GeluRef g = gelu_ref(rp[i], fused ? LT_TANH : FAST_TANH);
        ry[i] = g.y;
        ty[i] = (fabs(g.g) + g.tg) * tp[i] + 0.4 * tp[i] * tp[i] + g.ty + XR * fabs(g.y);
    }
    check("matmul_forward_gelu pre (aux)", pre, rp, tp);
    check("matmul_forward_gelu out = gelu(pre)", out, ry, ty);
    // The aux rule (ld a multiple of 8) is the product's to keep: it never asks otherwise.
    bool allowed = OC % 8 == 0;
    report(allowed ? gelu != NOT_ASKED && (fused || bias_path != NOT_ASKED) : gelu == NOT_ASKED && bias_path != NOT_ASKED,
           "matmul_forward_gelu path", "(GELU_AUX_BIAS %s%s; BIAS %s)", path_name(gelu),
           allowed ? "" : ": aux ld % 8 != 0", path_name(bias_path));
}

// The fused backward: dinp = (dout @ W) * gelu'(gelu_pre) (DGELU where C % 8 == 0 and the
// heuristic has an algorithm, else gelu_backward after the matmul), dW += dout^T inp, db +=
// colsum(dout) (BGRADB into the scratch, then added, or bias_backward: the grad views are
// pre-filled, so the += is checked). Each of the two is decided alone: aux_skew (elements)
// moves gelu_pre and scratch_skew the scratch off their alignment, which the documented
// heuristic refuses for that epilogue only.
static void test_matmul_backward_fused(int BT, int C, int OC, bool with_gelu, int skew, cudaStream_t st,
                                       int aux_skew = 0, int scratch_skew = 0) {
    set_case("BT=%d C=%d OC=%d gelu=%d skew=%d aux_skew=%d scratch_skew=%d", BT, C, OC, (int)with_gelu, skew,
             aux_skew, scratch_skew);
    Buf<floatX> inp((size_t)BT * C), weight((size_t)OC * C, skew), dout((size_t)BT * OC), dinp((size_t)BT * C),
        gelu_pre((size_t)BT * C, aux_skew);
    Buf<float> dW((size_t)OC * C, skew), db(OC, skew);
    Buf<float> partials((size_t)colreduce_num_chunks(BT) * OC, scratch_skew);
    Vec x = upload(inp, rand_vec((size_t)BT * C, -1, 1));
    Vec W = upload(weight, rand_vec((size_t)OC * C, -1, 1));
    Vec gp = upload(gelu_pre, rand_vec((size_t)BT * C, -4, 4));
    Vec dy = upload(dout, rand_vec((size_t)BT * OC, -1, 1));
    Vec pre_dW = upload(dW, rand_vec((size_t)OC * C, -1, 1)), pre_db = upload(db, rand_vec(OC, -1, 1));
    matmul_backward_fused(dinp.p, dW.p, db.p, partials.p, dout.p, inp.p, weight.p, with_gelu ? gelu_pre.p : NULL, BT,
                          C, OC, st);
    sync(st, "matmul_backward_fused");
    EpiloguePath dgelu = epilogue_path(CUBLASLT_EPILOGUE_DGELU, C, BT, OC, weight.p, dout.p, dinp.p, NULL, gelu_pre.p);
    EpiloguePath bgrad = epilogue_path(CUBLASLT_EPILOGUE_BGRADB, C, OC, BT, inp.p, dout.p, dW.p, partials.p, NULL);

    Vec rd, md, pd, rdW, tdW, rdb, tdb;
    ref_linear_dinp(dy, W, BT, C, OC, &rd, &md, &pd);
    Vec rdx = rd, tdx = dot_tol(rd, md, pd, OC + 1);
    if (with_gelu) {
        for (size_t i = 0; i < rd.size(); i++) {
            // the fp32 dot times the fp32 gelu' (one rounding), stored as floatX; the separate
            // path stores the dot as floatX first (a second XR)
            GeluRef g = gelu_ref(gp[i], dgelu == FUSED ? LT_TANH : FAST_TANH);
            rdx[i] = rd[i] * g.g;
            tdx[i] = fabs(g.g) * dot_err(OC + 1, md[i], pd[i]) + fabs(rd[i]) * g.tg + (U + 2 * XR) * fabs(rdx[i]);
        }
    }
    ref_linear_dweight(dy, x, pre_dW, BT, C, OC, &rdW, &tdW);
    ref_colsum(dy, pre_db, BT, OC, &rdb, &tdb);  // any fp32 order: BGRADB's, or bias_backward's chunks
    check(with_gelu ? "matmul_backward_fused dinp = (dout @ W) * gelu'(pre)" : "matmul_backward_fused dinp", dinp, rdx,
          tdx);
    check("matmul_backward_fused dweight (+=)", dW, rdW, tdW);
    check("matmul_backward_fused dbias (+=)", db, rdb, tdb);
    report_scratch("matmul_backward_fused scratch", {scratch("partials", partials)});
    report(bgrad != NOT_ASKED, "matmul_backward_fused dbias path", "(BGRADB %s)", path_name(bgrad));
    if (with_gelu) {  // the aux rule (ld a multiple of 8) is the product's: it never asks otherwise
        bool allowed = C % 8 == 0;
        report(allowed ? dgelu != NOT_ASKED : dgelu == NOT_ASKED, "matmul_backward_fused dinp path", "(DGELU %s%s)",
               path_name(dgelu), allowed ? "" : ": aux ld % 8 != 0");
    }
}

// One-sided sums 32778 long, where the tensor cores' truncation adds up (tc_err); under the
// layer's CUDA_CPU_SEED=1 this shape's dweight chain is not split along k: the longest chain.
static void test_matmul_long_sum(cudaStream_t st) { test_matmul(32778, 8, 8, true, 0, st, 0.0); }

// Plans are cached per key: a shape seen before runs no heuristic, a new shape or a new
// alignment of a view does. (Shapes no other case uses: this runs first.)
static void test_matmul_plans(cudaStream_t st) {
    set_case("plan cache");
    const int C = 24, OC = 40;
    Buf<floatX> inp((size_t)5 * C), weight((size_t)OC * C), skewed((size_t)OC * C, 8), out((size_t)5 * OC);
    upload(inp, rand_vec((size_t)5 * C, -1, 1));
    upload(weight, rand_vec((size_t)OC * C, -1, 1));
    upload(skewed, rand_vec((size_t)OC * C, -1, 1));
    long h0 = cuda_libs.heuristic_calls;
    int p0 = cuda_libs.num_plans;
    matmul_forward(out.p, inp.p, weight.p, NULL, 3, C, OC, st);
    long h1 = cuda_libs.heuristic_calls;
    matmul_forward(out.p, inp.p, weight.p, NULL, 3, C, OC, st);
    long h2 = cuda_libs.heuristic_calls;
    matmul_forward(out.p, inp.p, weight.p, NULL, 5, C, OC, st);
    long h3 = cuda_libs.heuristic_calls;
    matmul_forward(out.p, inp.p, skewed.p, NULL, 5, C, OC, st);
    long h4 = cuda_libs.heuristic_calls;
    sync(st, "matmul_forward (plans)");
    report(h1 == h0 + 1 && h2 == h1, "plan cache: a shape's second call",
           "(heuristic calls %ld then %ld more; want 1, 0)", h1 - h0, h2 - h1);
    report(h3 == h2 + 1, "plan cache: a new shape", "(%ld heuristic calls; want 1)", h3 - h2);
    report(h4 == h3 + 1, "plan cache: a view of another alignment", "(%ld heuristic calls; want 1)", h4 - h3);
    report(cuda_libs.num_plans == p0 + 3, "plan cache: one plan per key", "(%d new plans; want 3)",
           cuda_libs.num_plans - p0);
}

// After cuda_libs_free: no plan left, and on the layer no cuBLASLt descriptor alive (the
// layer counts them; a GPU's cuBLASLt cannot be asked, so there it is not asserted).
static void test_plans_freed(void) {
    set_case("cuda_libs_free");
#ifdef __CUDA_CPU__
    long live = cudacpu::blas_live_descriptors();
    report(cuda_libs.num_plans == 0 && live == 0, "plans freed at exit", "(%d plans, %ld live descriptors; want 0, 0)",
           cuda_libs.num_plans, live);
#else
    report(cuda_libs.num_plans == 0, "plans freed at exit", "(%d plans; live descriptors: not asserted off the layer)",
           cuda_libs.num_plans);
#endif
}

// Row t of head (b, h) of qkv (B,T,3C) values X: pre[t2] = scale q_t . k_t2 and S[t2] =
// sum_d |q_t,d k_t2,d| (the product's magnitude) for t2 <= t; returns max pre.
static double causal_scores(const Vec& X, int T, int C, int hs, int b, int h, int t, double scale, double* pre,
                            double* S) {
    double mx = -INFINITY;
    const double* q = &X[((size_t)(b * T + t) * 3) * C + (size_t)h * hs];
    for (int t2 = 0; t2 <= t; t2++) {
        const double* k = &X[((size_t)(b * T + t2) * 3 + 1) * C + (size_t)h * hs];
        double s = 0, a = 0;
        for (int d = 0; d < hs; d++) s += q[d] * k[d], a += fabs(q[d] * k[d]);
        pre[t2] = scale * s, S[t2] = a;
        mx = fmax(mx, pre[t2]);
    }
    return mx;
}

// ============================================================================================
// Causal self-attention: per (b, h): P = softmax_causal(q k^T / sqrt(hs)), out = P v.
// ============================================================================================
static void test_attention(int B, int T, int C, int NH, cudaStream_t st) {
    set_case("B=%d T=%d C=%d NH=%d", B, T, C, NH);
    const int hs = C / NH;
    const size_t btc = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    const double scale = 1.0 / sqrt((double)hs);
    Buf<floatX> qkv(3 * btc), out(btc), att(natt), qkvr(3 * btc), vaccum(btc);
    Buf<float> preatt(natt);
    Vec X = upload(qkv, rand_vec(3 * btc, -1.5, 1.5));
    auto at_qkv = [&](int b, int t, int part, int h, int d) {
        return ((size_t)(b * T + t) * 3 + part) * C + (size_t)h * hs + d;
    };
    auto at_att = [&](int b, int h, int t1, int t2) { return (((size_t)b * NH + h) * T + t1) * T + t2; };
    auto at_out = [&](int b, int t, int h, int d) { return (size_t)(b * T + t) * C + (size_t)h * hs + d; };

    attention_forward(out.p, qkvr.p, vaccum.p, preatt.p, att.p, qkv.p, B, T, C, NH, st);
    sync(st, "attention_forward");

    Vec rp(natt, 0.0), tp(natt, 0.0), ro(btc), to(btc);
    std::vector<double> pre(T), S(T);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                double mx = causal_scores(X, T, C, hs, b, h, t, scale, pre.data(), S.data());
                // Each exponent's argument: the gemm (dot_rel(hs) * mass, times the scale), the
                // float scale (1.0f/sqrtf: 2U) and its product (U), the max subtracted (U of
                // the difference), expf (F2). A probability's relative error is at
                // most its own argument's plus the weighted mean of all (the normaliser),
                // plus the float sum and the division.
                double sum = 0, E = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    sum += exp(pre[t2] - mx);
                    double e = 3 * U * fabs(pre[t2]) + scale * dot_rel(hs) * S[t2] + U * fabs(pre[t2] - mx) + F2 + FAST;
                    E = fmax(E, e);
                }
                double relp = 2 * E + sum_err(t + 5) + 2 * FAST;
                for (int t2 = 0; t2 <= t; t2++) {
                    double p = exp(pre[t2] - mx) / sum;
                    rp[at_att(b, h, t, t2)] = p;
                    tp[at_att(b, h, t, t2)] = (relp + XR) * p;  // att is stored as floatX
                }
                // Above the diagonal: exactly 0 (rp, tp already 0).
                for (int d = 0; d < hs; d++) {
                    double s = 0, M = 0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        double p = rp[at_att(b, h, t, t2)], v = X[at_qkv(b, t2, 2, h, d)];
                        s += p * v, M += p * fabs(v);
                    }
                    ro[at_out(b, t, h, d)] = s;
                    // the probabilities' errors (float and, in BF16, the floatX att the gemm
                    // reads: XR * sum p|v|, i.e. up to 2^-8 max|v|), the gemm over T, the store
                    to[at_out(b, t, h, d)] = (relp + XR + dot_rel(T + 3)) * M + XR * fabs(s);
                }
            }
        }
    }
    check("attention_forward out", out, ro, to);
    check("attention_forward att", att, rp, tp);
    report_scratch("attention_forward scratch",
                   {scratch("qkvr", qkvr), scratch("vaccum", vaccum), scratch("preatt", preatt)});

    // Backward, on its own: att is the reference softmax stored as floatX (what the
    // forward keeps), and the reference uses those stored values, as the kernel does.
    Buf<floatX> att_in(natt), dout(btc), dqkv(3 * btc), dqkvr(3 * btc), dout_perm(btc), dpreatt(natt);
    Buf<float> datt(natt);
    Vec A = upload(att_in, rp);
    Vec dy = upload(dout, rand_vec(btc, -1, 1));
    attention_backward(dqkv.p, qkvr.p, dqkvr.p, dout_perm.p, datt.p, dpreatt.p, dout.p, qkv.p, att_in.p, B, T, C, NH,
                       st);
    sync(st, "attention_backward");

    Vec rd(3 * btc, 0.0), td(3 * btc, 0.0);
    Vec dpre((size_t)T * T), Ed((size_t)T * T);  // one (b, h): dpreatt and its error bound
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t1 = 0; t1 < T; t1++) {
                std::vector<double> da(t1 + 1), Sdv(t1 + 1);
                double dot = 0, Adot = 0, Edot = 0;
                for (int t2 = 0; t2 <= t1; t2++) {
                    double s = 0, a = 0;
                    for (int d = 0; d < hs; d++) {
                        double dv = dy[at_out(b, t1, h, d)] * X[at_qkv(b, t2, 2, h, d)];
                        s += dv, a += fabs(dv);
                    }
                    da[t2] = s, Sdv[t2] = a;
                    double p = A[at_att(b, h, t1, t2)];
                    dot += p * s, Adot += p * fabs(s), Edot += p * dot_rel(hs) * a;
                }
                Edot += sum_err(t1 + 2) * Adot;  // datt's gemm errors through the dot, and its sum
                for (int t2 = 0; t2 < T; t2++) {
                    size_t k = (size_t)t1 * T + t2;
                    if (t2 > t1) {
                        dpre[k] = 0, Ed[k] = 0;
                        continue;
                    }
                    double p = A[at_att(b, h, t1, t2)];
                    dpre[k] = scale * p * (da[t2] - dot);
                    // datt's gemm, the dot, the subtraction; the float scale, 3 products; the
                    // floatX store of dpreatt (an intermediate the next gemms read)
                    Ed[k] = scale * p * (dot_rel(hs) * Sdv[t2] + Edot + U * fabs(da[t2] - dot)) +
                            (gam(5) + FAST + XR) * fabs(dpre[k]);
                }
            }
            for (int t = 0; t < T; t++) {
                for (int d = 0; d < hs; d++) {
                    double q = 0, qm = 0, qe = 0, kk = 0, km = 0, ke = 0, v = 0, vm = 0;
                    for (int o = 0; o < T; o++) {
                        // dq[t] = sum_o dpre[t,o] k[o]; dk[t] = sum_o dpre[o,t] q[o]; dv[t] = sum_o att[o,t] dout[o]
                        double kv = X[at_qkv(b, o, 1, h, d)], qv = X[at_qkv(b, o, 0, h, d)];
                        q += dpre[(size_t)t * T + o] * kv, qm += fabs(dpre[(size_t)t * T + o] * kv);
                        qe += Ed[(size_t)t * T + o] * fabs(kv);
                        kk += dpre[(size_t)o * T + t] * qv, km += fabs(dpre[(size_t)o * T + t] * qv);
                        ke += Ed[(size_t)o * T + t] * fabs(qv);
                        double p = A[at_att(b, h, o, t)], g = dy[at_out(b, o, h, d)];
                        v += p * g, vm += fabs(p * g);
                    }
                    rd[at_qkv(b, t, 0, h, d)] = q, td[at_qkv(b, t, 0, h, d)] = qe + dot_rel(T + 2) * qm + XR * fabs(q);
                    rd[at_qkv(b, t, 1, h, d)] = kk;
                    td[at_qkv(b, t, 1, h, d)] = ke + dot_rel(T + 2) * km + XR * fabs(kk);
                    rd[at_qkv(b, t, 2, h, d)] = v, td[at_qkv(b, t, 2, h, d)] = dot_rel(T + 2) * vm + XR * fabs(v);
                }
            }
        }
    }
    check("attention_backward dqkv", dqkv, rd, td);
    report_scratch("attention_backward scratch", {scratch("qkvr", qkvr), scratch("dqkvr", dqkvr),
                                                  scratch("dout_perm", dout_perm), scratch("datt", datt),
                                                  scratch("dpreatt", dpreatt)});
}

// ============================================================================================
// Flash attention (llmc/attention_flash.cuh): the same math as above, without (B,NH,T,T)
// buffers; out and lse = log sum_t2 exp(s[t2]) per row from the forward, dqkv from the
// backward given qkv, dout, out and lse.
// ============================================================================================
static void test_flash_attention(int B, int T, int NH, int hs, cudaStream_t st) {
    set_case("flash B=%d T=%d NH=%d hs=%d", B, T, NH, hs);
    const int C = NH * hs;
    const size_t btc = (size_t)B * T * C, rows = (size_t)B * NH * T;
    const double scale = 1.0 / sqrt((double)hs);
    Buf<floatX> qkv(3 * btc), out(btc);
    Buf<float> lse(rows);
    Vec X = upload(qkv, rand_vec(3 * btc, -1.5, 1.5));
    auto at_qkv = [&](int b, int t, int part, int h, int d) {
        return ((size_t)(b * T + t) * 3 + part) * C + (size_t)h * hs + d;
    };
    auto at_out = [&](int b, int t, int h, int d) { return (size_t)(b * T + t) * C + (size_t)h * hs + d; };
    auto at_row = [&](int b, int h, int t) { return ((size_t)b * NH + h) * T + t; };
    attention_flash_forward(out.p, lse.p, qkv.p, B, T, C, NH, st);
    sync(st, "attention_flash_forward");

    // Reference: s = scale q.k, p = softmax over t2 <= t, out = sum p v, lse = log sum e^s.
    // Error model of the kernel, per row t with nt = ceil((t+1)/BC) key tiles:
    //   E   each exponent's argument and expf, as in test_attention (the product of hs
    //       terms, the float scale, the max subtracted, expf, fast math);
    //   eps the rescalings: tile j's weights are multiplied by the later tiles' factors
    //       alpha = expf(m_old - m_new), each within F2 + FAST + U |argument| (|argument| <=
    //       2 max|s|), and O and l by alpha once per tile in float (2U): nt times that;
    //   XR  P is rounded to floatX before P v, and l sums those rounded values, so each
    //       normalised weight is off by at most 2 XR relative; out is stored as floatX;
    //   the float sums of P v and of l over t+1 terms plus nt rescaled adds, the division.
    Vec ro(btc), to(btc), rl(rows), tl(rows), P((size_t)T);
    std::vector<double> pre(T), S(T);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                double mx = causal_scores(X, T, C, hs, b, h, t, scale, pre.data(), S.data()), amax = 0;
                for (int t2 = 0; t2 <= t; t2++) amax = fmax(amax, fabs(pre[t2]));
                double sum = 0, E = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    sum += exp(pre[t2] - mx);
                    E = fmax(E,
                             3 * U * fabs(pre[t2]) + scale * dot_rel(hs) * S[t2] + U * fabs(pre[t2] - mx) + F2 + FAST);
                }
                int bc = flash_forward_key_tile(hs), nt = t / bc + 1;
                double eps = nt * (F2 + 2 * U + FAST + 2 * U * amax), chain = sum_err(t + 1 + nt);
                // P v: in BF16 each key tile's product on tensor cores from zero (its chain
                // bounded by its own mass), the tiles added into O in fp32: nt roundings.
                double pv_chain = fmax(chain, tc_err(bc, 1.0) + gam(nt));
                double relw = 2 * (E + eps) + 2 * XR + 2 * chain + 2 * U;  // a normalised weight's error
                for (int t2 = 0; t2 <= t; t2++) P[t2] = exp(pre[t2] - mx) / sum;
                rl[at_row(b, h, t)] = mx + log(sum);
                tl[at_row(b, h, t)] = 2 * U * fabs(mx + log(sum)) + E + eps + XR + chain + 2 * U;
                for (int d = 0; d < hs; d++) {
                    double o = 0, M = 0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        double v = X[at_qkv(b, t2, 2, h, d)];
                        o += P[t2] * v, M += P[t2] * fabs(v);
                    }
                    ro[at_out(b, t, h, d)] = o;
                    to[at_out(b, t, h, d)] = (relw + pv_chain) * M + XR * fabs(o);
                }
            }
        }
    }
    check("attention_flash_forward out", out, ro, to);
    check("attention_flash_forward lse", lse, rl, tl);
    // The naive kernels on the same input: both are within their bounds of the reference, and
    // test_attention's bound is below this one term by term (XR once, not twice; no
    // rescalings), so the two differ by at most twice the flash bound.
    {
        Buf<floatX> nout(btc), att((size_t)B * NH * T * T), qkvr(3 * btc), vaccum(btc);
        Buf<float> preatt((size_t)B * NH * T * T);
        attention_forward(nout.p, qkvr.p, vaccum.p, preatt.p, att.p, qkv.p, B, T, C, NH, st);
        sync(st, "attention_forward (naive, for the comparison)");
        Vec n = download(nout), t2(btc);
        for (size_t i = 0; i < btc; i++) t2[i] = 2 * to[i];
        check("attention_flash_forward out = naive out", out, n, t2);
    }

    // Backward from the reference forward: out and lse as the kernels would store them
    // (floatX, float), dout random. Reference: dp = dout v^T, D = sum dout out (of the stored
    // out, as the kernel reads it), ds = p (dp - D), dq = scale ds k, dk = scale ds^T q,
    // dv = p^T dout, with p exact. The kernel's p = expf(scale q.k - lse) carries the score's
    // error, lse's float rounding, the subtraction and expf (Ep); it is rounded to floatX
    // for dv (XR), and ds to floatX for dq and dk; dp and D are float sums of hs terms.
    Buf<floatX> out_in(btc), dout(btc), dqkv(3 * btc);
    Buf<float> lse_in(rows), Dbuf(rows);
    Vec O = upload(out_in, ro), Lse = upload(lse_in, rl);
    Vec dy = upload(dout, rand_vec(btc, -1, 1));
    attention_flash_backward(dqkv.p, Dbuf.p, dout.p, out_in.p, qkv.p, lse_in.p, B, T, C, NH, st);
    sync(st, "attention_flash_backward");
    Vec rd(3 * btc, 0.0), td(3 * btc, 0.0);
    Vec ds((size_t)T * T), Ed((size_t)T * T), pp((size_t)T * T), Ep((size_t)T * T);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                double Dv = 0, SD = 0;
                for (int d = 0; d < hs; d++) {
                    Dv += dy[at_out(b, t, h, d)] * O[at_out(b, t, h, d)];
                    SD += fabs(dy[at_out(b, t, h, d)] * O[at_out(b, t, h, d)]);
                }
                double lrow = Lse[at_row(b, h, t)];
                for (int t2 = 0; t2 < T; t2++) {
                    size_t k = (size_t)t * T + t2;
                    if (t2 > t) {
                        ds[k] = Ed[k] = pp[k] = Ep[k] = 0;
                        continue;
                    }
                    double s = 0, a = 0, dp = 0, adp = 0;
                    for (int d = 0; d < hs; d++) {
                        double qk = X[at_qkv(b, t, 0, h, d)] * X[at_qkv(b, t2, 1, h, d)];
                        double gv = dy[at_out(b, t, h, d)] * X[at_qkv(b, t2, 2, h, d)];
                        s += qk, a += fabs(qk), dp += gv, adp += fabs(gv);
                    }
                    double p = exp(scale * s - rl[at_row(b, h, t)]);  // the exact softmax
                    pp[k] = p;
                    Ep[k] = 3 * U * scale * fabs(s) + scale * dot_rel(hs) * a +
                            fabs(lrow - rl[at_row(b, h, t)]) + U * fabs(scale * s - lrow) + F2 + FAST;
                    ds[k] = p * (dp - Dv);
                    Ed[k] = Ep[k] * fabs(ds[k]) + p * (dot_rel(hs) * (adp + SD) + U * fabs(dp - Dv)) +
                            (U + XR) * fabs(ds[k]);
                }
            }
            // dq[t] = sum_o ds[t,o] k[o], dk[o] = sum_t ds[t,o] q[t], dv[o] = sum_t p[t,o] dout[t]
            // over o <= t, with their magnitudes ("m"), propagated errors ("e") and chain bounds
            // ("p": in BF16 each is one WMMA chain along T, o up from 0 for dq, t up from the
            // diagonal for dk and dv, the orders of these loops).
            Vec q((size_t)T * hs, 0.0), qm(q), qe(q), kk(q), km(q), ke(q), v(q), vm(q), ve(q);
            std::vector<Partial> qp((size_t)T * hs), kp(qp), vp(qp);
            for (int t = 0; t < T; t++) {
                for (int o = 0; o <= t; o++) {
                    size_t k = (size_t)t * T + o;
                    double dso = ds[k], edo = Ed[k], p = pp[k], ep = Ep[k] + XR;
                    for (int d = 0; d < hs; d++) {
                        double kv = X[at_qkv(b, o, 1, h, d)], qv = X[at_qkv(b, t, 0, h, d)], g = dy[at_out(b, t, h, d)];
                        size_t td_ = (size_t)t * hs + d, od = (size_t)o * hs + d;
                        q[td_] += dso * kv, qm[td_] += fabs(dso * kv), qe[td_] += edo * fabs(kv);
                        kk[od] += dso * qv, km[od] += fabs(dso * qv), ke[od] += edo * fabs(qv);
                        v[od] += p * g, vm[od] += fabs(p * g), ve[od] += ep * fabs(p * g);
                        qp[td_].add(dso * kv), kp[od].add(dso * qv), vp[od].add(p * g);
                    }
                }
            }
            double sq = scale * (1 + 2 * U);
            for (int t = 0; t < T; t++) {
                for (int d = 0; d < hs; d++) {
                    size_t i = (size_t)t * hs + d;
                    rd[at_qkv(b, t, 0, h, d)] = scale * q[i];
                    td[at_qkv(b, t, 0, h, d)] =
                        sq * (qe[i] + dot_err(T + 1, qm[i], qp[i].bound())) + (2 * U + XR) * fabs(scale * q[i]);
                    rd[at_qkv(b, t, 1, h, d)] = scale * kk[i];
                    td[at_qkv(b, t, 1, h, d)] =
                        sq * (ke[i] + dot_err(T + 1, km[i], kp[i].bound())) + (2 * U + XR) * fabs(scale * kk[i]);
                    rd[at_qkv(b, t, 2, h, d)] = v[i];
                    td[at_qkv(b, t, 2, h, d)] = ve[i] + dot_err(T + 1, vm[i], vp[i].bound()) + XR * fabs(v[i]);
                }
            }
        }
    }
    check("attention_flash_backward dqkv", dqkv, rd, td);
    report_scratch("attention_flash_backward scratch", {scratch("D", Dbuf)});
    // Bitwise the same on a second run (no atomics; fixed sums).
    Vec first = download(dqkv);
    attention_flash_backward(dqkv.p, Dbuf.p, dout.p, out_in.p, qkv.p, lse_in.p, B, T, C, NH, st);
    sync(st, "attention_flash_backward (again)");
    check("attention_flash_backward dqkv rerun is bitwise equal", dqkv, first, zeros(3 * btc));
}

// Head sizes the flash kernels take (multiples of 16 up to 128), and those they refuse.
static void test_flash_shapes(void) {
    set_case("flash_attention_supported");
    bool ok = flash_attention_supported(48, 3) && flash_attention_supported(768, 12) &&
              flash_attention_supported(128, 1) && !flash_attention_supported(72, 3) &&   // hs 24
              !flash_attention_supported(144, 1) && !flash_attention_supported(50, 3) &&  // hs 144; 50/3
              !flash_attention_supported(8, 1);
    report(ok, "flash head sizes", "(16, 64, 128 accepted; 24, 144, 8 and C %% NH != 0 refused)");
}

// ============================================================================================
// GELU, tanh approximation: y = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// ============================================================================================
// skew: inp off the 16-byte alignment (the element-by-element path).
static void test_gelu(size_t n, cudaStream_t st, int skew = 0) {
    set_case("n=%zu skew=%d", n, skew);
    Buf<floatX> inp(n, skew), out(n), grad(n);
    Vec want = rand_vec(n, -6, 6);
    const double special[] = {0.0, -0.0, 1.0, -1.0, 0.5, -3.0, 6.0, -6.0, 1e-4, -1e-4};
    for (size_t i = 0; i < n && i < sizeof(special) / sizeof(special[0]); i++) want[i] = special[i];
    Vec x = upload(inp, want);
    gelu_forward(out.p, inp.p, n, st);
    sync(st, "gelu_forward");

    Vec ry(n), ty(n), rg(n), tg(n);
    Vec dy = upload(grad, rand_vec(n, -1, 1));  // dout, overwritten in place by dinp
    for (size_t i = 0; i < n; i++) {
        GeluRef g = gelu_ref(x[i], FAST_TANH);
        ry[i] = g.y;
        ty[i] = g.ty + XR * fabs(g.y);
        rg[i] = g.g * dy[i];
        tg[i] = g.tg * fabs(dy[i]) + (U + XR) * fabs(rg[i]);
    }
    check("gelu_forward out", out, ry, ty);
    // In place, as the trainer calls it: dinp == dout.
    gelu_backward(grad.p, inp.p, grad.p, n, st);
    sync(st, "gelu_backward");
    check("gelu_backward dinp (aliasing dout)", grad, rg, tg);
}

// ============================================================================================
// Embeddings: out[b,t] = wte[tok[b,t]] + wpe[t]; dwte[v] += sum over positions of token v,
// dwpe[t] += sum over b.
// ============================================================================================
// dominant: 9 of 10 positions hold token 0 (an end-of-text or padding token dominating a
// batch: its sum is cut into segments whose partials a second kernel adds).
static void test_encoder(int B, int T, int C, int V, cudaStream_t st, bool dominant = false) {
    set_case("B=%d T=%d C=%d V=%d%s", B, T, C, V, dominant ? " dominant" : "");
    const int BT = B * T;
    const size_t n = (size_t)BT * C;
    Buf<floatX> wte((size_t)V * C), wpe((size_t)T * C), out(n), dout(n);
    Buf<int> tok(BT);
    Buf<float> dwte((size_t)V * C), dwpe((size_t)T * C);
    std::vector<int> h_tok(BT);
    // Few distinct tokens for many positions (repeats), the last row of wte used.
    for (int i = 0; i < BT; i++) h_tok[i] = dominant && rand_int(10) ? 0 : rand_int(V < 8 ? V : V / 4);
    h_tok[BT - 1] = V - 1;
    Vec tv(BT);
    for (int i = 0; i < BT; i++) tv[i] = h_tok[i];
    upload(tok, tv);
    Vec E = upload(wte, rand_vec((size_t)V * C, -1, 1)), P = upload(wpe, rand_vec((size_t)T * C, -1, 1));
    encoder_forward(out.p, tok.p, wte.p, wpe.p, B, T, C, st);
    sync(st, "encoder_forward");
    Vec ro(n), to(n);
    for (int bt = 0; bt < BT; bt++) {
        for (int c = 0; c < C; c++) {
            double y = E[(size_t)h_tok[bt] * C + c] + P[(size_t)(bt % T) * C + c];
            ro[(size_t)bt * C + c] = y;
            to[(size_t)bt * C + c] = (U + XR) * fabs(y);
        }
    }
    check("encoder_forward out", out, ro, to);

    // Backward as the model runs it: one plan, rebuilt every micro-step; two micro-steps
    // with different tokens accumulate into the same gradients.
    Vec rwte = upload(dwte, rand_vec((size_t)V * C, -1, 1)), rwpe = upload(dwpe, rand_vec((size_t)T * C, -1, 1));
    Vec mwte(rwte.size()), mwpe(rwpe.size());
    std::vector<int> cnt_wte(V, 0);
    for (size_t i = 0; i < rwte.size(); i++) mwte[i] = fabs(rwte[i]);
    for (size_t i = 0; i < rwpe.size(); i++) mwpe[i] = fabs(rwpe[i]);
    EncoderBackwardPlan plan;
    encoder_plan_init(&plan, BT, C);
    for (int step = 0; step < 2; step++) {
        if (step == 1) {
            for (int i = 0; i < BT; i++) h_tok[i] = dominant && rand_int(10) ? 0 : rand_int(V);
            h_tok[0] = V - 1;
        }
        Vec dy = upload(dout, rand_vec(n, -1, 1));
        encoder_plan_build(&plan, h_tok.data(), BT, st);
        encoder_backward(dwte.p, dwpe.p, dout.p, &plan, B, T, C, 0, st);
        sync(st, "encoder_backward");
        if (dominant) {  // the plan's segments: none longer than ENCODER_WTE_SEGMENT, all positions once
            std::vector<int> h(plan.num_ints);
            cudaCheck(cudaMemcpy(h.data(), plan.d_ints, h.size() * sizeof(int), cudaMemcpyDeviceToHost));
            const int* seg_start = h.data() + plan.num_unique + BT;
            bool ok = seg_start[0] == 0 && seg_start[plan.num_segments] == BT && plan.num_multi > 0;
            for (int k = 0; k < plan.num_segments; k++) {
                int len = seg_start[k + 1] - seg_start[k];
                ok = ok && len >= 1 && len <= ENCODER_WTE_SEGMENT;
            }
            report(ok, "encoder_backward plan segments", "(%d segments of at most %d positions, %d tokens of several)",
                   plan.num_segments, ENCODER_WTE_SEGMENT, plan.num_multi);
        }
        for (int bt = 0; bt < BT; bt++) {
            cnt_wte[h_tok[bt]]++;
            for (int c = 0; c < C; c++) {
                double g = dy[(size_t)bt * C + c];
                rwte[(size_t)h_tok[bt] * C + c] += g, mwte[(size_t)h_tok[bt] * C + c] += fabs(g);
                rwpe[(size_t)(bt % T) * C + c] += g, mwpe[(size_t)(bt % T) * C + c] += fabs(g);
            }
        }
        // Each accumulated element: a float sum of (its count + the pre-fill + one add per
        // micro-step) terms. Rows of unused tokens must come back bit for bit.
        Vec twte(rwte.size()), twpe(rwpe.size());
        for (int v = 0; v < V; v++)
            for (int c = 0; c < C; c++) twte[(size_t)v * C + c] = sum_err(cnt_wte[v] + 2 * (step + 1)) * mwte[(size_t)v * C + c];
        for (size_t i = 0; i < twpe.size(); i++) twpe[i] = sum_err(B * (step + 1) + 2 * (step + 1)) * mwpe[i];
        check(step == 0 ? "encoder_backward dwte (+=)" : "encoder_backward dwte (+=, 2nd micro-step)", dwte, rwte, twte);
        check(step == 0 ? "encoder_backward dwpe (+=)" : "encoder_backward dwpe (+=, 2nd micro-step)", dwpe, rwpe, twpe);
    }
    encoder_plan_free(&plan);
}

// ============================================================================================
// Softmax cross-entropy over the V real columns of Vp: lse = log sum exp, loss = lse - x[target];
// dlogits = (softmax - onehot) * dloss, 0 in the padding.
// ============================================================================================
// The mean, in double, of what a buffer holds.
static double mean_of(const Buf<float>& b) {
    Vec got = download(b);
    double m = 0;
    for (double g : got) m += g;
    return m / (double)got.size();
}

// skew: logits off the 16-byte alignment (the fused kernel's element-by-element path).
static void test_crossentropy(int BT, int V, int Vp, cudaStream_t st, int skew = 0) {
    set_case("BT=%d V=%d Vp=%d skew=%d", BT, V, Vp, skew);
    const size_t n = (size_t)BT * Vp;
    Buf<floatX> logits(n, skew);
    Buf<int> targets(BT);
    Buf<float> losses(BT), lse(BT), mean(1);
    std::vector<int> tgt(BT);
    Vec tv(BT), want(n);
    for (int r = 0; r < BT; r++) {
        tgt[r] = r == 0 ? V - 1 : r == 1 ? 0 : rand_int(V);
        tv[r] = tgt[r];
        for (int v = 0; v < Vp; v++) {
            // Padding holds a large value: included anywhere, it would dominate.
            double x = v >= V ? 50.0 : r % 7 == 3 ? 0.75 : uni(-4, 4);  // row 3: all equal
            if (v == tgt[r] && r % 5 == 2) x = 9.0;                      // peaked rows: loss ~ 0
            want[(size_t)r * Vp + v] = x;
        }
    }
    upload(targets, tv);
    Vec X = upload(logits, want);

    Vec rl(BT), tl(BT), rlse(BT), tlse(BT);
    for (int r = 0; r < BT; r++) {
        const double* x = &X[(size_t)r * Vp];
        double mx = -INFINITY, mn = INFINITY;
        for (int v = 0; v < V; v++) mx = fmax(mx, x[v]), mn = fmin(mn, x[v]);
        double S = 0;
        for (int v = 0; v < V; v++) S += exp(x[v] - mx);
        double L = mx + log(S);
        rlse[r] = L, rl[r] = L - x[tgt[r]];
        // The sum of exps: each term's argument rounding (U of x - max), expf (F2), the
        // float sum over V; logf (1 ulp of the correctly rounded result: 3U of its result); the
        // final + (U); __logf's absolute error.
        double dS = U * (mx - mn) + F2 + FAST + sum_err(V);
        tlse[r] = dS + 3 * U * fabs(log(S)) + FAST * (1 + fabs(log(S))) + U * fabs(L);
        tl[r] = tlse[r] + U * fabs(rl[r]);
    }
    // Call 1 overwrites the mean (pre-filled with NaN); call 2 adds to it, as the model does.
    for (int call = 0; call < 2; call++) {
        Vec prev = download(mean);
        crossentropy_forward(losses.p, lse.p, mean.p, call, logits.p, targets.p, BT, V, Vp, st);
        sync(st, "crossentropy_forward");
        check("crossentropy_forward losses", losses, rl, tl);
        check("crossentropy_forward lse", lse, rlse, tlse);
        // The mean of the losses the kernel wrote (so this checks mean_loss alone): summed
        // in double, rounded to float (U), then added in float (U).
        double m = mean_of(losses);
        Vec rm(1, call ? prev[0] + m : m), tm(1, U * fabs(m) + (call ? U * fabs(rm[0]) : 0.0));
        check(call ? "crossentropy_forward mean loss (accumulate=1)" : "crossentropy_forward mean loss (accumulate=0)",
              mean, rm, tm);
    }
    check("crossentropy_forward leaves logits intact", logits, X, zeros(n));

    // Backward in place, from the reference lse (as float, what the kernel reads).
    Vec L = upload(lse, rlse);
    const float dloss = 1.0f / (float)BT;
    crossentropy_backward(logits.p, lse.p, targets.p, dloss, BT, V, Vp, st);
    sync(st, "crossentropy_backward");
    Vec rg(n, 0.0), tg(n, 0.0);  // padding: exactly 0
    for (int r = 0; r < BT; r++) {
        for (int v = 0; v < V; v++) {
            size_t i = (size_t)r * Vp + v;
            double p = exp(X[i] - L[r]), ind = v == tgt[r] ? 1.0 : 0.0, g = (p - ind) * (double)dloss;
            rg[i] = g;
            // x - lse rounded (U of it), expf, the subtraction, the product, the store
            tg[i] = (double)dloss * (p * (U * fabs(X[i] - L[r]) + F2 + FAST) + U * fabs(p - ind)) + (U + XR) * fabs(g);
        }
    }
    check("crossentropy_backward dlogits (in place, padding 0)", logits, rg, tg);

    // Fused forward + backward (one kernel per row, in place) from the original logits. Its
    // lse comes from an online sum: every time a thread's running max grows, its sum is
    // rescaled by one more expf (F2) and product (U); a thread sees at most
    // ceil(V / 1024) + PACK_X elements, and the block's combination adds one more rescale.
    // dlogits use the kernel's own lse: its error moves each probability by p * that.
    upload(logits, X);
    Buf<float> flosses(BT), flse(BT), fmean(1);
    crossentropy_forward_backward(logits.p, flosses.p, flse.p, fmean.p, 0, targets.p, dloss, BT, V, Vp, st);
    sync(st, "crossentropy_forward_backward");
    const double rescales = ceil(V / 1024.0) + PACK_X + 1;
    Vec ftlse(BT), ftl(BT);
    for (int r = 0; r < BT; r++) {
        ftlse[r] = tlse[r] + rescales * (F2 + U + FAST);
        ftl[r] = ftlse[r] + U * fabs(rl[r]);
    }
    check("crossentropy_fused losses", flosses, rl, ftl);
    check("crossentropy_fused lse", flse, rlse, ftlse);
    double fm = mean_of(flosses);
    check("crossentropy_fused mean loss", fmean, Vec(1, fm), Vec(1, U * fabs(fm)));
    Vec ftg(tg);
    for (int r = 0; r < BT; r++) {
        for (int v = 0; v < V; v++) {
            size_t i = (size_t)r * Vp + v;
            ftg[i] += (double)dloss * exp(X[i] - rlse[r]) * ftlse[r] * 1.01;  // e^(lse error) ~ 1 + it
        }
    }
    check("crossentropy_fused dlogits (in place, padding 0)", logits, rg, ftg);
}

// ============================================================================================
// Residual: out = a + b.
// ============================================================================================
static void test_residual(size_t n, cudaStream_t st, int skew = 0) {
    set_case("n=%zu skew=%d", n, skew);
    Buf<floatX> a(n), b(n, skew), out(n);
    Vec A = upload(a, rand_vec(n, -2, 2)), Bv = upload(b, rand_vec(n, -2, 2));
    residual_forward(out.p, a.p, b.p, n, st);
    sync(st, "residual_forward");
    Vec r(n), t(n);
    for (size_t i = 0; i < n; i++) r[i] = A[i] + Bv[i], t[i] = (U + XR) * fabs(r[i]);
    check("residual_forward out", out, r, t);
}

// ============================================================================================
// Global L2 norm of the fp32 gradients and the clip factor clip/norm (1 when norm <= clip or
// clip <= 0).
// ============================================================================================
static void test_global_norm(size_t n, cudaStream_t st) {
    set_case("n=%zu", n);
    Buf<float> g(n), norm(1), factor(1);
    Buf<double> partials(GLOBAL_NORM_BLOCKS);
    Vec want = rand_vec(n, -1, 1);
    for (size_t i = 0; i < n; i += 97) want[i] *= 1e-3;  // magnitudes that differ
    Vec G = upload(g, want);
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += G[i] * G[i];
    const double ref_norm = sqrt(ss);
    // clip off; clip active (half the norm); clip inactive (twice the norm)
    const float clips[3] = {0.0f, n ? (float)(0.5 * ref_norm) : 1.0f, (float)(2 * ref_norm + 1)};
    const char* names[3] = {"clip off", "clip active", "clip inactive"};
    for (int k = 0; k < 3; k++) {
        global_norm(norm.p, factor.p, partials.p, g.p, n, clips[k], st);
        sync(st, "global_norm");
        // Double accumulation (error ~ n 2^-53, negligible), one rounding to float.
        Vec rn(1, ref_norm), tn(1, U * ref_norm + n * 0x1p-52 * ref_norm);
        char name[96];
        snprintf(name, sizeof(name), "global_norm norm (%s)", names[k]);
        check(name, norm, rn, tn);
        bool active = clips[k] > 0.0f && ref_norm > clips[k];
        // clip / norm in float: the norm's rounding and the division's; exactly 1 otherwise
        Vec rf(1, active ? clips[k] / ref_norm : 1.0), tf(1, active ? (3 * U + FAST) * rf[0] : 0.0);
        snprintf(name, sizeof(name), "global_norm clip factor (%s)", names[k]);
        check(name, factor, rf, tf);
        snprintf(name, sizeof(name), "global_norm scratch (%s)", names[k]);
        report_scratch(name, {scratch("partials", partials)});
    }
}

// ============================================================================================
// AdamW (PyTorch's torch.optim.AdamW, decoupled weight decay, bias correction), written from
// the definition: g *= clip factor; p -= lr wd p (decaying tensors); m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps);
// params = floatX(p) (round to nearest even).
// ============================================================================================
// Tensors of the given sizes and weight decays, one after another, in one launch.
static void test_adamw(std::initializer_list<size_t> sizes, std::initializer_list<int> decay_list, float grad_scale,
                       cudaStream_t st) {
    std::vector<size_t> size_v(sizes);
    std::vector<int> decay_v(decay_list);
    size_t n = 0;
    std::vector<int> decays;  // per element
    char shape[128] = "";
    for (size_t k = 0; k < size_v.size(); k++) {
        n += size_v[k];
        decays.insert(decays.end(), size_v[k], decay_v[k]);
        snprintf(shape + strlen(shape), sizeof(shape) - strlen(shape), "%s%zu%s", k ? "," : "", size_v[k],
                 decay_v[k] ? "d" : "");
    }
    set_case("tensors %s (d: decays) grad_scale=%g", shape, grad_scale);
    const size_t model = 1000;  // the first tensor's model-space index (the bits' element count starts there)
    AdamWTensors tensors;
    adamw_tensors_init(&tensors, size_v.data(), decay_v.data(), (int)size_v.size(), model);
    Buf<floatX> params(n);
    Buf<float> master(n), grads(n), m(n), v(n), gscale(1);
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    Vec P = upload(master, rand_vec(n, -1, 1));
    Vec M = upload(m, rand_vec(n, -0.1, 0.1));
    Vec Vv = upload(v, rand_vec(n, 0, 0.01));
    upload(gscale, Vec(1, grad_scale));
    for (int t = 3; t <= 4; t++) {  // two consecutive steps, the second from the first's state
        Vec want = rand_vec(n, -1, 1);
        for (size_t i = 0; i < n; i += 5) want[i] *= 1e-6;  // tiny gradients: eps matters
        if (n > 3) want[3] = 0.0;
        Vec G = upload(grads, want);
        // The step's fields by their meaning in llmc/adamw.h (not through its helper).
        AdamWStep s;
        s.lr = lr, s.beta1 = b1, s.beta2 = b2, s.eps = eps, s.weight_decay = wd;
        s.beta1_correction = (float)(1.0 - pow((double)b1, t));
        s.beta2_correction = (float)(1.0 - pow((double)b2, t));
        s.grad_scale = NAN;  // the kernel must take the factor from device memory
        s.step = t, s.stochastic = t == 4, s.rounding_seed = 7;  // the second step rounds stochastically
        adamw_update(params.p, master.p, grads.p, m.p, v.p, &tensors, &s, gscale.p, st);
        sync(st, "adamw_update");

        const double c1 = 1.0 - pow((double)b1, t), c2 = 1.0 - pow((double)b2, t);
        const double LR = lr, B1 = b1, B2 = b2, EPS = eps, WD = wd;
        Vec rp(n), tp(n), rm(n), tm(n), rv(n), tv(n);
        for (size_t i = 0; i < n; i++) {
            double g = G[i] * (double)grad_scale;
            double p = P[i], dec = decays[i] ? LR * WD * p : 0.0;
            p -= dec;
            double mn = B1 * M[i] + (1 - B1) * g, vn = B2 * Vv[i] + (1 - B2) * g * g;
            double denom = sqrt(vn / c2) + EPS, upd = LR * (mn / c1) / denom;
            rm[i] = mn, rv[i] = vn, rp[i] = p - upd;
            // m, v: the scaled gradient, two products, the sum (v's terms are >= 0: no
            // cancellation, so v is relatively accurate; m may cancel: absolute bound).
            tm[i] = 4 * U * (fabs(B1 * M[i]) + fabs((1 - B1) * g));
            tv[i] = 6 * U * (fabs(B2 * Vv[i]) + fabs((1 - B2) * g * g));
            // p: the decay (3 roundings), m's absolute error through the update, the update's
            // relative error (the float corrections, v/2 through sqrt, divisions, eps, lr:
            // 12U), the final subtraction.
            tp[i] = U * fabs(p) + 2 * U * fabs(dec) + LR * tm[i] / (c1 * denom) + (12 * U + 4 * FAST) * fabs(upd) +
                    U * fabs(rp[i]);
        }
        char name[64];
        snprintf(name, sizeof(name), "adamw_update master (t=%d)", t);
        check(name, master, rp, tp);
        snprintf(name, sizeof(name), "adamw_update m (t=%d)", t);
        check(name, m, rm, tm);
        snprintf(name, sizeof(name), "adamw_update v (t=%d)", t);
        check(name, v, rv, tv);
        // params: exactly the kernel's own master rounded to floatX (nearest even, or at
        // t=4 with bf16 stochastically, with element model + i's bits).
        P = download(master), M = download(m), Vv = download(v);
        Vec rx(n);
        for (size_t i = 0; i < n; i++) {
            rx[i] = FLOATX_IS_BF16 && s.stochastic ? bf16_to_float(adamw_round_bf16((float)P[i], &s, model + i))
                                                   : round_x((float)P[i]);
        }
        snprintf(name, sizeof(name), "adamw_update params = floatX(master) (t=%d)", t);
        check(name, params, rx, zeros(n));
    }
    adamw_tensors_free(&tensors);
}

// floatX(master), round to nearest even: ties both ways, carries into the exponent, signs.
static void test_copy_master(size_t n, cudaStream_t st) {
    set_case("n=%zu", n);
    Buf<float> master(n);
    Buf<floatX> params(n);
    Vec want(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t hi = 0x3c00u + (uint32_t)rand_int(0x0600);  // |x| in about [2^-7, 2^5)
        uint32_t lo;
        switch (i % 6) {
            case 0: lo = 0x8000u; break;                           // tie: to even
            case 1: lo = 0x7fffu; break;                           // just below a tie
            case 2: lo = 0x8001u; break;                           // just above
            case 3: lo = 0xffffu; hi |= 0x7fu; break;              // rounds up into the exponent
            default: lo = (uint32_t)rand_int(0x10000); break;
        }
        uint32_t bits = (hi << 16) | lo | (i % 4 == 1 ? 0x80000000u : 0u);
        float f;
        memcpy(&f, &bits, 4);
        want[i] = f;
    }
    Vec Mv = upload(master, want);
    AdamWStep nearest = adamw_step_params(0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 0, 1.0f);  // no step: to nearest
    copy_master_to_params(params.p, master.p, n, &nearest, st);
    sync(st, "copy_master_to_params");
    Vec r(n);
    for (size_t i = 0; i < n; i++) r[i] = round_x((float)Mv[i]);
    check("copy_master_to_params params = floatX(master)", params, r, zeros(n));
}

// ============================================================================================
// Batches through llmc/batch_upload.cuh's two pinned slots, as the trainer drives them:
// upload batch 0; per batch j: take it, a "forward" kernel copies its device inputs and
// targets out, batch j+1 is uploaded, a "backward" kernel reads the targets again, release.
// The host overwrites its own arrays right after each upload (the loader reuses them). Every
// batch must arrive intact. Under CUDA_CPU_EXEC=lazy (the CPU layer runs a copy only when
// something waits for it, and a copy from pinned memory reads its source then) each of the
// three waits is also dropped in turn: the tokens must then come out wrong, which shows the
// test would catch a pinned buffer refilled, or a device buffer overwritten or read, too early.
// ============================================================================================
__global__ void copy_ints_kernel(int* dst, const int* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

static int batch_token(int batch, int i, int which) { return batch * 1000 + i * 3 + which; }

// Runs the sequence; returns the number of tokens that arrived wrong.
static long run_batch_uploads(int BT, int batches, int skip_waits, cudaStream_t st) {
    BatchUploader u;
    batch_uploader_init(&u, BT);
    u.test_skip_waits = skip_waits;
    Buf<int> fwd_in((size_t)batches * BT), fwd_tg((size_t)batches * BT), bwd_tg((size_t)batches * BT);
    std::vector<int> in(BT), tg(BT);
    auto upload_one = [&](int j) {
        for (int i = 0; i < BT; i++) in[i] = batch_token(j, i, 0), tg[i] = batch_token(j, i, 1);
        batch_upload(&u, in.data(), tg.data(), BT);
        for (int i = 0; i < BT; i++) in[i] = tg[i] = -7;  // reused at once, as the loader does
    };
    upload_one(0);
    for (int j = 0; j < batches; j++) {
        BatchSlot* b = batch_take(&u, st);
        copy_ints_kernel<<<CEIL_DIV(BT, 64), 64, 0, st>>>(fwd_in.p + (size_t)j * BT, b->d_inputs, BT);
        copy_ints_kernel<<<CEIL_DIV(BT, 64), 64, 0, st>>>(fwd_tg.p + (size_t)j * BT, b->d_targets, BT);
        if (j + 1 < batches) upload_one(j + 1);
        copy_ints_kernel<<<CEIL_DIV(BT, 64), 64, 0, st>>>(bwd_tg.p + (size_t)j * BT, b->d_targets, BT);
        batch_release(b, st);
    }
    sync(st, "batch uploads");
    Vec a = download(fwd_in), t = download(fwd_tg), t2 = download(bwd_tg);
    long wrong = 0;
    for (int j = 0; j < batches; j++) {
        for (int i = 0; i < BT; i++) {
            size_t k = (size_t)j * BT + i;
            wrong += a[k] != batch_token(j, i, 0);
            wrong += t[k] != batch_token(j, i, 1);
            wrong += t2[k] != batch_token(j, i, 1);
        }
    }
    if (skip_waits) cudaCheck(cudaStreamSynchronize(u.stream));  // before the buffers go
    batch_uploader_free(&u);
    return wrong;
}

static void test_batch_upload(int BT, int batches, cudaStream_t st) {
    set_case("BT=%d batches=%d", BT, batches);
    long wrong = run_batch_uploads(BT, batches, 0, st);
    report(wrong == 0, "batch_upload tokens intact (forward and backward reads)", "(%ld of %ld wrong)", wrong,
           3L * batches * BT);
    const char* exec = getenv("CUDA_CPU_EXEC");
    if (!exec || strcmp(exec, "lazy") != 0) {
        tap_skip("only CUDA_CPU_EXEC=lazy on the CPU layer makes the hazards deterministic",
                 "batch_upload without its waits [%s]", where);
        return;
    }
    const char* names[3] = {"host refills a pinned slot before its copy ran", "copy overwrites a device slot still read",
                            "compute reads a slot before its copy ran"};
    for (int bit = 0; bit < 3; bit++) {
        long bad = run_batch_uploads(BT, batches, 1 << bit, st);
        report(bad > 0, "batch_upload hazard shows without its wait", "(%s: %ld tokens wrong)", names[bit], bad);
    }
}

int main(int argc, char** argv) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cuda_select_device(0);
    cuda_libs_init();
    cudaStream_t st;
    cudaCheck(cudaStreamCreate(&st));
    printf("test_kernels_cuda: floatX = %s, device %s\n", PRECISION_NAME, cuda_libs.device_name);
    if (argc > 1 && strcmp(argv[1], "long-sum") == 0) {  // that case alone (test_gpu_mutations.sh's 15)
        test_matmul_long_sum(st);
        goto finish;
    }

    // Shapes: sizes that are not multiples of the warps per block (8), the 32-column
    // tiles, the 256-thread blocks or the 64-row chunks; the last LayerNorm / matmul case
    // has more than 256 * 64 rows, so the column reductions cap their chunk count.
    test_layernorm(2, 37, 72, st);
    test_layernorm(1, 5, 200, st);
    test_layernorm(1, 1, 32, st);
    test_layernorm(3, 45, 768, st);
    test_layernorm(7, 2345, 40, st);
    test_layernorm(2, 9, 64, st, 1);  // rows 16 bytes wide, the pointers off by one element
    test_layernorm_fused_residual(2, 37, 72, st);
    test_layernorm_fused_residual(1, 5, 200, st);
    test_layernorm_fused_residual(3, 7, 36, st);  // C not a multiple of the bf16 pack
    test_layernorm_fused_residual(2, 9, 64, st, 1);

    test_matmul_plans(st);
    test_matmul(37, 72, 200, true, 0, st);
    test_matmul(37, 72, 200, false, 0, st);
    test_matmul(130, 64, 96, true, 8, st);  // views 16 (bf16) or 32 (fp32) bytes aligned, not 128
    test_matmul(5, 33, 17, true, 0, st);
    test_matmul(1, 1, 1, true, 0, st);
    test_matmul(16, 768, 50, false, 0, st);
    test_matmul(16415, 8, 40, true, 0, st);
    test_matmul_long_sum(st);
    // the fused epilogues: OC (forward) and C (DGELU) multiples of 8 or not (the aux rule)
    test_matmul_gelu(37, 72, 200, 0, st);
    test_matmul_gelu(130, 64, 96, 8, st);
    test_matmul_gelu(5, 33, 36, 0, st);
    test_matmul_backward_fused(37, 200, 72, true, 0, st);
    test_matmul_backward_fused(130, 96, 64, true, 8, st);
    test_matmul_backward_fused(5, 36, 33, true, 0, st);
    test_matmul_backward_fused(37, 72, 17, false, 0, st);
    test_matmul_backward_fused(16415, 8, 40, false, 0, st);
    // Pointers the documented heuristic has no algorithm for (a bias or aux pointer, or an
    // operand, less than 16-byte aligned; docs/cuda_cpu.md): each epilogue's separate
    // kernels, and each of the backward's two alone (the other one fused).
    test_matmul(37, 72, 200, true, 1, st);
    test_matmul_gelu(37, 72, 200, 1, st);
    test_matmul_backward_fused(37, 200, 72, true, 0, st, 1, 0);
    test_matmul_backward_fused(37, 200, 72, true, 0, st, 0, 1);

    test_attention(2, 37, 72, 3, st);
    test_attention(1, 128, 64, 4, st);
    test_attention(3, 1, 32, 2, st);
    test_attention(1, 9, 12, 2, st);
    test_attention(2, 65, 48, 1, st);

    test_flash_shapes();
    test_flash_attention(2, 77, 3, 16, st);   // T not a multiple of any tile, several heads
    test_flash_attention(1, 1024, 1, 64, st);  // the d12 head size at T = 1024
    test_flash_attention(1, 100, 2, 128, st);  // the largest head size (shared memory)
    test_flash_attention(3, 1, 2, 48, st);     // T = 1

    test_gelu(1, st);
    test_gelu(255, st);
    test_gelu(257, st);
    test_gelu(4099, st);
    test_gelu(4099, st, 1);
    test_gelu(7, st);

    test_encoder(2, 37, 72, 50, st);
    test_encoder(4, 64, 300, 3, st);
    test_encoder(1, 1, 8, 5, st);
    test_encoder(2, 3, 13, 4, st);  // C not a multiple of the pack
    test_encoder(3, 400, 40, 9, st, true);  // one token in 9 of 10 positions: 17 segments of it

    test_crossentropy(37, 200, 256, st);
    test_crossentropy(5, 3001, 3072, st);
    test_crossentropy(6, 65, 72, st);
    test_crossentropy(1, 1, 8, st);
    test_crossentropy(3, 37, 43, st);     // Vp not a multiple of the pack
    test_crossentropy(4, 2051, 2056, st, 1);  // unaligned logits; V > 2 * 1024

    test_residual(1, st);
    test_residual(257, st);
    test_residual(4099, st);
    test_residual(4099, st, 1);
    test_residual(13, st, 3);

    test_global_norm(0, st);
    test_global_norm(1, st);
    test_global_norm(1000, st);
    test_global_norm((size_t)GLOBAL_NORM_BLOCKS * GLOBAL_NORM_THREADS + 37, st);  // beyond one grid-stride round

    test_adamw({1}, {1}, 1.0f, st);
    test_adamw({257}, {1}, 1.0f, st);
    test_adamw({1000}, {0}, 0.37f, st);
    // several tensors, an empty one, neighbours that merge, runs across the blocks' chunks
    test_adamw({300, 0, 1, 2053, 77, 2500, 9}, {1, 0, 0, 1, 1, 0, 1}, 0.5f, st);
    test_copy_master(1, st);
    test_copy_master(1000, st);
    test_batch_upload(37, 6, st);

finish:
    cuda_libs_free();  // first: the cuBLAS handle is bound to the stream
    test_plans_freed();
    cudaCheck(cudaStreamDestroy(st));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("# %.1f s\n", (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    return done_testing();
}
