/*
 * ZeRO-1 against the replicated optimizer, step by step, under mpirun.
 *
 *   test_zero1 MODEL.bin [--steps N] [--accum K] [--batch B_GLOBAL] [--seq T] [--dump-params FILE]
 *              [trainer flags for the ZeRO-1 run, and --test-device deferred --test-hazard
 *              (dev/test/testing_options.h)]
 *
 * Trains the same model on the same global batches twice in one process:
 *   reference: replicated AdamW (-z 0), without --fp32-accumulation or --average-in-collective. With fp32 params this is the trainer's plain
 *              path (one MPI_Allreduce of a dense gradient buffer, no zero1/ code); with
 *              --param-dtype/--grad-dtype bf16 it is the runtime's replicated mode with
 *              the same dtypes (bf16 storage only exists in the plugin);
 *   candidate: the flags given, through the plugin (e.g. -z 1 --bucket-size 3000, or
 *              -z 0: the runtime's bucketed all-reduce against the plain path).
 * Then the candidate again with both overlaps switched the other way, which must give
 * bitwise the same losses and parameters.
 *
 * Asserts: per-step losses and grad norms, and every final parameter, within tolerances
 * derived in main (for the parameters: what AdamW can make of the reduction's rounding,
 * element by element, see GradWatch); every rank's optimizer-state bytes equal
 * 8 (fp32 storage, master == params) or 12 (bf16 storage) bytes per owned element; owned
 * elements summed over ranks equal the padded buffer (once per distributed-optimizer
 * instance with --dist-opt-instances K); all ranks hold identical parameters. With -l 0
 * the master never moves, so the params are its rounding after the last step (with
 * --stochastic-rounding, by that step's bits): the candidate then equals the reference
 * bitwise. --dump-params: rank 0 writes the candidate's final params (fp32, dense
 * canonical) to FILE, for comparisons across runs (dev/test/test_zero1.sh). Prints TAP
 * (dev/test/check.h) from rank 0.
 */
#define TESTING
#include "train_gpt2.c"

#include "dev/test/check.h"
#include "dev/test/testing_cpu.h"

typedef struct {
    int* x;          // global batches, one per step: (steps, B_global*T)
    int* y;
    int B_global, T, rank, world, k, step;
} SyntheticData;

// The rows of the current step's global batch that this rank uses in micro-step m.
static void synthetic_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    SyntheticData* d = (SyntheticData*)ctx;
    int B_local = d->B_global / (d->world * d->k);
    size_t row = (size_t)(micro * d->world + d->rank) * B_local;
    size_t base = (size_t)d->step * d->B_global * d->T;
    *inputs = d->x + base + row * d->T;
    *targets = d->y + base + row * d->T;
}

typedef struct {
    float* losses;
    float* norms;    // grad norm per step (before clipping)
    float* params;   // dense canonical, after training
    size_t params_n;
} RunResult;

// ---- what AdamW can make of the reduction's rounding ----------------------------------
// Both runs reduce the same rank gradients g_r, in other orders or (--average-in-collective)
// scaled by an inexact 1/DP at another point. Each reduced element is within DP*u*A of the
// exact sum, A = sum_r |g_r| and u the unit roundoff of the reduction's dtype (DP-1 additions
// and one conversion or scaling, each off by at most u*A), so the runs' gradients differ by up
// to rho = 2*DP*u*A/|g| of the gradient. AdamW's direction d = m^/(sqrt(v^)+eps) then moves by
// at most 2*U_t*rho/(1-rho) if every gradient so far moved by up to rho, and by at most 2*U_t
// in any case (U_t: the largest |d| at step t, below), and weight decay only shrinks a
// difference. So each element's parameter may differ by the sum over steps of
// 2*lr*U_t*min(1, rho/(1-rho)), rho the largest so far: about lr per step for a gradient that
// cancels over the ranks down to its rounding, nearly nothing for the others.
typedef struct {
    double rho_unit;       // 2*DP*u
    double beta1, beta2;
    GPT2Config config;
    size_t n;              // dense elements
    float* rho;            // per dense element: the largest rho so far
    double* allowance;     // per dense element: the sum so far
} GradWatch;

// The largest |m^/(sqrt(v^)+eps)| at step t (1-based) over all gradient sequences: by
// Cauchy-Schwarz, |m_t| <= (1-b1) sqrt(sum_k (b1^2/b2)^k) sqrt(v_t/(1-b2)), k < t.
static double adamw_direction_bound(double b1, double b2, int t) {
    double s = 0.0;
    for (int k = 0; k < t; k++) s += pow(b1 * b1 / b2, k);
    return (1.0 - b1) / (1.0 - pow(b1, t)) * sqrt((1.0 - pow(b2, t)) / (1.0 - b2)) * sqrt(s);
}

static GradWatch* watch;                  // the reference run's, for watched_finish_step
static const OptimizerOps* watched_ops;   // the reference optimizer's own

// Before the reference reduces: the exact (double) sums of the rank gradients and of their
// magnitudes, per dense element, and each element's allowance for this step's update.
static void watched_finish_step(Optimizer* o, int step, float lr, const UpdateGate* gate, double* blocked_ms) {
    double* sum = (double*)mallocCheck(2 * watch->n * sizeof(double));
    double* mag = sum + watch->n;
    size_t d = 0;
    for (int t = 0; t < gpt2_num_tensors(&watch->config); t++) {
        const float* g = o->grads + o->offsets[t];
        for (size_t j = 0; j < gpt2_tensor_numel(&watch->config, t); j++, d++) {
            sum[d] = g[j];
            mag[d] = fabs(g[j]);
        }
    }
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, sum, (int)(2 * watch->n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    double most = 2.0 * lr * adamw_direction_bound(watch->beta1, watch->beta2, step + 1);
    for (size_t i = 0; i < watch->n; i++) {
        double rho = mag[i] == 0.0 ? 0.0 : fabs(sum[i]) == 0.0 ? 1.0 : watch->rho_unit * mag[i] / fabs(sum[i]);
        watch->rho[i] = (float)fmax(watch->rho[i], rho);
        double r = watch->rho[i];
        watch->allowance[i] += most * (r >= 0.5 ? 1.0 : r / (1.0 - r));
    }
    free(sum);
    watched_ops->finish_step(o, step, lr, gate, blocked_ms);
}

static RunResult run(const TrainConfig* cfg, SyntheticData* data, int steps, int use_plugin, GradWatch* w) {
    Trainer tr;
    trainer_init_with(&tr, cfg, data->rank, data->world, use_plugin);
    static OptimizerOps wrapped;
    if (w) {  // the reference: watch its gradients before each reduction
        watch = w;
        watched_ops = tr.opt->ops;
        wrapped = *tr.opt->ops;
        wrapped.finish_step = watched_finish_step;
        tr.opt->ops = &wrapped;
    }
    RunResult r;
    r.losses = (float*)mallocCheck(steps * sizeof(float));
    r.norms = (float*)mallocCheck(steps * sizeof(float));
    for (int s = 0; s < steps; s++) {
        data->step = s;
        StepResult sr = trainer_step(&tr, s, cfg->lr, synthetic_batch, data, NULL);
        r.losses[s] = sr.loss;
        r.norms[s] = sr.grad_norm;
    }
    trainer_sync_params(&tr);
    const GPT2Config* c = &tr.model.config;
    size_t* dense = (size_t*)mallocCheck(tr.model.num_tensors * sizeof(size_t));
    size_t n = gpt2_tensor_offsets_dense(c, dense);
    r.params = (float*)mallocCheck(n * sizeof(float));
    for (int i = 0; i < tr.model.num_tensors; i++) {
        memcpy(r.params + dense[i], tr.model.param[i], gpt2_tensor_numel(c, i) * sizeof(float));
    }
    free(dense);
    if (!trainer_replicas_identical(&tr)) fatal("FAIL: ranks hold different parameters after training");
    if (strcmp(tr.opt->name, "zero1") == 0) {
        // Ownership: measured state bytes per owned element, and the owned elements add up.
        Zero1Runtime* rt = zero1_optimizer_runtime(tr.opt);
        size_t owned = zero1_owned_numel(rt), bytes = tr.opt->ops->state_bytes(tr.opt);
        size_t per = cfg->param_dtype == DTYPE_BF16 ? 12 : 8;
        // Sharded, every distributed-optimizer instance (group) owns the buffer once.
        int sharded = cfg->zero_stage == 1 && data->world > 1;
        double total = (double)owned;
        mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
        size_t numel = zero1_layout(rt)->numel;
        double expect_total = sharded ? (double)numel * cfg->dist_opt_instances : (double)numel * data->world;
        int ok = bytes == per * owned && total == expect_total;
        tap_ok(ok, "ownership: %zu owned elements x %zu B = %zu state bytes on rank %d; owned over ranks %.0f "
               "(buffer %zu)", owned, per, bytes, data->rank, total, numel);
        if (!ok) fatal("FAIL: optimizer-state ownership");
    }
    trainer_free(&tr);
    r.params_n = n;
    return r;
}

// Losses and grad norms within loss_rel_tol (a gradient scaled wrongly, by DP say, shows in
// the norm even where AdamW's scale invariance hides it in the losses); parameters within
// tau + param_rel_tol*|p| plus what AdamW can make of the reduction's rounding (w).
static void compare(const char* what, const RunResult* ref, const RunResult* got, int steps, double loss_rel_tol,
                    double param_rel_tol, double tau, const GradWatch* w, int rank) {
    double worst_loss = 0.0, worst_norm = 0.0, worst_param = 0.0, drift = 0.0;
    size_t above_tau = 0;  // elements whose allowance exceeds tau
    int ok = 1;
    for (int s = 0; s < steps; s++) {
        double rel = fabs(got->losses[s] - ref->losses[s]) / fabs(ref->losses[s]);
        double norm_rel = fabs(got->norms[s] - ref->norms[s]) / fabs(ref->norms[s]);
        worst_loss = fmax(worst_loss, rel);
        worst_norm = fmax(worst_norm, norm_rel);
        if (!(rel <= loss_rel_tol) || !(norm_rel <= loss_rel_tol)) ok = 0;  // written so that NaN fails
    }
    for (size_t i = 0; i < ref->params_n; i++) {
        double e = fabs(got->params[i] - ref->params[i]);
        double explained = param_rel_tol * fabs(ref->params[i]) + w->allowance[i];
        worst_param = fmax(worst_param, e);
        drift = fmax(drift, e - explained);
        if (w->allowance[i] > tau) above_tau++;
        if (!(e <= tau + explained)) ok = 0;
    }
    tap_ok(ok, "%s: worst loss rel diff %.3e, worst norm rel diff %.3e (tol %.1e); worst param abs diff %.3e, "
           "beyond %.1e*|p| and AdamW's share of the reduction's rounding %.3e (tol %.1e; the share exceeds "
           "it for %zu elements)", what, worst_loss, worst_norm, loss_rel_tol, worst_param, param_rel_tol, drift, tau,
           above_tau);
}

static void compare_bitwise(const char* what, const RunResult* a, const RunResult* b, int steps, int rank) {
    int ok = memcmp(a->losses, b->losses, steps * sizeof(float)) == 0 &&
             memcmp(a->params, b->params, a->params_n * sizeof(float)) == 0;
    tap_ok(ok, "%s: losses and parameters bitwise identical", what);
}

int main(int argc, char** argv) {
    blas_pick_kernels(argv);  // run/blas_cores.h, through train_gpt2.c
    int rank, world;
    mpi_start(&argc, &argv, &rank, &world);
    tap_rank = rank;
    if (argc < 2) fatal("usage: %s MODEL.bin [--steps N] [--accum K] [--batch B] [--seq T] [trainer flags]", argv[0]);
    int steps = 10, k = 1, B_global = 12, T = 16, a = 2;
    const char* dump_params = NULL;
    for (; a + 1 < argc; a += 2) {
        if (strcmp(argv[a], "--steps") == 0) steps = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--accum") == 0) k = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--batch") == 0) B_global = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--seq") == 0) T = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--dump-params") == 0) dump_params = argv[a + 1];
        else break;
    }
    if (steps < 1 || k < 1 || T < 1 || B_global % (world * k) != 0) {
        fatal("--batch %d must split over %d ranks x --accum %d micro-steps", B_global, world, k);
    }
    TrainConfig cfg;
    config_defaults(&cfg, &TRAINER_BUILD);
    cfg.lr = 1e-3f;  // -l may change it
    OptionTable testing = testing_option_table(1);
    config_parse(&cfg, &testing, 1, argc - (a - 1), argv + (a - 1));
    testing_use_options();
    cfg.model = argv[1];
    cfg.B = B_global / (world * k);
    cfg.T = T;
    cfg.total_batch_tokens = cfg.B * T * world * k;
    cfg.weight_decay = 0.1f;
    cfg.grad_clip = 1.0f;
    config_validate(&cfg, &TRAINER_BUILD, world);

    GPT2Config mc;
    int version;
    free(gpt2_model_file_read(argv[1], &mc, &version));
    SyntheticData data = {NULL, NULL, B_global, T, rank, world, k, 0};
    size_t total = (size_t)steps * B_global * T;
    data.x = (int*)mallocCheck(total * sizeof(int));
    data.y = (int*)mallocCheck(total * sizeof(int));
    uint64_t rng = rng_seed(1234);  // same tokens on every rank
    for (size_t i = 0; i < total; i++) {
        data.x[i] = (int)(rng_u32(&rng) % (uint32_t)mc.vocab_size);
        data.y[i] = (int)(rng_u32(&rng) % (uint32_t)mc.vocab_size);
    }

    TrainConfig ref_cfg = cfg;  // the reference runs on the plain CPU device, without test hazards
    ref_cfg.zero_stage = 0;
    ref_cfg.dist_opt_instances = 1;
    ref_cfg.split_embedding = 0;
    ref_cfg.fp32_accumulation = 0;      // the reference is the plain way: bf16 reduce-scatter, pre-scaled
    ref_cfg.average_in_collective = 0;
    int bf16 = cfg.param_dtype == DTYPE_BF16 || cfg.grad_dtype == DTYPE_BF16;
    if (rank == 0) {
        printf("test_zero1: %d ranks, %d steps, %d micro-steps of B=%d T=%d; candidate -z %d%s%s%s, bucket size %lld, "
               "%d distributed-optimizer instance%s\n",
               world, steps, k, cfg.B, T, cfg.zero_stage, cfg.param_dtype == DTYPE_BF16 ? ", bf16 params" : "",
               cfg.grad_dtype == DTYPE_BF16 ? ", bf16 grad reduction" : "", cfg.overlap_grad_reduce ? "" : ", no overlap",
               cfg.bucket_size, cfg.dist_opt_instances, cfg.dist_opt_instances == 1 ? "" : "s");
    }
    // Tolerances. Parameters: tau + param_rel_tol*|p| + what AdamW can make of the reduction's
    // rounding (GradWatch, above). bf16 params: each run rounds its master to nearest, off by
    // at most half an ulp, 2^-8 |p|, so 2^-7 |p| for the two (stochastically 2^-6). tau is the
    // drift no per-element bound covers: once any element differs, every later gradient comes
    // from other parameters. Losses and norms are bounded by the drift alone. The drift,
    // measured on this test's rows under OpenBLAS's Prescott, Haswell and SkylakeX kernels
    // (dev/test/run_tests.sh's numeric_coretypes step runs them all): 0 where both runs sum in
    // the same order; params 2.3e-6 (split embedding: rows added in another order); with
    // --average-in-collective at a DP that is not a power of two, where every rank's backward
    // also runs at another loss scale (1/DP inexact), params 2.8e-5, losses 1.4e-7, norms
    // 5.5e-6; bf16 losses 3.7e-6, norms 2.4e-4 (fp32 accumulation). The tolerances leave a
    // factor of 3.5 or more.
    double loss_rel_tol = 1e-6, param_rel_tol = 0.0, tau = 1e-5;
    const char* what = "plugin run vs plain replicated";
    if (bf16) {
        what = "bf16 run vs replicated with the same dtypes";
        loss_rel_tol = 1e-3, tau = 1e-6;
        if (cfg.param_dtype == DTYPE_BF16) param_rel_tol = 2.0 * (cfg.stochastic_rounding ? 1.0 / 128 : 1.0 / 256);
    } else if (cfg.average_in_collective && (world & (world - 1)) != 0) {
        what = "plugin run (averaging) vs plain replicated";
        loss_rel_tol = 2e-5, tau = 1e-4;
    }
    double u = cfg.grad_dtype == DTYPE_BF16 ? 1.0 / 256 : 1.0 / 16777216;  // the reduction's unit roundoff
    GradWatch w = {2.0 * world * u, cfg.beta1, cfg.beta2, mc, 0, NULL, NULL};
    size_t* dense_offsets = (size_t*)mallocCheck(gpt2_num_tensors(&mc) * sizeof(size_t));
    w.n = gpt2_tensor_offsets_dense(&mc, dense_offsets);
    free(dense_offsets);
    w.rho = (float*)callocCheck(w.n, sizeof(float));
    w.allowance = (double*)callocCheck(w.n, sizeof(double));
    if (bf16) ref_cfg.overlap_grad_reduce = 0;  // the watch reads the gradients before any bucket reduces
    TestingOptions asked = testing_options;  // the reference runs on the plain CPU device and MPI
    testing_options = (TestingOptions)TESTING_OPTIONS_NONE;
    RunResult ref = run(&ref_cfg, &data, steps, bf16, &w);
    testing_options = asked;
    RunResult got = run(&cfg, &data, steps, 1, NULL);
    compare(what, &ref, &got, steps, loss_rel_tol, param_rel_tol, tau, &w, rank);
    if (cfg.lr == 0.0f) compare_bitwise("lr 0: the rounded fixed master", &ref, &got, steps, rank);
    if (dump_params && rank == 0) {
        FILE* f = fopenCheck(dump_params, "wb");
        fwriteCheck(got.params, sizeof(float), got.params_n, f, dump_params);
        fcloseCheck(f, dump_params);
    }
    TrainConfig flipped = cfg;
    flipped.overlap_grad_reduce = !cfg.overlap_grad_reduce;
    flipped.overlap_param_gather = !cfg.overlap_param_gather;
    RunResult other = run(&flipped, &data, steps, 1, NULL);
    compare_bitwise("overlap on vs off (one bucket)", &got, &other, steps, rank);
    int rc = done_testing();
    MPI_Finalize();
    return rc;
}
