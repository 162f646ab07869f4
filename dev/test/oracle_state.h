/*
 * The oracle's debug state (dev/test/gpt2_oracle.py make; format in docs/formats.md, "Oracle debug state")
 * and the checks both oracle tests share: test_gpt2.c (CPU) and test_gpt2.cu (GPU), printed as TAP
 * (dev/test/check.h; the tests set tap_rank).
 */
#ifndef DEV_TEST_ORACLE_STATE_H
#define DEV_TEST_ORACLE_STATE_H

#include <math.h>

#include "dev/test/check.h"
#include "run/config.h"
#include "llmc/gpt2_spec.h"
#include "run/model_file.h"
#include "run/files.h"

#define STATE_MAGIC 20240327
#define STATE_VERSION 3

typedef struct {
    int B, T, V, Vp, steps;
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    int *x, *y;
    float* logits;          // B*T*Vp
    float loss;
    float* grads;           // dense canonical order (reordered from the file's)
    float* step_losses;
    float* step_norms;
} OracleState;

static void read_state(const char* path, const GPT2Config* mc, OracleState* s) {
    FILE* f = fopenCheck(path, "rb");
    int h[256];
    float hp[8];
    freadCheck(h, sizeof(int), 256, f, path);
    if (h[0] != STATE_MAGIC || h[1] != STATE_VERSION) fatal("%s: not an oracle debug state (v%d)", path, STATE_VERSION);
    s->B = h[2];
    s->T = h[3];
    s->V = h[4];
    s->Vp = h[5];
    s->steps = h[6];
    if (s->V != mc->vocab_size || s->Vp != mc->padded_vocab_size || h[7] != mc->num_layers || h[9] != mc->channels) {
        fatal("%s: debug state does not match the model", path);
    }
    freadCheck(hp, sizeof(float), 8, f, path);
    s->lr = hp[0];
    s->beta1 = hp[1];
    s->beta2 = hp[2];
    s->eps = hp[3];
    s->weight_decay = hp[4];
    s->grad_clip = hp[5];
    size_t BT = (size_t)s->B * s->T, n = gpt2_num_parameters(mc);
    s->x = (int*)mallocCheck(BT * sizeof(int));
    s->y = (int*)mallocCheck(BT * sizeof(int));
    s->logits = (float*)mallocCheck(BT * s->Vp * sizeof(float));
    s->grads = (float*)mallocCheck(n * sizeof(float));
    s->step_losses = (float*)mallocCheck(s->steps * sizeof(float));
    s->step_norms = (float*)mallocCheck(s->steps * sizeof(float));
    float* file_order = (float*)mallocCheck(n * sizeof(float));
    freadCheck(s->x, sizeof(int), BT, f, path);
    freadCheck(s->y, sizeof(int), BT, f, path);
    freadCheck(s->logits, sizeof(float), BT * s->Vp, f, path);
    freadCheck(&s->loss, sizeof(float), 1, f, path);
    freadCheck(file_order, sizeof(float), n, f, path);
    freadCheck(s->step_losses, sizeof(float), s->steps, f, path);
    freadCheck(s->step_norms, sizeof(float), s->steps, f, path);
    fcloseCheck(f, path);
    gpt2_dense_reorder(mc, s->grads, file_order, 0);
    free(file_order);
}

static void report(int ok, const char* what, double err, double tol) {
    tap_ok(ok, "%-44s err %.3e (tol %.1e)", what, err, tol);
}

// The rows of the oracle's global batch that rank r uses in micro-step m.
typedef struct {
    const OracleState* s;
    int rank, world, B_local;
} SliceCtx;

static void slice_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    SliceCtx* c = (SliceCtx*)ctx;
    size_t row = (size_t)(micro * c->world + c->rank) * c->B_local;
    *inputs = c->s->x + row * c->s->T;
    *targets = c->s->y + row * c->s->T;
}

// Parses `MODEL STATE [--accum K] [trainer flags]`: reads the model's shape and the state,
// and sets cfg to train the oracle's batch split over world ranks x K micro-steps with the
// oracle's hyperparameters. Returns K.
// testing: the harness's own options (dev/test/testing_options.h), parsed with the trainer's.
static int oracle_test_setup(int argc, char** argv, int world, GPT2Config* mc, int* version, OracleState* s,
                             TrainConfig* cfg, OptionTable testing) {
    if (argc < 3) fatal("usage: %s MODEL.bin STATE.bin [--accum K] [trainer flags]", argv[0]);
    free(gpt2_model_file_read(argv[1], mc, version));
    read_state(argv[2], mc, s);
    int k = 1, first_flag = 2;
    if (argc > 4 && strcmp(argv[3], "--accum") == 0) {
        k = atoi(argv[4]);
        if (k < 1) fatal("--accum expects a positive count");
        first_flag = 4;
    }
    config_defaults(cfg, &TRAINER_BUILD);
    cfg->zero_stage = 0;  // the replicated optimizer unless -z 1 says otherwise
    config_parse(cfg, &testing, 1, argc - first_flag, argv + first_flag);  // argv[first_flag] acts as argv[0]
    if (s->B % (world * k) != 0) {
        fatal("the oracle batch B=%d does not split over %d ranks x %d micro-steps", s->B, world, k);
    }
    cfg->model = argv[1];
    cfg->B = s->B / (world * k);
    cfg->T = s->T;
    cfg->total_batch_tokens = cfg->B * cfg->T * world * k;
    cfg->lr = s->lr;
    cfg->beta1 = s->beta1;
    cfg->beta2 = s->beta2;
    cfg->eps = s->eps;
    cfg->weight_decay = s->weight_decay;
    cfg->grad_clip = s->grad_clip;
    config_validate(cfg, &TRAINER_BUILD, world);
    return k;
}

// Max abs error of the logits (first V of Vp columns) against the oracle, and the worst
// excess over abs_tol + rel_tol*|ref| (<= 0 when every element is within tolerance).
// A non-finite logit counts as an infinite error (fmax alone would drop a NaN).
static double logits_max_error(const OracleState* s, const float* logits, double abs_tol, double rel_tol,
                               double* worst_excess) {
    double max_err = 0.0;
    *worst_excess = -1.0;
    for (size_t i = 0; i < (size_t)s->B * s->T; i++) {
        for (int v = 0; v < s->V; v++) {
            double ref = s->logits[i * s->Vp + v];
            double e = fabs(logits[i * s->Vp + v] - ref);
            if (!isfinite(e)) e = INFINITY;
            max_err = fmax(max_err, e);
            *worst_excess = fmax(*worst_excess, e - (abs_tol + rel_tol * fabs(ref)));
        }
    }
    return max_err;
}

// Every tensor's gradient (tensor i at grads + offsets[i], host memory) against the
// oracle: max abs error relative to the tensor's largest magnitude, and relative L2 error.
static void check_gradients(const GPT2Config* c, const OracleState* s, const float* grads, const size_t* offsets,
                            double tol_max, double tol_l2) {
    size_t* dense = (size_t*)mallocCheck(gpt2_num_tensors(c) * sizeof(size_t));
    gpt2_tensor_offsets_dense(c, dense);
    int ok = 1;
    double worst_max = 0.0, worst_l2 = 0.0;
    for (int i = 0; i < gpt2_num_tensors(c); i++) {
        size_t n = gpt2_tensor_numel(c, i);
        const float* expect = s->grads + dense[i];
        const float* got = grads + offsets[i];
        double maxmag = 0.0, err = 0.0, diff2 = 0.0, ref2 = 0.0;
        for (size_t j = 0; j < n; j++) {
            double d = (double)got[j] - expect[j];
            maxmag = fmax(maxmag, fabs(expect[j]));
            err = fmax(err, fabs(d));
            diff2 += d * d;
            ref2 += (double)expect[j] * expect[j];
        }
        double rel_max = maxmag > 0 ? err / maxmag : err;
        double rel_l2 = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
        worst_max = fmax(worst_max, rel_max);
        worst_l2 = fmax(worst_l2, rel_l2);
        if (!(rel_max <= tol_max && rel_l2 <= tol_l2)) {
            char name[64];
            printf("  gradient %s: max abs err %.3e (largest magnitude %.3e), relative L2 err %.3e\n",
                   gpt2_tensor_name(c, i, name, 64), err, maxmag, rel_l2);
            ok = 0;
        }
    }
    report(ok && worst_max <= tol_max, "gradients (worst tensor, max abs / largest)", worst_max, tol_max);
    report(ok && worst_l2 <= tol_l2, "gradients (worst tensor, relative L2)", worst_l2, tol_l2);
    free(dense);
}

// The worst error so far: a NaN, once seen at any step, stays the worst (a later finite error
// must not replace it), so that it fails the report.
static double worst_of(double worst, double e) { return isnan(worst) || e <= worst ? worst : e; }

// --final FILE, right after MODEL STATE: taken out of argv; NULL without it.
static const char* oracle_take_final(int* argc, char** argv) {
    if (*argc <= 4 || strcmp(argv[3], "--final") != 0) return NULL;
    const char* path = argv[4];
    for (int i = 3; i + 2 <= *argc; i++) argv[i] = argv[i + 2];
    *argc -= 2;
    return path;
}

// The trained weights (mine[i]: tensor i, fp32) against a reference's after its last step
// (--final): with Muon each Muon matrix within tol_matrix of the largest element of its reference
// update (final - initial: Newton-Schulz's rounding moves the whole update, so relative to it),
// every other tensor within tol_other absolute (the largest AdamW error: qkvb's K third, whose
// gradient is rounding noise that AdamW turns into full steps).
static void compare_final_weights(const GPT2Config* c, int muon, const float* const* mine, const char* initial_path,
                                  const char* final_path, double tol_matrix, double tol_other) {
    GPT2Config a, b;
    int version;
    float* initial = gpt2_model_file_read(initial_path, &a, &version);
    float* final = gpt2_model_file_read(final_path, &b, &version);
    if (a.padded_vocab_size != b.padded_vocab_size || a.num_layers != b.num_layers || a.channels != b.channels) {
        fatal("--final %s: not the shape of %s", final_path, initial_path);
    }
    double worst_matrix = 0.0, worst_other = 0.0;
    size_t at = 0;
    for (int i = 0; i < gpt2_num_tensors(c); i++) {
        size_t n = gpt2_tensor_numel(c, i);
        double err = 0.0, update = 0.0;
        for (size_t j = 0; j < n; j++) {
            err = worst_of(err, fabs((double)mine[i][j] - final[at + j]));
            update = fmax(update, fabs((double)final[at + j] - initial[at + j]));
        }
        if (muon && gpt2_tensor_is_hidden_matrix(c, i)) worst_matrix = worst_of(worst_matrix, err / fmax(update, 1e-30));
        else worst_other = worst_of(worst_other, err);
        at += n;
    }
    if (muon) report(worst_matrix <= tol_matrix, "final Muon matrices (error / update)", worst_matrix, tol_matrix);
    report(worst_other <= tol_other, "final weights of the other tensors", worst_other, tol_other);
    free(initial);
    free(final);
}

#endif
