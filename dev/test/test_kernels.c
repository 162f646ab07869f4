/*
 * Unit tests of the fp32 CPU kernels in llmc/.
 *
 * For every kernel:
 *  - forward against a naive reference written here, in double;
 *  - backward against central finite differences of L = sum(out * R) (R fixed, random),
 *    where L is evaluated by the double reference forward, so the differences are exact
 *    to ~1e-8 and the check measures only the kernel's own fp32 error;
 *  - accumulation: gradients start from random values, the increment of one call must
 *    match the finite differences and a second call must add the same increment again;
 *    scratch outputs are pre-filled with NaN to prove they are overwritten;
 *  - encoder/matmul/layernorm weight gradients are bit-identical with 1 and 2 threads.
 * Prints TAP (dev/test/check.h), a line per kernel.
 * Build: gcc -std=c11 -D_DEFAULT_SOURCE -O3 -march=native -fopenmp -I. -I<openblas include>
 *        dev/test/test_kernels.c -o test_kernels -lopenblas -lm
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "dev/test/check.h"
#include "run/files.h"
#include "run/blas_cores.h"
#include "llmc/encoder.h"
#include "llmc/layernorm.h"
#include "llmc/matmul.h"
#include "llmc/attention.h"
#include "llmc/gelu.h"
#include "llmc/residual.h"
#include "llmc/classifier.h"

#define FWD_TOL 1e-5
#define GRAD_TOL 1e-3
#define FD_H 1e-4

// ---------------------------------------------------------------------------------------
// small helpers

static unsigned long long rng_state = 0x2545F4914F6CDD1DULL;
static float urand(void) {  // uniform in [-1, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    unsigned long long r = rng_state * 0x2545F4914F6CDD1DULL;
    return (float)((r >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}
static float* frand(size_t n, float scale) {
    float* p = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = urand() * scale;
    return p;
}
static float* fcopy(const float* a, size_t n) {
    float* p = (float*)mallocCheck(n * sizeof(float));
    memcpy(p, a, n * sizeof(float));
    return p;
}
static double* todouble(const float* a, size_t n) {
    double* p = (double*)mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) p[i] = a[i];
    return p;
}
static void fill_nan(float* a, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = NAN;
}

// max |got - want| / max |want|  (a relative error on the scale of the whole tensor)
static double rel_err(const float* got, const double* want, size_t n) {
    double maxd = 0.0, maxw = 0.0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d != d) nan = 1;  // a NaN (e.g. from unwritten scratch) is a failure
        else if (d > maxd) maxd = d;
        if (fabs(want[i]) > maxw) maxw = fabs(want[i]);
    }
    return nan ? NAN : maxd / (maxw > 1e-30 ? maxw : 1e-30);
}

typedef struct {
    const char* kernel;
    int ok;
    double worst;
} Check;

static void check(Check* c, const char* what, double err, double tol) {
    if (!(err <= tol)) {
        printf("  %s: %s rel err %.3e > %.1e\n", c->kernel, what, err, tol);
        c->ok = 0;
    }
    if (err > c->worst || err != err) c->worst = err;
}
static void check_true(Check* c, const char* what, int cond) {
    if (!cond) {
        printf("  %s: %s failed\n", c->kernel, what);
        c->ok = 0;
    }
}
static void report(Check* c) {
    tap_ok(c->ok, "%-12s (worst rel err %.2e)", c->kernel, c->worst);
}

// Finite differences of loss(ctx) with respect to every element of x (a double array the
// loss reads through ctx).
typedef double (*LossFn)(void* ctx);
static double* fd_grad(double* x, size_t n, LossFn loss, void* ctx) {
    double* g = (double*)mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + FD_H;
        double lp = loss(ctx);
        x[i] = save - FD_H;
        double lm = loss(ctx);
        x[i] = save;
        g[i] = (lp - lm) / (2.0 * FD_H);
    }
    return g;
}

// Checks one accumulated gradient: g0 = value before the first call, g1 after the first,
// g2 after the second. (g1 - g0) must match fd, and (g2 - g1) must equal (g1 - g0).
static void check_accum_grad(Check* c, const char* name, const float* g0, const float* g1,
                             const float* g2, const double* fd, size_t n) {
    float* inc1 = (float*)mallocCheck(n * sizeof(float));
    double* inc1d = (double*)mallocCheck(n * sizeof(double));
    float* inc2 = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        inc1[i] = g1[i] - g0[i];
        inc1d[i] = (double)g1[i] - (double)g0[i];
        inc2[i] = g2[i] - g1[i];
    }
    char what[128];
    snprintf(what, sizeof what, "%s vs finite differences", name);
    check(c, what, rel_err(inc1, fd, n), GRAD_TOL);
    snprintf(what, sizeof what, "%s second call adds the same increment", name);
    check(c, what, rel_err(inc2, inc1d, n), 1e-5);
    free(inc1); free(inc1d); free(inc2);
}

// check_accum_grad against the finite differences of loss with respect to x (n elements,
// read through ctx); returns those differences (the caller frees them).
static double* check_accum_grad_fd(Check* c, const char* name, const float* g0, const float* g1, const float* g2,
                                   double* x, size_t n, LossFn loss, void* ctx) {
    double* fd = fd_grad(x, n, loss, ctx);
    check_accum_grad(c, name, g0, g1, g2, fd, n);
    return fd;
}

// The scalar the finite differences differentiate: sum_i out[i] R[i] over the n outputs
// that a double-precision reference, ref(out, ctx), computes.
typedef void (*RefFn)(double* out, const void* ctx);
static double ref_loss(RefFn ref, const void* ctx, const double* R, size_t n) {
    double* out = (double*)mallocCheck(n * sizeof(double));
    ref(out, ctx);
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += out[i] * R[i];
    free(out);
    return s;
}

// ---------------------------------------------------------------------------------------
// encoder

typedef struct { int B, T, C; const int* inp; double *wte, *wpe, *R; } EncCtx;
static void enc_ref(double* out, const EncCtx* e) {
    for (int bt = 0; bt < e->B * e->T; bt++)
        for (int c = 0; c < e->C; c++)
            out[(size_t)bt * e->C + c] = e->wte[(size_t)e->inp[bt] * e->C + c] + e->wpe[(size_t)(bt % e->T) * e->C + c];
}
static void enc_out(double* out, const void* p) { enc_ref(out, (const EncCtx*)p); }
static double enc_loss(void* p) {
    const EncCtx* e = (const EncCtx*)p;
    return ref_loss(enc_out, e, e->R, (size_t)e->B * e->T * e->C);
}

static void test_encoder(void) {
    Check c = {"encoder", 1, 0.0};
    int B = 2, T = 5, C = 8, V = 7;
    size_t nout = (size_t)B * T * C;
    int inp[10] = {3, 1, 3, 0, 6, 2, 3, 3, 5, 1};  // repeated ids exercise the scatter
    float* wte = frand((size_t)V * C, 1.0f);
    float* wpe = frand((size_t)T * C, 1.0f);
    float* R = frand(nout, 1.0f);
    float* out = frand(nout, 1.0f);
    EncCtx e = {B, T, C, inp, todouble(wte, (size_t)V * C), todouble(wpe, (size_t)T * C), todouble(R, nout)};
    double* ref = (double*)mallocCheck(nout * sizeof(double));
    encoder_forward(out, inp, wte, wpe, B, T, C);
    enc_ref(ref, &e);
    check(&c, "forward", rel_err(out, ref, nout), FWD_TOL);

    float* g0w = frand((size_t)V * C, 1.0f);
    float* g0p = frand((size_t)T * C, 1.0f);
    float* g1w = fcopy(g0w, (size_t)V * C);
    float* g1p = fcopy(g0p, (size_t)T * C);
    encoder_backward(g1w, g1p, R, inp, B, T, C);
    float* g2w = fcopy(g1w, (size_t)V * C);
    float* g2p = fcopy(g1p, (size_t)T * C);
    encoder_backward(g2w, g2p, R, inp, B, T, C);
    double* fdw = check_accum_grad_fd(&c, "dwte", g0w, g1w, g2w, e.wte, (size_t)V * C, enc_loss, &e);
    double* fdp = check_accum_grad_fd(&c, "dwpe", g0p, g1p, g2p, e.wpe, (size_t)T * C, enc_loss, &e);

    // thread-count independence, on a size where every thread gets channels
    {
        int B2 = 4, T2 = 64, C2 = 96, V2 = 50;
        int* inp2 = (int*)mallocCheck((size_t)B2 * T2 * sizeof(int));
        for (int i = 0; i < B2 * T2; i++) inp2[i] = (int)((urand() + 1.0f) * 0.5f * V2) % V2;
        float* d = frand((size_t)B2 * T2 * C2, 1.0f);
        float* w1 = frand((size_t)V2 * C2, 1.0f);
        float* p1 = frand((size_t)T2 * C2, 1.0f);
        float* w2 = fcopy(w1, (size_t)V2 * C2);
        float* p2 = fcopy(p1, (size_t)T2 * C2);
        omp_set_num_threads(1);
        encoder_backward(w1, p1, d, inp2, B2, T2, C2);
        omp_set_num_threads(2);
        encoder_backward(w2, p2, d, inp2, B2, T2, C2);
        omp_set_num_threads(1);
        check_true(&c, "dwte/dwpe identical with 1 and 2 threads",
                   memcmp(w1, w2, (size_t)V2 * C2 * sizeof(float)) == 0 &&
                   memcmp(p1, p2, (size_t)T2 * C2 * sizeof(float)) == 0);
        free(inp2); free(d); free(w1); free(p1); free(w2); free(p2);
    }
    report(&c);
    free(wte); free(wpe); free(R); free(out); free(ref); free(e.wte); free(e.wpe); free(e.R);
    free(g0w); free(g0p); free(g1w); free(g1p); free(g2w); free(g2p); free(fdw); free(fdp);
}

// ---------------------------------------------------------------------------------------
// layernorm

typedef struct { int B, T, C; double *inp, *w, *b, *R; } LnCtx;
static void ln_ref(double* out, double* mean, double* rstd, const LnCtx* l) {
    int C = l->C;
    for (int bt = 0; bt < l->B * l->T; bt++) {
        const double* x = l->inp + (size_t)bt * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        double r = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++) out[(size_t)bt * C + c] = (x[c] - m) * r * l->w[c] + l->b[c];
        if (mean) mean[bt] = m;
        if (rstd) rstd[bt] = r;
    }
}
static void ln_out(double* out, const void* p) { ln_ref(out, NULL, NULL, (const LnCtx*)p); }
static double ln_loss(void* p) {
    const LnCtx* l = (const LnCtx*)p;
    return ref_loss(ln_out, l, l->R, (size_t)l->B * l->T * l->C);
}

static void test_layernorm(void) {
    Check c = {"layernorm", 1, 0.0};
    int B = 2, T = 5, C = 8, BT = B * T;
    size_t n = (size_t)BT * C;
    float* inp = frand(n, 2.0f);
    for (size_t i = 0; i < n; i++) inp[i] += 0.5f;  // a non-zero mean
    float* w = frand(C, 1.0f);
    float* b = frand(C, 1.0f);
    float* R = frand(n, 1.0f);
    float* out = frand(n, 1.0f);
    float* mean = frand(BT, 1.0f);
    float* rstd = frand(BT, 1.0f);
    LnCtx l = {B, T, C, todouble(inp, n), todouble(w, C), todouble(b, C), todouble(R, n)};
    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* rmean = (double*)mallocCheck(BT * sizeof(double));
    double* rrstd = (double*)mallocCheck(BT * sizeof(double));
    layernorm_forward(out, mean, rstd, inp, w, b, B, T, C);
    ln_ref(ref, rmean, rrstd, &l);
    check(&c, "forward out", rel_err(out, ref, n), FWD_TOL);
    check(&c, "forward mean", rel_err(mean, rmean, BT), FWD_TOL);
    check(&c, "forward rstd", rel_err(rstd, rrstd, BT), FWD_TOL);

    float* g0i = frand(n, 1.0f);
    float* g0w = frand(C, 1.0f);
    float* g0b = frand(C, 1.0f);
    float *g1i = fcopy(g0i, n), *g1w = fcopy(g0w, C), *g1b = fcopy(g0b, C);
    layernorm_backward(g1i, g1w, g1b, R, inp, w, mean, rstd, B, T, C);
    float *g2i = fcopy(g1i, n), *g2w = fcopy(g1w, C), *g2b = fcopy(g1b, C);
    layernorm_backward(g2i, g2w, g2b, R, inp, w, mean, rstd, B, T, C);
    double* fdi = check_accum_grad_fd(&c, "dinp", g0i, g1i, g2i, l.inp, n, ln_loss, &l);
    double* fdw = check_accum_grad_fd(&c, "dweight", g0w, g1w, g2w, l.w, C, ln_loss, &l);
    double* fdb = check_accum_grad_fd(&c, "dbias", g0b, g1b, g2b, l.b, C, ln_loss, &l);

    {
        int B2 = 4, T2 = 64, C2 = 200;  // several channel blocks, one partial
        size_t n2 = (size_t)B2 * T2 * C2;
        float *x = frand(n2, 1.0f), *d = frand(n2, 1.0f), *w2 = frand(C2, 1.0f), *b2 = frand(C2, 1.0f);
        float *o = frand(n2, 1.0f), *m = frand(B2 * T2, 1.0f), *r = frand(B2 * T2, 1.0f);
        layernorm_forward(o, m, r, x, w2, b2, B2, T2, C2);
        float *di1 = frand(n2, 1.0f), *dw1 = frand(C2, 1.0f), *db1 = frand(C2, 1.0f);
        float *di2 = fcopy(di1, n2), *dw2 = fcopy(dw1, C2), *db2 = fcopy(db1, C2);
        omp_set_num_threads(1);
        layernorm_backward(di1, dw1, db1, d, x, w2, m, r, B2, T2, C2);
        omp_set_num_threads(2);
        layernorm_backward(di2, dw2, db2, d, x, w2, m, r, B2, T2, C2);
        omp_set_num_threads(1);
        check_true(&c, "dinp/dweight/dbias identical with 1 and 2 threads",
                   memcmp(di1, di2, n2 * sizeof(float)) == 0 && memcmp(dw1, dw2, C2 * sizeof(float)) == 0 &&
                   memcmp(db1, db2, C2 * sizeof(float)) == 0);
        free(x); free(d); free(w2); free(b2); free(o); free(m); free(r);
        free(di1); free(dw1); free(db1); free(di2); free(dw2); free(db2);
    }
    report(&c);
    free(inp); free(w); free(b); free(R); free(out); free(mean); free(rstd);
    free(l.inp); free(l.w); free(l.b); free(l.R); free(ref); free(rmean); free(rrstd);
    free(g0i); free(g0w); free(g0b); free(g1i); free(g1w); free(g1b); free(g2i); free(g2w); free(g2b);
    free(fdi); free(fdw); free(fdb);
}

// ---------------------------------------------------------------------------------------
// matmul

typedef struct { int BT, C, OC; double *inp, *w, *b, *R; } MmCtx;
static void mm_ref(double* out, const MmCtx* m) {
    for (int i = 0; i < m->BT; i++)
        for (int o = 0; o < m->OC; o++) {
            double s = m->b ? m->b[o] : 0.0;
            for (int c = 0; c < m->C; c++) s += m->inp[(size_t)i * m->C + c] * m->w[(size_t)o * m->C + c];
            out[(size_t)i * m->OC + o] = s;
        }
}
static void mm_out(double* out, const void* p) { mm_ref(out, (const MmCtx*)p); }
static double mm_loss(void* p) {
    const MmCtx* m = (const MmCtx*)p;
    return ref_loss(mm_out, m, m->R, (size_t)m->BT * m->OC);
}

static void test_matmul(void) {
    Check c = {"matmul", 1, 0.0};
    int BT = 10, C = 8, OC = 12;
    size_t ni = (size_t)BT * C, nw = (size_t)OC * C, no = (size_t)BT * OC;
    float *inp = frand(ni, 1.0f), *w = frand(nw, 1.0f), *b = frand(OC, 1.0f), *R = frand(no, 1.0f);
    float* out = frand(no, 1.0f);
    MmCtx m = {BT, C, OC, todouble(inp, ni), todouble(w, nw), todouble(b, OC), todouble(R, no)};
    double* ref = (double*)mallocCheck(no * sizeof(double));
    matmul_forward(out, inp, w, b, BT, C, OC);
    mm_ref(ref, &m);
    check(&c, "forward", rel_err(out, ref, no), FWD_TOL);

    float *g0i = frand(ni, 1.0f), *g0w = frand(nw, 1.0f), *g0b = frand(OC, 1.0f);
    float *g1i = fcopy(g0i, ni), *g1w = fcopy(g0w, nw), *g1b = fcopy(g0b, OC);
    matmul_backward(g1i, g1w, g1b, R, inp, w, BT, C, OC);
    float *g2i = fcopy(g1i, ni), *g2w = fcopy(g1w, nw), *g2b = fcopy(g1b, OC);
    matmul_backward(g2i, g2w, g2b, R, inp, w, BT, C, OC);
    double* fdi = check_accum_grad_fd(&c, "dinp", g0i, g1i, g2i, m.inp, ni, mm_loss, &m);
    double* fdw = check_accum_grad_fd(&c, "dweight", g0w, g1w, g2w, m.w, nw, mm_loss, &m);
    double* fdb = check_accum_grad_fd(&c, "dbias", g0b, g1b, g2b, m.b, OC, mm_loss, &m);

    // no bias, no dinp (the first layer's input needs no gradient)
    free(m.b);
    m.b = NULL;
    matmul_forward(out, inp, w, NULL, BT, C, OC);
    mm_ref(ref, &m);
    check(&c, "forward without bias", rel_err(out, ref, no), FWD_TOL);
    float* g3w = fcopy(g0w, nw);
    matmul_backward(NULL, g3w, NULL, R, inp, w, BT, C, OC);
    check_accum_grad(&c, "dweight (dinp, dbias NULL)", g0w, g3w, g2w, fdw, nw);  // g2w - g3w: one more increment on g1w
    free(g3w);

    {   // OpenMP thread-count independence: with OpenBLAS at one thread each OpenMP thread
        // computes a tile of the product (1 x 2, 1 x 3 and 2 x 2 grids here), which must
        // not change a bit. OpenBLAS's own threads (0.3.21, measured) do change the last
        // bits, so bit-identical runs need a fixed OPENBLAS_NUM_THREADS: the trainer's business.
        int BT2 = 256, C2 = 128, OC2 = 200;
        float *x = frand((size_t)BT2 * C2, 1.0f), *w2 = frand((size_t)OC2 * C2, 1.0f), *d = frand((size_t)BT2 * OC2, 1.0f);
        float *b2 = frand(OC2, 1.0f), *o1 = frand((size_t)BT2 * OC2, 1.0f), *o2 = frand((size_t)BT2 * OC2, 1.0f);
        float *di1 = frand((size_t)BT2 * C2, 1.0f), *dw1 = frand((size_t)OC2 * C2, 1.0f), *db1 = frand(OC2, 1.0f);
        float *di2 = fcopy(di1, (size_t)BT2 * C2), *dw2 = fcopy(dw1, (size_t)OC2 * C2), *db2 = fcopy(db1, OC2);
        float *di0 = fcopy(di1, (size_t)BT2 * C2), *dw0 = fcopy(dw1, (size_t)OC2 * C2), *db0 = fcopy(db1, OC2);
        omp_set_num_threads(1);
        openblas_set_num_threads(1);
        matmul_forward(o1, x, w2, b2, BT2, C2, OC2);
        matmul_backward(di1, dw1, db1, d, x, w2, BT2, C2, OC2);
        int same = 1;
        for (int threads = 2; threads <= 4; threads++) {
            memcpy(di2, di0, (size_t)BT2 * C2 * sizeof(float));
            memcpy(dw2, dw0, (size_t)OC2 * C2 * sizeof(float));
            memcpy(db2, db0, OC2 * sizeof(float));
            omp_set_num_threads(threads);
            matmul_forward(o2, x, w2, b2, BT2, C2, OC2);
            matmul_backward(di2, dw2, db2, d, x, w2, BT2, C2, OC2);
            same &= memcmp(o1, o2, (size_t)BT2 * OC2 * sizeof(float)) == 0 &&
                    memcmp(di1, di2, (size_t)BT2 * C2 * sizeof(float)) == 0 &&
                    memcmp(dw1, dw2, (size_t)OC2 * C2 * sizeof(float)) == 0 &&
                    memcmp(db1, db2, OC2 * sizeof(float)) == 0;
        }
        omp_set_num_threads(1);
        check_true(&c, "out/dinp/dweight/dbias identical with 1, 2, 3 and 4 threads", same);
        free(x); free(w2); free(d); free(b2); free(o1); free(o2); free(di1); free(dw1); free(db1); free(di2); free(dw2);
        free(db2); free(di0); free(dw0); free(db0);
    }
    report(&c);
    free(inp); free(w); free(R); free(out); free(m.inp); free(m.w); free(m.R); free(ref);
    free(g0i); free(g0w); free(g0b); free(g1i); free(g1w); free(g1b); free(g2i); free(g2w); free(g2b);
    free(fdi); free(fdw); free(fdb); free(b);
}

// ---------------------------------------------------------------------------------------
// attention

typedef struct { int B, T, C, NH; double *qkv, *R; } AttCtx;
// out (B,T,C); att (B,NH,T,T) gets the probabilities (0 above the diagonal), pre the scaled scores
static void att_ref(double* out, double* pre, double* att, const AttCtx* a) {
    int B = a->B, T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double* row = (double*)mallocCheck((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double* q = a->qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double* k = a->qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    double s = 0.0;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    row[t2] = s * scale;
                    if (row[t2] > mx) mx = row[t2];
                }
                size_t base = (((size_t)b * NH + h) * T + t) * T;
                if (pre) for (int t2 = 0; t2 <= t; t2++) pre[base + t2] = row[t2];
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) { row[t2] = exp(row[t2] - mx); sum += row[t2]; }
                for (int t2 = 0; t2 < T; t2++) {
                    double p = t2 <= t ? row[t2] / sum : 0.0;
                    row[t2] = p;
                    if (att) att[base + t2] = p;
                }
                double* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double s = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) s += row[t2] * a->qkv[((size_t)b * T + t2) * 3 * C + 2 * C + h * hs + i];
                    o[i] = s;
                }
            }
    free(row);
}
static void att_out(double* out, const void* p) { att_ref(out, NULL, NULL, (const AttCtx*)p); }
static double att_loss(void* p) {
    const AttCtx* a = (const AttCtx*)p;
    return ref_loss(att_out, a, a->R, (size_t)a->B * a->T * a->C);
}

static void test_attention_shape(Check* c, int B, int T, int C, int NH) {
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = frand(nq, 1.5f), *R = frand(no, 1.0f), *out = frand(no, 1.0f);
    float *pre = frand(na, 1.0f), *att = frand(na, 1.0f);
    AttCtx a = {B, T, C, NH, todouble(qkv, nq), todouble(R, no)};
    double* rout = (double*)mallocCheck(no * sizeof(double));
    double* rpre = (double*)callocCheck(na, sizeof(double));
    double* ratt = (double*)mallocCheck(na * sizeof(double));
    attention_forward(out, pre, att, qkv, B, T, C, NH);
    att_ref(rout, rpre, ratt, &a);
    check(c, "forward out", rel_err(out, rout, no), FWD_TOL);
    check(c, "forward att (zeros above the diagonal)", rel_err(att, ratt, na), FWD_TOL);
    // preatt: only t2 <= t is specified
    float* pre_low = fcopy(pre, na);
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++)
            for (int t2 = t + 1; t2 < T; t2++) pre_low[((size_t)bh * T + t) * T + t2] = 0.0f;
    check(c, "forward preatt", rel_err(pre_low, rpre, na), FWD_TOL);

    float* g0 = frand(nq, 1.0f);
    float* g1 = fcopy(g0, nq);
    float* dpre = (float*)mallocCheck(na * sizeof(float));
    float* datt = (float*)mallocCheck(na * sizeof(float));
    fill_nan(dpre, na);
    fill_nan(datt, na);  // scratch: must be overwritten, never read first
    attention_backward(g1, dpre, datt, R, qkv, att, B, T, C, NH);
    float* g2 = fcopy(g1, nq);
    fill_nan(dpre, na);
    fill_nan(datt, na);
    attention_backward(g2, dpre, datt, R, qkv, att, B, T, C, NH);
    double* fd = check_accum_grad_fd(c, "dqkv", g0, g1, g2, a.qkv, nq, att_loss, &a);
    free(qkv); free(R); free(out); free(pre); free(att); free(a.qkv); free(a.R);
    free(rout); free(rpre); free(ratt); free(pre_low); free(g0); free(g1); free(g2); free(dpre); free(datt); free(fd);
}

static void test_attention(void) {
    Check c = {"attention", 1, 0.0};
    test_attention_shape(&c, 2, 5, 8, 2);
    test_attention_shape(&c, 1, ATTN_BLOCK + 9, 8, 2);  // more than one row block
    report(&c);
}

// ---------------------------------------------------------------------------------------
// gelu

typedef struct { size_t N; double *inp, *R; } GeluCtx;
static double gelu_ref1(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double gelu_loss(void* p) {
    GeluCtx* g = (GeluCtx*)p;
    double L = 0.0;
    for (size_t i = 0; i < g->N; i++) L += gelu_ref1(g->inp[i]) * g->R[i];
    return L;
}

static void test_gelu(void) {
    Check c = {"gelu", 1, 0.0};
    size_t N = 2 * 5 * 32;
    float *inp = frand(N, 4.0f), *R = frand(N, 1.0f), *out = frand(N, 1.0f);
    GeluCtx g = {N, todouble(inp, N), todouble(R, N)};
    double* ref = (double*)mallocCheck(N * sizeof(double));
    for (size_t i = 0; i < N; i++) ref[i] = gelu_ref1(g.inp[i]);
    gelu_forward(out, inp, N);
    check(&c, "forward", rel_err(out, ref, N), FWD_TOL);
    float* g0 = frand(N, 1.0f);
    float* g1 = fcopy(g0, N);
    gelu_backward(g1, inp, R, N);
    float* g2 = fcopy(g1, N);
    gelu_backward(g2, inp, R, N);
    double* fd = check_accum_grad_fd(&c, "dinp", g0, g1, g2, g.inp, N, gelu_loss, &g);
    report(&c);
    free(inp); free(R); free(out); free(g.inp); free(g.R); free(ref); free(g0); free(g1); free(g2); free(fd);
}

// ---------------------------------------------------------------------------------------
// residual

// The forward only: the model's backward passes the gradient through a shared buffer
// (llmc/residual.h), which the oracle tests check.
static void test_residual(void) {
    Check c = {"residual", 1, 0.0};
    size_t N = 2 * 5 * 8;
    float *a = frand(N, 1.0f), *b = frand(N, 1.0f), *out = frand(N, 1.0f);
    double* ref = (double*)mallocCheck(N * sizeof(double));
    for (size_t i = 0; i < N; i++) ref[i] = (double)a[i] + (double)b[i];
    residual_forward(out, a, b, N);
    check(&c, "forward", rel_err(out, ref, N), FWD_TOL);
    report(&c);
    free(a); free(b); free(out); free(ref);
}

// ---------------------------------------------------------------------------------------
// classifier (softmax + cross-entropy)

typedef struct { int BT, V, Vp; const int* targets; double *logits, *dlosses; } CeCtx;
// losses (BT) and probs (BT,Vp, zero in the padding)
static void ce_ref(double* losses, double* probs, const CeCtx* e) {
    for (int i = 0; i < e->BT; i++) {
        const double* l = e->logits + (size_t)i * e->Vp;
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < e->V; v++) if (l[v] > mx) mx = l[v];
        for (int v = 0; v < e->V; v++) sum += exp(l[v] - mx);
        if (probs)
            for (int v = 0; v < e->Vp; v++) probs[(size_t)i * e->Vp + v] = v < e->V ? exp(l[v] - mx) / sum : 0.0;
        losses[i] = -(l[e->targets[i]] - mx - log(sum));
    }
}
static void ce_out(double* losses, const void* p) { ce_ref(losses, NULL, (const CeCtx*)p); }
static double ce_loss(void* p) {
    const CeCtx* e = (const CeCtx*)p;
    return ref_loss(ce_out, e, e->dlosses, e->BT);
}

static void test_classifier(void) {
    Check c = {"classifier", 1, 0.0};
    int BT = 10, V = 10, Vp = 16;
    size_t n = (size_t)BT * Vp;
    int targets[10] = {0, 9, 3, 3, 7, 1, 5, 9, 2, 6};
    float* logits = frand(n, 3.0f);
    for (int i = 0; i < BT; i++)
        for (int v = V; v < Vp; v++) logits[(size_t)i * Vp + v] = 100.0f;  // padding must not count
    float* dlosses = frand(BT, 1.0f);
    float *losses = frand(BT, 1.0f), *probs = frand(n, 1.0f);
    CeCtx e = {BT, V, Vp, targets, todouble(logits, n), todouble(dlosses, BT)};
    double* rl = (double*)mallocCheck(BT * sizeof(double));
    double* rp = (double*)mallocCheck(n * sizeof(double));
    crossentropy_softmax_forward(losses, probs, logits, targets, BT, V, Vp);
    ce_ref(rl, rp, &e);
    check(&c, "forward losses", rel_err(losses, rl, BT), FWD_TOL);
    check(&c, "forward probs (zero padding)", rel_err(probs, rp, n), FWD_TOL);

    float* dlogits = (float*)mallocCheck(n * sizeof(float));
    fill_nan(dlogits, n);  // overwritten, not accumulated
    crossentropy_softmax_backward(dlogits, probs, targets, dlosses, BT, V, Vp);
    double* fd = fd_grad(e.logits, n, ce_loss, &e);  // zero for the padded columns
    check(&c, "dlogits vs finite differences", rel_err(dlogits, fd, n), GRAD_TOL);
    int pad_zero = 1;
    for (int i = 0; i < BT; i++)
        for (int v = V; v < Vp; v++) pad_zero &= dlogits[(size_t)i * Vp + v] == 0.0f;
    check_true(&c, "dlogits zero in the padding", pad_zero);
    report(&c);
    free(logits); free(dlosses); free(losses); free(probs); free(e.logits); free(e.dlosses);
    free(rl); free(rp); free(dlogits); free(fd);
}

int main(int argc, char** argv) {
    blas_pick_kernels(argv);
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    test_encoder();
    test_layernorm();
    test_matmul();
    test_attention();
    test_gelu();
    test_residual();
    test_classifier();
    return done_testing();
}
