/*
 * The tensor-core model of GPU numerics (cuda_cpu/tensorcore.cpp; a CUDA_CPU_NUMERICS=gpu
 * build) against values worked out by hand and against a reference of the rule written
 * here on its own terms (frexp, trunc and nextafter on doubles, where the layer shifts
 * integers). The rule (Fasi et al., PeerJ Comput. Sci. 7:e330, 2021; Xie et al., MMA-Sim,
 * arXiv:2511.10909, 2025): per group of G products and the accumulator c, a product's
 * exponent is ea + eb, emax the largest of the nonzero terms', every term truncated toward
 * zero to a multiple of 2^(emax - F), the exact sum rounded toward zero to fp32 (+0 if 0;
 * NaN as 0x7fffffff). Run as
 *   test_tensorcore h100    defaults: G 16, F = 23 + 2 (the H100's)
 *   test_tensorcore a100    under CUDA_CPU_TC_GROUP=8 CUDA_CPU_TC_EXTRA_BITS=1 (the A100's)
 *   test_tensorcore exact   under CUDA_CPU_TC_GROUP=0: the layer before (k order, fp32 sums;
 *                           cuBLAS's BF16 matmul one sgemm, with or without a workspace)
 *   test_tensorcore peer IN OUT   the model's dot products of IN's cases, for the peer
 *                           (MMA-Sim: dev/test/tensorcore_peer.py)
 * Prints TAP (tests/tap.h).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda_cpu/tests/layer_test.h"

using namespace nvcuda;

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static __nv_bfloat16 bf(float f) {  // f must be a bf16 value
    uint16_t h = (uint16_t)(bits(f) >> 16);
    __nv_bfloat16 r;
    memcpy((void*)&r, &h, 2);
    return r;
}

// ---- the reference ---------------------------------------------------------------------------
static int G = 16, F = 25;
static bool exact_mode = false;

// x = sig 2^exp with 1 <= |sig| < 2, or the format's smallest exponent and |sig| < 1.
static double split(double x, int min_exp, int* exp) {
    int e;
    double f = frexp(x, &e);
    *exp = e - 1;
    if (*exp < min_exp) *exp = min_exp;
    return ldexp(x, -*exp);
}
static float ref_group(float c, const float* a, const float* b, int n) {
    double s = c;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    if (isnan(s)) {
        uint32_t u = 0x7fffffffu;
        float r;
        memcpy(&r, &u, 4);
        return r;
    }
    if (isinf(s)) return (float)s;
    std::vector<double> sig;
    std::vector<int> ex;
    int e;
    if (c != 0) sig.push_back(split(c, -126, &e)), ex.push_back(e);
    for (int i = 0; i < n; i++) {
        if (a[i] == 0 || b[i] == 0) continue;
        int e1, e2;
        double s1 = split(a[i], -126, &e1), s2 = split(b[i], -126, &e2);
        sig.push_back(s1 * s2), ex.push_back(e1 + e2);
    }
    if (sig.empty()) return 0.0f;
    int emax = ex[0];
    for (int x : ex) emax = x > emax ? x : emax;
    double sum = 0;
    for (size_t i = 0; i < sig.size(); i++) sum += trunc(ldexp(sig[i], F + ex[i] - emax));
    if (sum == 0) return 0.0f;
    double v = ldexp(sum, emax - F);
    float r = (float)v;
    if (fabs((double)r) > fabs(v)) r = nextafterf(r, 0.0f);  // toward zero
    return r;
}
static float ref_dot(float c, const float* a, const float* b, int k) {
    if (exact_mode) {
        for (int i = 0; i < k; i++) c = c + a[i] * b[i];
        return c;
    }
    for (int g = 0; g < k; g += G) c = ref_group(c, a + g, b + g, k - g < G ? k - g : G);
    return c;
}

// ---- one WMMA product: D = A B + C (row-major 16 x 16 tiles) ------------------------------------
__global__ void mma16(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(fc, c, 16, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}

struct Tiles {
    float a[256], b[256], c[256], d[256];
};
static void run_mma(Tiles* t) {
    __nv_bfloat16 ha[256], hb[256];
    for (int i = 0; i < 256; i++) ha[i] = bf(t->a[i]), hb[i] = bf(t->b[i]);
    __nv_bfloat16 *da, *db;
    float *dc, *dd;
    cudaMalloc(&da, sizeof(ha)), cudaMalloc(&db, sizeof(hb)), cudaMalloc(&dc, 1024), cudaMalloc(&dd, 1024);
    cudaMemcpy(da, ha, sizeof(ha), cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, sizeof(hb), cudaMemcpyHostToDevice);
    cudaMemcpy(dc, t->c, 1024, cudaMemcpyHostToDevice);
    mma16<<<1, 32>>>(dd, da, db, dc);
    cudaMemcpy(t->d, dd, 1024, cudaMemcpyDeviceToHost);
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
}

// ---- the hand-worked cases: case r is row r of A, column r of B, and D[r][r] -------------------
struct Case {
    const char* what;
    float h100, a100, exact;  // D[r][r] under each setting
};
static void hand_cases(const char* mode) {
    Tiles t;
    memset(&t, 0, sizeof(t));
    auto A = [&](int r, int k) -> float& { return t.a[r * 16 + k]; };
    auto B = [&](int r, int k) -> float& { return t.b[k * 16 + r]; };  // column r
    const float one = 1.0f, u23 = 0x1p-23f;
    // 0: c = 1, one product 3 2^-25: the grid is 2^-25 (emax 0), 1 + 3 2^-25 rounds toward zero to
    //    1; to nearest it would be 1 + 2^-23 (0.75 ulp). A100 (grid 2^-24): 1.5 -> 1, then 1.
    t.c[0 * 17] = one, A(0, 0) = 0x1.8p-12f, B(0, 0) = 0x1p-12f;
    // 1: c = 1, eight products 1.5 2^-26: each 0.75 of the 2^-25 grid, truncated to 0: 1. The
    //    exact sum 1 + 3 2^-24 would round toward zero to 1 + 2^-23: the loss is the alignment's.
    t.c[1 * 17] = one;
    for (int k = 0; k < 8; k++) A(1, k) = 0x1.8p-13f, B(1, k) = 0x1p-13f;
    // 2: c = 1, products 2^-25 at k = 0, 1, 2, 8, 9, 10: one group of 16 keeps all six, 1 + 6 2^-25
    //    -> 1 + 2^-23; groups of 8 (A100) each end at 1 + 3 2^-25 -> 1 (grid 2^-24 drops them
    //    anyway); fp32 in k order: each 1 + 2^-25 rounds (a tie, to even) to 1.
    t.c[2 * 17] = one;
    for (int k : {0, 1, 2, 8, 9, 10}) A(2, k) = 0x1p-12f, B(2, k) = 0x1p-13f;
    // 3: case 0 negated: toward zero is up: -1; to nearest -(1 + 2^-23).
    t.c[3 * 17] = -one, A(3, 0) = -0x1.8p-12f, B(3, 0) = 0x1p-12f;
    // 4: c = 1 + 2^-23 and the product -8: emax 3, grid 2^-22: c loses its 2^-23 to the
    //    alignment, -8 + 1 = -7 exactly (rounding the exact -7 + 2^-23 toward zero: -7 + 2^-21).
    t.c[4 * 17] = one + u23, A(4, 0) = -8.0f, B(4, 0) = 1.0f;
    // 5: 1.5 x 1.5 (exponent ea + eb = 0, though 2.25 >= 2) and 15 products 1.5 2^-25: grid 2^-25,
    //    each small one 1.5 -> 1: 2.25 + 15 2^-25, toward zero on the 2^-22 grid: 2.25 + 2^-22
    //    (aligned to 2.25's own exponent 1 they would vanish). A100: 2.25. k order: 2.25.
    A(5, 0) = 1.5f, B(5, 0) = 1.5f;
    for (int k = 1; k < 16; k++) A(5, k) = 0x1.8p-12f, B(5, k) = 0x1p-13f;
    // 6: c = -0, 1 x -1 + 1 x 1: a zero sum is +0 (IEEE agrees here).
    t.c[6 * 17] = -0.0f, A(6, 0) = 1.0f, B(6, 0) = -1.0f, A(6, 1) = 1.0f, B(6, 1) = 1.0f;
    run_mma(&t);
    const Case cases[7] = {
        {"c = 1 plus 3 2^-25: rounded toward zero (to nearest: 1 + 2^-23)", 1.0f, 1.0f, one + u23},
        {"c = 1 plus eight 1.5 2^-26: each truncated at the alignment", 1.0f, 1.0f, 1.0f},
        {"c = 1 plus six 2^-25 in two halves: one group keeps them, groups of 8 do not", one + u23, 1.0f, 1.0f},
        {"c = -1 plus -3 2^-25: toward zero (to nearest: -(1 + 2^-23))", -1.0f, -1.0f, -(one + u23)},
        {"c = 1 + 2^-23 plus -8: the accumulator's last bit lost to the alignment", -7.0f, -7.0f, -7.0f},
        {"1.5 x 1.5 aligned at ea + eb = 0, with fifteen 1.5 2^-25", 2.25f + 0x1p-22f, 2.25f, 2.25f},
        {"-0 + (-1) + 1: +0", 0.0f, 0.0f, 0.0f},
    };
    for (int r = 0; r < 7; r++) {
        float want = strcmp(mode, "h100") == 0   ? cases[r].h100
                     : strcmp(mode, "a100") == 0 ? cases[r].a100
                                                 : cases[r].exact;
        float col[16];
        for (int k = 0; k < 16; k++) col[k] = t.b[k * 16 + r];
        float rd = ref_dot(t.c[r * 17], &t.a[r * 16], col, 16);
        tap_ok(bits(t.d[r * 17]) == bits(want) && bits(rd) == bits(want),
               "%s: mma_sync %a, the reference %a, by hand %a", cases[r].what, t.d[r * 17], rd, want);
    }
    // 7: Inf x 0 in a group: NaN, 0x7fffffff in the model (MMA-Sim's); IEEE's default NaN in k order.
    memset(&t, 0, sizeof(t));
    t.a[0] = INFINITY, t.b[0] = 0.0f;
    run_mma(&t);
    tap_ok(exact_mode ? isnan(t.d[0]) : bits(t.d[0]) == 0x7fffffffu, "Inf x 0: NaN (bits %08x)", bits(t.d[0]));
}

// ---- random tiles against the reference, bit for bit ---------------------------------------------
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next32() {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float rand_bf16(int lo, int hi) {  // +-(1 + j/128) 2^e, e in [lo, hi]; 1 in 16 zero
    if (next32() % 16 == 0) return 0.0f;
    float v = ldexpf(1.0f + (float)(next32() % 128) / 128.0f, lo + (int)(next32() % (uint32_t)(hi - lo + 1)));
    return next32() % 2 ? -v : v;
}
static void random_tiles() {
    long wrong = 0, differ_from_k_order = 0;
    for (int rep = 0; rep < 20; rep++) {
        Tiles t;
        for (int i = 0; i < 256; i++) {
            t.a[i] = rand_bf16(-12, 3), t.b[i] = rand_bf16(-12, 3);
            t.c[i] = ldexpf((float)(next32() % (1u << 24)) / (1u << 23) - 1.0f, (int)(next32() % 12) - 6);
        }
        run_mma(&t);
        for (int r = 0; r < 16; r++)
            for (int col = 0; col < 16; col++) {
                float bcol[16], k_order = t.c[r * 16 + col];
                for (int k = 0; k < 16; k++) bcol[k] = t.b[k * 16 + col], k_order += t.a[r * 16 + k] * bcol[k];
                float want = ref_dot(t.c[r * 16 + col], &t.a[r * 16], bcol, 16);
                wrong += bits(t.d[r * 16 + col]) != bits(want);
                differ_from_k_order += bits(t.d[r * 16 + col]) != bits(k_order);
            }
    }
    tap_ok(wrong == 0 && (exact_mode ? differ_from_k_order == 0 : differ_from_k_order > 0),
           "20 random tiles (5120 elements): mma_sync equals the reference bit for bit (%ld differ); %ld differ "
           "from fp32 sums in k order",
           wrong, differ_from_k_order);
}

// ---- cuBLAS's BF16 matmul: the same chain, split along k where the workspace allows --------------
static void gemm_splits() {
    cublasHandle_t h;
    cublasCreate(&h);
    const int m = 20, n = 3, shapes[4] = {200, 333, 64, 1000};  // m: two blocks of rows, k: chunks of 256
    int saw_split = 0;
    void* ws;
    cudaMalloc(&ws, 1 << 20);
    for (int si = 0; si < 4; si++) {
        int k = shapes[si];
        std::vector<float> a((size_t)m * k), b((size_t)k * n), out((size_t)m * n);
        std::vector<__nv_bfloat16> ha(a.size()), hb(b.size());
        for (size_t i = 0; i < a.size(); i++) a[i] = rand_bf16(-4, 2), ha[i] = bf(a[i]);
        for (size_t i = 0; i < b.size(); i++) b[i] = rand_bf16(-4, 2), hb[i] = bf(b[i]);
        if (k == 333) a[0] = INFINITY, ha[0] = bf(a[0]);  // row 0: Inf (or NaN) in the IEEE way
        __nv_bfloat16 *da, *db;
        float* dc;
        cudaMalloc(&da, ha.size() * 2), cudaMalloc(&db, hb.size() * 2), cudaMalloc(&dc, out.size() * 4);
        cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice);
        float alpha = 1.0f, beta = 0.0f;
        // A m x k col-major (lda m), B k x n col-major (ldb k): row i of A is a[i + kk m].
        std::vector<float> row((size_t)k), col((size_t)k);
        auto matches = [&](int splits) {  // every element equals the reference with that split
            int groups = (k + G - 1) / G;
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    for (int kk = 0; kk < k; kk++) row[kk] = a[i + (size_t)kk * m], col[kk] = b[kk + (size_t)j * k];
                    float sum = 0;
                    for (int s = 0; s < splits; s++) {
                        int k0 = groups * s / splits * G, k1 = groups * (s + 1) / splits * G;
                        k1 = k1 > k ? k : k1;
                        float part = ref_dot(0.0f, &row[k0], &col[k0], k1 - k0);
                        sum = s == 0 ? part : sum + part;
                    }
                    if (bits(sum) != bits(out[i + (size_t)j * m])) return false;
                }
            return true;
        };
        for (int with_ws = 0; with_ws < 2; with_ws++) {
            cublasSetWorkspace(h, with_ws ? ws : nullptr, with_ws ? 1 << 20 : 0);
            cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, CUDA_R_16BF, m, 0, db,
                                       CUDA_R_16BF, k, 0, &beta, dc, CUDA_R_32F, m, 0, 1, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT);
            cudaMemcpy(out.data(), dc, out.size() * 4, cudaMemcpyDeviceToHost);
            if (exact_mode) {  // OpenBLAS's sgemm, as in an IEEE build: within gam(k) of the exact sums
                double worst = 0;
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < n; j++) {
                        double e = 0, mass = 0;
                        for (int kk = 0; kk < k; kk++)
                            e += (double)a[i + (size_t)kk * m] * b[kk + (size_t)j * k],
                                mass += fabs((double)a[i + (size_t)kk * m] * b[kk + (size_t)j * k]);
                        worst = fmax(worst, fabs(out[i + (size_t)j * m] - e) / (mass * k * 0x1p-24));
                    }
                tap_ok(worst <= 1, "k = %d, %s workspace: fp32 sums (error %.3g of gam(k) times the mass)", k,
                       with_ws ? "a" : "no", worst);
                continue;
            }
            int found = 0;
            for (int s = 1; s <= 8 && !found; s++)
                if (matches(s)) found = s;
            if (!with_ws) {
                tap_ok(found == 1, "cublasGemmStridedBatchedEx bf16 k = %d, no workspace: the unsplit chain (%d)", k,
                       found);
            } else {
                tap_ok(found > 0, "k = %d with a 1 MiB workspace: %d slices, each a chain, summed in fp32", k, found);
                saw_split |= found > 1;
            }
        }
        cudaFree(da), cudaFree(db), cudaFree(dc);
    }
    if (!exact_mode)
        tap_ok(saw_split, "some shape was split (the hash of the shape and CUDA_CPU_SEED chose more than one slice)");
    cudaFree(ws);
    cublasDestroy(h);
}

// `test_tensorcore peer IN OUT`: tc_dot over the cases of IN, for a peer to compare with
// (dev/test/tensorcore_peer.py). IN: int32 n, k, min_exp, then n records of float c, a[k],
// b[k]; OUT: the n results, float. Under the environment's CUDA_CPU_TC_* settings.
static int peer_cases(const char* in_path, const char* out_path) {
    FILE* in = fopen(in_path, "rb");
    FILE* out = fopen(out_path, "wb");
    int32_t head[3];
    if (!in || !out || fread(head, 4, 3, in) != 3 || head[0] < 0 || head[1] < 1) return 2;
    std::vector<float> rec(1 + 2 * (size_t)head[1]);
    for (int32_t i = 0; i < head[0]; i++) {
        if (fread(rec.data(), 4, rec.size(), in) != rec.size()) return 2;
        float d = cudacpu::tc_dot(rec[0], &rec[1], &rec[1 + head[1]], head[1], head[2]);
        if (fwrite(&d, 4, 1, out) != 1) return 2;
    }
    return fclose(out) == 0 && fclose(in) == 0 ? 0 : 2;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "h100";
    if (strcmp(mode, "peer") == 0 && argc == 4) return peer_cases(argv[2], argv[3]);
    if (strcmp(mode, "a100") == 0) G = 8, F = 24;
    exact_mode = strcmp(mode, "exact") == 0;
    if (strcmp(mode, "bad-group") == 0) {  // a setting out of range ends the run at its first use
        run_mma(new Tiles());
        return 0;
    }
    hand_cases(mode);
    random_tiles();
    if (strcmp(mode, "a100") != 0) gemm_splits();
    if (strcmp(mode, "h100") == 0) {
        char err[512];
        int rc = run_case(argv[0], "bad-group", "CUDA_CPU_TC_GROUP=65", err, sizeof(err));
        tap_ok(rc == 1 && strstr(err, "error: cuda_cpu: CUDA_CPU_TC_GROUP=65: use 1 to 64"),
               "CUDA_CPU_TC_GROUP=65 refused (exit %d)", rc);
    }
    return done_testing();
}
