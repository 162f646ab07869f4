/*
 * The CPU trainer against the PyTorch oracle (dev/test/gpt2_oracle.py).
 *
 *   test_gpt2 MODEL.bin STATE.bin [--accum K] [trainer flags, e.g. -z 1 --bucket-size 4096]
 *
 * One rank, no accumulation: checks the forward logits and loss, every parameter
 * gradient, then the losses of the oracle's AdamW steps on the same batch.
 * Under mpirun (and/or with --accum K micro-steps per step) the oracle's global batch
 * is split over ranks and micro-steps; then the step losses are checked, and that every rank ends
 * with bitwise identical parameters.
 *
 * Tolerances (from the issue): logits max abs 1e-4, loss 1e-5, each gradient tensor max
 * abs error <= 1e-3 of that tensor's largest magnitude, each step loss within 1e-4.
 */
#define TESTING
#include "train_gpt2.c"

#define STATE_MAGIC 20240327
#define STATE_VERSION 3

typedef struct {
    int B, T, V, Vp, steps;
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    int *x, *y;
    float* logits;          // B*T*Vp
    float loss;
    float* grads;           // file (tensor-major) order
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
    freadCheck(s->x, sizeof(int), BT, f, path);
    freadCheck(s->y, sizeof(int), BT, f, path);
    freadCheck(s->logits, sizeof(float), BT * s->Vp, f, path);
    freadCheck(&s->loss, sizeof(float), 1, f, path);
    freadCheck(s->grads, sizeof(float), n, f, path);
    freadCheck(s->step_losses, sizeof(float), s->steps, f, path);
    freadCheck(s->step_norms, sizeof(float), s->steps, f, path);
    fcloseCheck(f, path);
}

static int failures = 0;

static void report(int ok, const char* what, double err, double tol) {
    if (!ok) failures++;
    if (utils_rank() == 0) printf("%s %-40s err %.3e (tol %.1e)\n", ok ? "PASS" : "FAIL", what, err, tol);
}

// The rows of the global batch that rank r uses in micro-step m.
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

// Forward logits and loss, and the gradient of every tensor, on the whole batch (one rank).
static void check_forward_backward(Trainer* tr, const OracleState* s) {
    GPT2* m = &tr->model;
    const GPT2Config* c = &m->config;
    size_t BT = (size_t)s->B * s->T;
    for (int i = 0; i < m->num_tensors; i++) memset(m->grad[i], 0, gpt2_tensor_numel(c, i) * sizeof(float));
    gpt2_forward(m, s->x, s->y, s->B, s->T);
    double max_err = 0.0;
    for (size_t i = 0; i < BT; i++) {
        for (int v = 0; v < s->V; v++) {
            double e = fabs(m->acts.logits[i * s->Vp + v] - s->logits[i * s->Vp + v]);
            if (e > max_err) max_err = e;
        }
    }
    report(max_err <= 1e-4, "logits", max_err, 1e-4);
    double loss_err = fabs(m->mean_loss - s->loss);
    report(loss_err <= 1e-5, "loss", loss_err, 1e-5);
    gpt2_backward(m, 1.0f / (float)BT);
    size_t* file_offsets = (size_t*)mallocCheck(m->num_tensors * sizeof(size_t));
    int* by_file = (int*)mallocCheck(m->num_tensors * sizeof(int));
    for (int i = 0; i < m->num_tensors; i++) by_file[gpt2_file_index(c, i)] = i;
    size_t off = 0;
    for (int k = 0; k < m->num_tensors; k++) {
        file_offsets[by_file[k]] = off;
        off += gpt2_tensor_numel(c, by_file[k]);
    }
    int grads_ok = 1;
    double worst = 0.0;
    for (int i = 0; i < m->num_tensors; i++) {
        size_t n = gpt2_tensor_numel(c, i);
        const float* expect = s->grads + file_offsets[i];
        double maxmag = 0.0, err = 0.0;
        for (size_t j = 0; j < n; j++) {
            maxmag = fmax(maxmag, fabs(expect[j]));
            err = fmax(err, fabs(m->grad[i][j] - expect[j]));
        }
        double rel = maxmag > 0 ? err / maxmag : err;
        worst = fmax(worst, rel);
        if (rel > 1e-3) {
            char name[64];
            printf("  gradient %s: max abs err %.3e, largest magnitude %.3e\n", gpt2_tensor_name(c, i, name, 64), err,
                   maxmag);
            grads_ok = 0;
        }
    }
    report(grads_ok, "gradients (worst tensor, relative)", worst, 1e-3);
    free(file_offsets);
    free(by_file);
}

// Bitwise comparison of every rank's parameters with rank 0's.
static void check_replicas_identical(Trainer* tr) {
    GPT2* m = &tr->model;
    const GPT2Config* c = &m->config;
    int same = 1;
    for (int i = 0; i < m->num_tensors; i++) {
        size_t n = gpt2_tensor_numel(c, i);
        float* mine = (float*)mallocCheck(n * sizeof(float));
        memcpy(mine, m->param[i], n * sizeof(float));
        mpiCheck(MPI_Bcast(mine, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD));
        if (memcmp(mine, m->param[i], n * sizeof(float)) != 0) same = 0;
        free(mine);
    }
    int all_same = same;
    mpiCheck(MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    report(all_same, "parameters bitwise identical on all ranks", all_same ? 0.0 : 1.0, 0.0);
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    utils_set_rank(rank, world);
    if (argc < 3) fatal("usage: %s MODEL.bin STATE.bin [trainer flags]", argv[0]);

    GPT2Config mc;
    int version;
    float* dense = gpt2_model_file_read(argv[1], &mc, &version);
    free(dense);
    OracleState s;
    read_state(argv[2], &mc, &s);

    int k = 1, first_flag = 2;
    if (argc > 4 && strcmp(argv[3], "--accum") == 0) {
        k = atoi(argv[4]);
        if (k < 1) fatal("--accum expects a positive count");
        first_flag = 4;
    }
    TrainConfig cfg;
    train_config_defaults(&cfg, 0);
    train_parse_args(&cfg, argc - first_flag, argv + first_flag);
    if (s.B % (world * k) != 0) fatal("the oracle batch B=%d does not split over %d ranks x %d micro-steps", s.B, world, k);
    cfg.model = argv[1];
    cfg.B = s.B / (world * k);
    cfg.T = s.T;
    cfg.total_batch_tokens = cfg.B * cfg.T * world * k;
    cfg.lr = s.lr;
    cfg.beta1 = s.beta1;
    cfg.beta2 = s.beta2;
    cfg.eps = s.eps;
    cfg.weight_decay = s.weight_decay;
    cfg.grad_clip = s.grad_clip;
    if (rank == 0) {
        printf("oracle test: %s, %d ranks x %d micro-steps x B=%d, T=%d, -z %d\n", argv[1], world, k, cfg.B, cfg.T,
               cfg.zero_stage);
    }

    Trainer tr;
    if (world == 1 && k == 1) {
        // Gradients are compared before any reduction, on a plain replicated trainer.
        TrainConfig plain = cfg;
        plain.zero_stage = 0;
        plain.param_dtype = DTYPE_FP32;
        plain.grad_dtype = DTYPE_FP32;
        trainer_init_with(&tr, &plain, rank, world, 0);
        check_forward_backward(&tr, &s);
        trainer_free(&tr);
    }

    trainer_init(&tr, &cfg, rank, world);
    SliceCtx slice = {&s, rank, world, cfg.B};
    double worst_loss = 0.0;
    int losses_ok = 1;
    for (int step = 0; step < s.steps; step++) {
        StepResult r = trainer_step(&tr, step, s.lr, slice_batch, &slice);
        double e = fabs(r.loss - s.step_losses[step]);
        worst_loss = fmax(worst_loss, e);
        if (e > 1e-4) losses_ok = 0;
        if (rank == 0) {
            printf("  step %d: loss %.6f (oracle %.6f), norm %.5f (oracle %.5f)\n", step, r.loss, s.step_losses[step],
                   r.grad_norm, s.step_norms[step]);
        }
    }
    report(losses_ok, "step losses", worst_loss, 1e-4);
    trainer_sync_params(&tr);
    if (world > 1) check_replicas_identical(&tr);
    trainer_free(&tr);
    if (rank == 0) printf("%s\n", failures ? "FAIL test_gpt2" : "PASS test_gpt2");
    MPI_Finalize();
    return failures ? 1 : 0;
}
