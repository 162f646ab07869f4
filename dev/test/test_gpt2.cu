/*
 * The GPU trainer against the PyTorch oracle (dev/test/gpt2_oracle.py).
 *
 *   test_gpt2cu MODEL.bin STATE.bin [--final FINAL.bin] [--accum K] [trainer flags] [--test-hazard]
 *   test_gpt2cu --dump-params FILE MODEL.bin STEPS [trainer flags] [--test-hazard]
 * (--test-hazard: dev/test/testing_options.h)
 *
 * The second form trains STEPS steps (B=2, T=16, all-zero tokens) and writes the final
 * params as fp32 in dense canonical order to FILE, for comparisons with the CPU trainer
 * (dev/test/test_zero1.c writes the same format): with -l 0 the master stays the model's
 * weights, so the params are their rounding after the last step (--stochastic-rounding).
 *
 * One rank, no accumulation: checks the forward logits and loss (the evaluation forward,
 * which keeps the logits), the loss of the training forward (with --fused-kernels 1 its
 * classifier writes dlogits in the same pass), every parameter gradient (read from the
 * fp32 grad buffer views), then the losses of the oracle's
 * AdamW steps on the same batch and the first step's gradient norm (relative error within
 * the gradients' relative L2 tolerance, which bounds it). Under mpirun (one GPU per
 * rank) and/or with --accum K the oracle's batch is split over ranks and micro-steps;
 * then the step losses are checked and that every rank ends with bitwise identical
 * parameters. With --final (a reference's weights after its last step, e.g.
 * dev/test/muon_reference.py's --out-final), the fp32 master is compared with them too.
 * Prints TAP (dev/test/check.h) from rank 0.
 * Without a usable GPU (none, or a driver too old) it prints the TAP plan "1..0 # SKIP why" and
 * exits 2: not a pass, so that a suite which found a GPU cannot count the run as one.
 *
 * Tolerances depend on the build:
 * FP32 (PRECISION=FP32, oracle --dtype fp32): the CPU test's (logits max abs 1e-4,
 *   loss 1e-5, each gradient's max abs error <= 1e-3 of its largest magnitude, step
 *   losses 1e-4). cuBLAS runs true fp32 (no TF32); only summation orders and the
 *   --use_fast_math exp/log/div differ from PyTorch, ~1e-6 relative.
 * BF16 (default build, oracle --dtype bf16): the oracle computes in fp32 from the same
 *   bf16 parameters, so the difference is our bf16 activations: every stored activation
 *   is rounded to 8 mantissa bits (relative 2^-9 = 0.2%), about 10 roundings in series
 *   per layer, partly averaged out by the fp32 accumulations. Hence:
 *   - logits: |err| <= 1e-2 + 2e-2 |ref| elementwise (a few roundings of 0.2% each,
 *     plus the absolute error of bf16 outputs near zero);
 *   - loss: 5e-3 absolute (~0.05% of ln V; the logsumexp averages the per-logit noise);
 *   - each gradient tensor: relative L2 error ||g - ref|| / ||ref|| <= 3e-2 and max abs
 *     error <= 1e-1 of the tensor's largest magnitude (bf16 dlogits and activations give
 *     ~1% noise; a real bug shows up as O(1) error);
 *   - each of the step losses: 3e-2 absolute (bf16 noise compounds over the AdamW steps
 *     and moves the loss only at the 1e-3 level on the 10.8 -> ~7 trajectory).
 *   Tensor cores (cuBLAS's BF16 matmuls, the flash kernels' WMMA) truncate instead of
 *   rounding: a dot product of length k loses up to ceil(k/16) (17 2^-25 + 3 U) of its
 *   running sums' largest magnitude, one-sided (test_kernels_cuda.cu, tc_err). The longest
 *   here, the classifier's dinp over Vp = 50304 logits, loses at most 2.2e-3 of its mass had
 *   every term one sign (about one bf16 rounding, and dlogits sum to zero per row, so its
 *   running sums stay far below that); the others (k <= 3072, d12's longest) under 1.4e-4 of
 *   theirs: below the bf16 terms above, which these tolerances are 3-10x over. Measured under the layer's
 *   model (CUDA_CPU_NUMERICS=gpu, an H100's groups): gradients 8.4e-3 max, 6.5e-3 L2, losses
 *   1.3e-4, step norms 2.7e-4 (2.8e-5 the first), logits 4.7e-3: as with fp32 sums.
 */
#define TESTING
#include "train_gpt2.cu"

#ifdef ENABLE_FP32
#define TOL_LOGITS_ABS 1e-4
#define TOL_LOGITS_REL 0.0
#define TOL_LOSS 1e-5
#define TOL_GRAD_MAX 1e-3
#define TOL_GRAD_L2 1e-3
#define TOL_STEP_LOSS 1e-4
#define TOL_STEP_NORM 1e-3  // relative; every step's (the later ones see the updated weights)
#define TOL_FINAL_MATRIX 1e-4  // --final, fp32 Newton-Schulz: the CPU trainer's (dev/test/test_gpt2.c)
#else
#define TOL_LOGITS_ABS 1e-2
#define TOL_LOGITS_REL 2e-2
#define TOL_LOSS 5e-3
#define TOL_GRAD_MAX 1e-1
#define TOL_GRAD_L2 3e-2
#define TOL_STEP_LOSS 3e-2
#define TOL_STEP_NORM 1e-1  // relative: bf16 gradients are ~1% noisy, the later steps' weights too
// --final against an fp32 reference: the gradients differ by up to TOL_GRAD_L2 (relative L2,
// measured 0.9%), and Muon's orthogonalized update passes a relative change of its input on at
// about the same size (Newton-Schulz maps X to ~U V^T, smooth away from tiny singular values);
// an element's error against the largest element of the update is then up to ~3x the L2 figure
// (measured 2.4e-2 over 4 steps): 1e-1 = 3 x TOL_GRAD_L2 + margin.
#define TOL_FINAL_MATRIX 1e-1
#endif
// --muon-ns-bf16 against the reference's bf16 Newton-Schulz ("medium"): each of the 3 x ns_steps
// GEMMs rounds its output to bf16 (an ulp is 2^-7 of an element near 1), and another summation
// order flips some of those roundings; measured 1.5e-2 of the update (MUON_NOTES.md: EO against
// the same formulas in plain torch, 1.1e-2). 5e-2 is about 6 ulps of that noise. It cannot tell
// bf16 products from fp32 ones (those differ by ~1e-2 of the update too): that the flag takes
// effect is a row of its own (dev/test/gpu_rows_muon.sh).
#define TOL_FINAL_MATRIX_NS_BF16 5e-2

#include "dev/test/oracle_state.h"
#include "dev/test/testing_options.h"

// --test-hazard: the trainer's zero1/ optimizer with its communicators behind hazard ones.
#ifdef USE_ZERO1
static Optimizer* testing_gpu_optimizer(const TrainConfig* cfg, const GPT2Config* mc, const GpuSetup* gpu) {
    Zero1Backend* be = zero1_backend_cuda(cfg, gpu->stream, gpu->local_rank, gpu->local_world);
    return zero1_gpt2_optimizer(cfg, mc, testing_wrap_backend(be, (unsigned)cfg->seed),
                                FLOATX_IS_BF16 ? ZERO1_BF16 : ZERO1_FP32);
}
#endif

// After parsing the harness's flags: the optimizer the trainer builds honours them.
static void testing_use_options(void) {
    testing_options_check(plugin_optimizer != NULL);
#ifdef USE_ZERO1
    plugin_optimizer = testing_gpu_optimizer;
#endif
}

static float* download_floatX(const floatX* d, size_t n) {
    floatX* tmp = (floatX*)mallocCheck(n * sizeof(floatX));
    cudaCheck(cudaMemcpy(tmp, d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    float* out = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) out[i] = (float)tmp[i];
    free(tmp);
    return out;
}

static void check_forward_backward(Trainer* tr, const OracleState* s) {
    GPT2* m = &tr->model;
    size_t BT = (size_t)s->B * s->T;
    tr->opt->ops->begin_step(tr->opt, 0);  // zeroes the grads
    cudaCheck(cudaMemsetAsync(m->d_loss, 0, sizeof(float), m->stream));
    gpt2_forward(m, s->x, s->y, s->B, s->T);
    cudaCheck(cudaStreamSynchronize(m->stream));
    float* logits = download_floatX(m->acts.logits, BT * s->Vp);
    double worst_excess;
    double max_err = logits_max_error(s, logits, TOL_LOGITS_ABS, TOL_LOGITS_REL, &worst_excess);
    free(logits);
    report(worst_excess <= 0.0, "logits (max abs err; tol abs + rel*|ref|)", max_err, TOL_LOGITS_ABS);
    float loss;
    cudaCheck(cudaMemcpy(&loss, m->d_loss, sizeof(float), cudaMemcpyDeviceToHost));
    double loss_err = fabs(loss - s->loss);
    report(loss_err <= TOL_LOSS, "loss", loss_err, TOL_LOSS);

    // The training forward (with --fused-kernels 1 its classifier writes dlogits in place,
    // so the logits above came from the plain forward): the same loss, then the backward.
    cudaCheck(cudaMemsetAsync(m->d_loss, 0, sizeof(float), m->stream));
    gpt2_upload_batch(m, s->x, s->y, s->B, s->T);
    gpt2_forward_batch(m, s->B, s->T, 1.0f / (float)BT);
    cudaCheck(cudaMemcpy(&loss, m->d_loss, sizeof(float), cudaMemcpyDeviceToHost));
    loss_err = fabs(loss - s->loss);
    report(loss_err <= TOL_LOSS, "loss of the training forward", loss_err, TOL_LOSS);
    gpt2_backward(m, 1.0f / (float)BT);
    cudaCheck(cudaStreamSynchronize(m->stream));
    float* grads = (float*)mallocCheck(tr->opt->numel * sizeof(float));
    cudaCheck(cudaMemcpy(grads, tr->opt->grads, tr->opt->numel * sizeof(float), cudaMemcpyDeviceToHost));
    check_gradients(&m->config, s, grads, tr->opt->offsets, TOL_GRAD_MAX, TOL_GRAD_L2);
    free(grads);
}

// The fp32 master (the BF16 build's params are its rounding) against a reference's weights
// (--final): read whole where every rank holds all of it; under ZeRO-1 at more than one rank
// (each holds a shard) the FP32 build's all-gathered params, which are the master.
static void check_final_weights(Trainer* tr, const OracleState* s, const char* initial_path, const char* final_path) {
    const GPT2Config* c = &tr->model.config;
    int n = gpt2_num_tensors(c), sharded = tr->cfg.zero_stage == 1 && tr->world > 1;
    if (sharded && FLOATX_IS_BF16) fatal("--final with -z 1 at more than one rank: the FP32 build's (params = master)");
    if (sharded) tr->opt->ops->sync_params(tr->opt);
    float** master = (float**)mallocCheck((size_t)n * sizeof(float*));
    for (int i = 0; i < n; i++) {
        OptimizerPiece whole = {i, 0, gpt2_tensor_numel(c, i)};
        master[i] = (float*)mallocCheck(whole.n * sizeof(float));
        if (sharded) {
            cudaCheck(cudaMemcpy(master[i], (const floatX*)tr->opt->params + tr->opt->offsets[i], whole.n * sizeof(float),
                                 cudaMemcpyDeviceToHost));
        } else {
            tr->opt->ops->read_piece(tr->opt, OPTIMIZER_MASTER, &whole, master[i]);
        }
    }
    int muon = config_uses_muon(&tr->cfg), ns_bf16 = muon && tr->cfg.muon_ns_bf16;
    double tol_matrix = ns_bf16 ? fmax(TOL_FINAL_MATRIX_NS_BF16, TOL_FINAL_MATRIX) : TOL_FINAL_MATRIX;
    // The AdamW tensors: 1e-4 as on the CPU where every number is fp32. With bf16 in the loop
    // an element whose gradient is rounding noise (qkvb's K third) takes AdamW's normalized step
    // of up to lr either way, whatever the noise's size: up to 2 lr per step apart (measured
    // 3.3e-3 for the BF16 build, 7.8e-5 for --muon-ns-bf16, at lr 1e-3 over 4 steps: 8e-3).
    double tol_other = FLOATX_IS_BF16 || ns_bf16 ? 2.0 * s->lr * s->steps : 1e-4;
    compare_final_weights(c, muon, (const float* const*)master, initial_path, final_path, tol_matrix, tol_other);
    for (int i = 0; i < n; i++) free(master[i]);
    free(master);
}

// Bitwise comparison of every rank's param buffer with rank 0's.
static void check_replicas_identical(Trainer* tr) {
    int all_same = trainer_replicas_identical(tr);
    report(all_same, "parameters bitwise identical on all ranks", all_same ? 0.0 : 1.0, 0.0);
}

static const int zero_tokens[2 * 16] = {0};
static void zero_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    *inputs = zero_tokens;
    *targets = zero_tokens;
}

// test_gpt2cu --dump-params FILE MODEL.bin STEPS [trainer flags]: see the top of the file.
static int dump_params_run(int argc, char** argv, const GpuSetup* gpu) {
    if (argc < 5) fatal("usage: %s --dump-params FILE MODEL.bin STEPS [trainer flags]", argv[0]);
    TrainConfig cfg;
    config_defaults(&cfg, &TRAINER_BUILD);
    OptionTable testing = testing_option_table(0);
    config_parse(&cfg, &testing, 1, argc - 4, argv + 4);  // argv[4] acts as argv[0]
    testing_use_options();
    cfg.model = argv[3];
    cfg.B = 2;
    cfg.T = 16;
    cfg.total_batch_tokens = cfg.B * cfg.T * gpu->world;
    config_validate(&cfg, &TRAINER_BUILD, gpu->world);
    Trainer tr;
    trainer_init(&tr, &cfg, gpu);
    for (int step = 0; step < atoi(argv[4]); step++) trainer_step(&tr, step, cfg.lr, zero_batch, NULL, NULL);
    trainer_sync_params(&tr);
    if (gpu->rank == 0) {
        FILE* f = fopenCheck(argv[2], "wb");
        for (int i = 0; i < tr.model.num_tensors; i++) {  // tensors back to back: dense canonical
            size_t n = gpt2_tensor_numel(&tr.model.config, i);
            float* p = download_floatX((const floatX*)tr.model.param[i], n);
            fwriteCheck(p, sizeof(float), n, f, argv[2]);
            free(p);
        }
        fcloseCheck(f, argv[2]);
        printf("test_gpt2cu --dump-params: %d steps, params written to %s\n", atoi(argv[4]), argv[2]);
    }
    trainer_free(&tr);
    return 0;
}

int main(int argc, char** argv) {
    const char* why_none = NULL;
    if (cuda_device_count(&why_none) == 0) {
        tap_skip_all("no usable GPU (%s): nothing was tested (exit 2)", why_none);
        return 2;
    }
    int rank, world;
    mpi_start(&argc, &argv, &rank, &world);
    tap_rank = rank;
    GpuSetup gpu;
    gpu_setup(&gpu, rank, world);
    if (argc > 1 && strcmp(argv[1], "--dump-params") == 0) {
        int rc = dump_params_run(argc, argv, &gpu);
        gpu_teardown(&gpu);
        MPI_Finalize();
        return rc;
    }
    const char* final_path = oracle_take_final(&argc, argv);
    GPT2Config mc;
    int version;
    OracleState s;
    TrainConfig cfg;
    int k = oracle_test_setup(argc, argv, world, &mc, &version, &s, &cfg, testing_option_table(0));
    testing_use_options();
    if (rank == 0) {
        printf("oracle test (GPU %s, %s build, model file v%d): %s, %d ranks x %d micro-steps x B=%d, T=%d\n",
               cuda_libs.device_name, PRECISION_NAME, version, argv[1], world, k, cfg.B, cfg.T);
    }
#ifndef ENABLE_FP32
    if (version != MODEL_VERSION_BF16 && rank == 0) {
        printf("note: the bf16 tolerances assume an oracle made with --dtype bf16\n");
    }
#endif

    Trainer tr;
    if (world == 1 && k == 1) {
        trainer_init(&tr, &cfg, &gpu);
        check_forward_backward(&tr, &s);
        trainer_free(&tr);
    }

    trainer_init(&tr, &cfg, &gpu);
    SliceCtx slice = {&s, rank, world, cfg.B};
    double worst_loss = 0.0, worst_norm = 0.0;
    int losses_ok = 1, norms_ok = 1;
    StepResult* step_results = (StepResult*)mallocCheck((size_t)s.steps * sizeof(StepResult));
    for (int step = 0; step < s.steps; step++) {
        StepResult r = trainer_step(&tr, step, s.lr, slice_batch, &slice, NULL);
        step_results[step] = r;
        double e = fabs(r.loss - s.step_losses[step]);
        worst_loss = fmax(worst_loss, e);
        if (!(e <= TOL_STEP_LOSS)) losses_ok = 0;
        // Every step's norm: from the second step on it also checks the update and, with
        // ZeRO-1, the gradients reduced while the backward runs (the first step fires every
        // bucket at its end, while the runtime learns the gradient counts).
        double step_ne = fabs((double)r.grad_norm - s.step_norms[step]) / fmax(fabs((double)s.step_norms[step]), 1e-30);
        worst_norm = fmax(worst_norm, step_ne);
        if (!(step_ne <= TOL_STEP_NORM)) norms_ok = 0;
        if (step == 0) {
            // The first step's norm comes from the same gradients as check_forward_backward's,
            // so |norm - ref| <= ||g - ref|| <= TOL_GRAD_L2 * ||ref|| when those pass: checks
            // the global-norm kernel (and, on several ranks, the all-reduce) on its own.
            double ne = fabs((double)r.grad_norm - s.step_norms[0]) / fmax(fabs((double)s.step_norms[0]), 1e-30);
            report(ne <= TOL_GRAD_L2, "first step gradient norm (relative err)", ne, TOL_GRAD_L2);
        }
        if (rank == 0) {
            printf("  step %d: loss %.6f (oracle %.6f), norm %.5f (oracle %.5f)\n", step, r.loss, s.step_losses[step],
                   r.grad_norm, s.step_norms[step]);
        }
    }
    report(losses_ok, "step losses", worst_loss, TOL_STEP_LOSS);
    report(norms_ok, "step gradient norms (relative err)", worst_norm, TOL_STEP_NORM);
    // True whatever NCCL's order: every rank receives the same all-reduce result.
    if (final_path) check_final_weights(&tr, &s, argv[1], final_path);
    if (world > 1) check_replicas_identical(&tr);
    uint64_t first_fingerprint = params_fingerprint(&tr);
    trainer_free(&tr);

    // Determinism: the same steps again from the same start must give bitwise the same
    // losses, norms and parameters (no atomics, fixed reduction orders, one stream). Across
    // ranks the gradients are NCCL's float sums, whose order NCCL picks per call (Ring, Tree,
    // NVLS: docs/gpu.md#what-is-bitwise-on-a-gpu). Up to 2 ranks every order gives the same
    // sum (one addition); from 3 the claim needs a pinned algorithm: NCCL_ALGO set, as
    // run_gpu_tests.sh does (NCCL_ALGO=Ring, NCCL_NVLS_ENABLE=0). Without it, not asserted.
    const char* algo = getenv("NCCL_ALGO");
    if (world >= 3 && !(algo && *algo)) {
        char why[160];
        snprintf(why, sizeof(why), "%d ranks sum in the order NCCL picks per call, and NCCL_ALGO does not pin it", world);
        tap_skip(why, "rerun bitwise identical");
    } else {
        trainer_init(&tr, &cfg, &gpu);
        int same = 1;
        for (int step = 0; step < s.steps; step++) {
            StepResult r = trainer_step(&tr, step, s.lr, slice_batch, &slice, NULL);
            StepResult ref = step_results[step];
            same &= memcmp(&r.loss, &ref.loss, sizeof(float)) == 0 &&
                    memcmp(&r.grad_norm, &ref.grad_norm, sizeof(float)) == 0;
        }
        same &= params_fingerprint(&tr) == first_fingerprint;
        // every rank's verdict: one rank's parameters may come out the same by chance
        mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
        trainer_free(&tr);
        report(same, "rerun bitwise identical (losses, norms, params)", same ? 0.0 : 1.0, 0.0);
    }
    gpu_teardown(&gpu);
    int rc = done_testing();
    MPI_Finalize();
    return rc;
}
