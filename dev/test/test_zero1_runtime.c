/*
 * The zero1/ runtime on its own (one rank, the single communicator), with a made-up model,
 * on the CPU device and on the deferred test device (every op as late as the ordering
 * rules allow; memory the host cannot touch). The test reaches the runtime's buffers only
 * through the device ops, as a GPU trainer would.
 *
 *   test_zero1_runtime            three steps through the buckets and views equal three
 *                                 steps of plain AdamW on dense arrays (dense_adamw, written
 *                                 here in double from the formula, not the product's
 *                                 llmc/adamw.h), for several bucket sizes and both param
 *                                 dtypes: the runtime hands every gradient element once to
 *                                 an update with the right m, v, step, clipping and decay
 *   test_zero1_runtime missing    a second step that reports fewer gradient contributions
 *   test_zero1_runtime extra      or more than the first (from which the runtime learns
 *                                 them): the runtime must stop naming the parameters and
 *                                 both counts (exit 1); the shell test checks the message
 * Prints TAP (dev/test/check.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev/test/check.h"
#include "llmc/bf16.h"
#include "run/files.h"
#include "zero1/runtime.h"
#include "zero1/testing/test_doubles.h"

#define NP 5
static const size_t NUMELS[NP] = {1000, 37, 4096, 130, 777};
static const int DECAYS[NP] = {1, 0, 1, 0, 1};
static const int REPORTS[NP] = {2, 1, 1, 1, 1};  // contributions the made-up model reports: p0 is "tied"
static const int FIRST_BLOCK[NP] = {0, 0, 1, 1, 2};

static const char* name_param(void* ctx, int p, char* buf, size_t n) {
    snprintf(buf, n, "p%d", p);
    return buf;
}

static Zero1Runtime* make_runtime(long long bucket_size, Zero1Dtype param_dtype, Zero1Comm* comm,
                                  const Zero1Device* dev) {
    Zero1Options opt;
    memset(&opt, 0, sizeof(opt));
    opt.zero_stage = 1;
    opt.bucket_size = bucket_size;
    opt.shared_embedding = -1;
    opt.overlap_grad_reduce = 1;
    opt.overlap_param_gather = 1;
    opt.param_dtype = param_dtype;
    opt.compute_dtype = ZERO1_FP32;
    opt.grad_dtype = ZERO1_FP32;
    opt.beta1 = 0.9f;
    opt.beta2 = 0.95f;
    opt.eps = 1e-8f;
    opt.weight_decay = 0.1f;
    opt.grad_clip = 1.0f;
    Zero1ModelSpec spec = {NP, NUMELS, DECAYS, FIRST_BLOCK, name_param, NULL, -1, 0, NULL};
    return zero1_runtime_create(&opt, &spec, comm, NULL, dev, NULL);
}

// Plain AdamW (PyTorch's: decoupled weight decay first), step t (1-based), in double, with
// make_runtime's hyperparameters (the float constants, widened).
static void dense_adamw(double* p, const float* g, double* m, double* v, size_t n, int t, double clip, int decays) {
    const double lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] * clip;
        if (decays) p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1.0 - b1) * gi;
        v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        p[i] -= lr * (m[i] / (1.0 - pow(b1, t))) / (sqrt(v[i] / (1.0 - pow(b2, t))) + eps);
    }
}

static float value(uint64_t* s) { return (float)((*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 40) / 16777216.0f - 0.5f; }

// Three steps through the runtime against the same three steps on dense arrays.
static int check_against_dense(long long bucket_size, Zero1Dtype param_dtype, Zero1Device dev) {
    const Zero1DeviceOps* ops = dev.ops;
    Zero1Comm* comm = zero1_comm_single_create(&dev);
    Zero1Runtime* rt = make_runtime(bucket_size, param_dtype, comm, &dev);
    size_t total = 0, offs[NP];
    for (int p = 0; p < NP; p++) {
        offs[p] = total;
        total += NUMELS[p];
    }
    float* params = (float*)callocCheck(total, sizeof(float));
    double* m = (double*)callocCheck(total, sizeof(double));
    double* v = (double*)callocCheck(total, sizeof(double));
    uint64_t seed = 7;
    for (size_t i = 0; i < total; i++) params[i] = value(&seed);
    zero1_load_weights(rt, params, offs);  // with bf16 storage the fp32 master keeps these exact values
    double* master = (double*)mallocCheck(total * sizeof(double));
    for (size_t i = 0; i < total; i++) master[i] = params[i];
    float* grads = (float*)mallocCheck(total * sizeof(float));
    double worst_param = 0.0, worst_norm = 0.0;  // |runtime - reference| (the norm's relative)
    int ok = 1;
    for (int step = 0; step < 3; step++) {
        zero1_begin_step(rt, step);
        zero1_begin_micro_step(rt, 1);
        for (size_t i = 0; i < total; i++) grads[i] = value(&seed) * (step + 1);
        // Report in backprop order: last parameter first; p0 twice (its two contributions).
        for (int p = NP - 1; p >= 0; p--) {
            ops->from_host(dev.ctx, dev.compute, zero1_grad_buffer(rt) + zero1_param_offset(rt, p), grads + offs[p],
                           NUMELS[p] * sizeof(float));
            for (int k = 0; k < REPORTS[p]; k++) zero1_register_grad_ready(rt, p);
        }
        double blocked = 0.0;
        zero1_finish_step(rt, step, 1e-2f, NULL, NULL, &blocked);
        float norm = zero1_read_norm(rt);
        double sumsq = 0.0;
        for (size_t i = 0; i < total; i++) sumsq += (double)grads[i] * grads[i];
        double dense_norm = sqrt(sumsq);
        double clip = dense_norm > 1.0 ? 1.0 / dense_norm : 1.0;
        for (int p = 0; p < NP; p++) {
            dense_adamw(master + offs[p], grads + offs[p], m + offs[p], v + offs[p], NUMELS[p], step + 1, clip, DECAYS[p]);
        }
        // The runtime's float AdamW against the double one: each step rounds p's decay, the
        // direction and the update, a few units of 2^-24 |p| (|p| < 1 here) and the norm's
        // sum; after 3 steps well below 1e-6. bf16 params: the rounding of a master within
        // 1e-6 of the reference's, which rounding to nearest (monotonic) brackets.
        const double tol = 1e-6;
        double norm_err = fabs(norm - dense_norm) / dense_norm;
        worst_norm = fmax(worst_norm, norm_err);
        if (!(norm_err <= tol)) ok = 0;  // written so that NaN fails
        zero1_sync_params(rt);
        for (int p = 0; p < NP; p++) {
            float* got = (float*)mallocCheck(NUMELS[p] * sizeof(float));
            ops->to_host(dev.ctx, dev.compute, got, (const float*)zero1_compute_params(rt) + zero1_param_offset(rt, p),
                         NUMELS[p] * sizeof(float));
            ops->sync_stream(dev.ctx, dev.compute);
            for (size_t i = 0; i < NUMELS[p]; i++) {
                double want = master[offs[p] + i], lo = want - tol, hi = want + tol;
                if (param_dtype == ZERO1_BF16) {
                    lo = bf16_to_float(float_to_bf16((float)lo));
                    hi = bf16_to_float(float_to_bf16((float)hi));
                }
                worst_param = fmax(worst_param, fabs(got[i] - want));
                if (!(got[i] >= lo && got[i] <= hi)) ok = 0;
            }
            free(got);
        }
    }
    tap_ok(ok, "runtime AdamW == dense AdamW on the %s device, bucket size %lld, %s params (worst param diff %.3e, "
           "norm %.3e)", ops->name, bucket_size, param_dtype == ZERO1_BF16 ? "bf16" : "fp32", worst_param, worst_norm);
    zero1_runtime_destroy(rt);
    zero1_comm_destroy(comm);
    free(grads);
    free(params);
    free(master);
    free(m);
    free(v);
    return ok;
}

// One step whose backward reports contributions[p] for each parameter, last parameter first.
static void step_reporting(Zero1Runtime* rt, int step, const int* contributions) {
    zero1_begin_step(rt, step);
    zero1_begin_micro_step(rt, 1);
    for (int p = NP - 1; p >= 0; p--) {
        for (int k = 0; k < contributions[p]; k++) zero1_register_grad_ready(rt, p);
    }
    double blocked = 0.0;
    zero1_finish_step(rt, step, 1e-3f, NULL, NULL, &blocked);
}

// The first step teaches the runtime REPORTS; the second reports other counts.
static void mismatch(const int* second) {
    Zero1Device dev = zero1_device_cpu();
    Zero1Comm* comm = zero1_comm_single_create(&dev);
    Zero1Runtime* rt = make_runtime(0, ZERO1_FP32, comm, &dev);
    step_reporting(rt, 0, REPORTS);
    printf("first step done\n");
    step_reporting(rt, 1, second);
    tap_ok(0, "the runtime stops at a step whose gradient contributions differ from the first's");
    exit(0);  // a zero exit here fails the shell check
}

int main(int argc, char** argv) {
    static const int MISSING[NP] = {1, 0, 1, 1, 1};  // p1 and p0's second contribution never come
    static const int EXTRA[NP] = {3, 1, 1, 1, 1};    // p0 reported once more
    if (argc > 1 && strcmp(argv[1], "missing") == 0) mismatch(MISSING);
    if (argc > 1 && strcmp(argv[1], "extra") == 0) mismatch(EXTRA);
    long long sizes[] = {0, 1, 200, 5000};
    for (int i = 0; i < 4; i++) {
        check_against_dense(sizes[i], ZERO1_FP32, zero1_device_cpu());
        check_against_dense(sizes[i], ZERO1_BF16, zero1_device_cpu());
        Zero1Device deferred = zero1_device_deferred_create();
        check_against_dense(sizes[i], ZERO1_FP32, deferred);
        check_against_dense(sizes[i], ZERO1_BF16, deferred);
        zero1_device_deferred_destroy(&deferred);
    }
    return done_testing();
}
