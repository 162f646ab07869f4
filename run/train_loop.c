// run/train_loop.c: what run/train_loop.h declares.
#include "run/train_loop.h"

void mpi_start(int* argc, char*** argv, int* rank, int* world) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    utils_set_rank(*rank, *world);
}

double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int step_gate_skip(void* ctx, float grad_norm) {
    StepGate* g = (StepGate*)ctx;
    StepResult* r = g->result;
    if (g->loss_now) r->loss = g->loss_now(g->loss_ctx);
    r->nonfinite = (isfinite(r->loss) ? 0 : STEP_NONFINITE_LOSS) | (isfinite(grad_norm) ? 0 : STEP_NONFINITE_NORM);
    if (r->nonfinite) {
        r->skipped = 1;
    } else if (g->state) {
        r->skipped = outlier_step(g->state, r->loss, grad_norm, g->loss_z_max, g->norm_z_max, &r->z_loss, &r->z_norm);
    }
    return r->skipped;
}

const UpdateGate* step_gate_begin(StepGate* g, UpdateGate* gate, OutlierState* state,
                                  const TrainConfig* cfg, StepResult* r, float (*loss_now)(void*),
                                  void* loss_ctx) {
    *g = (StepGate){state, cfg->skip_loss_z, cfg->skip_norm_z, loss_now, loss_ctx, r};
    r->z_loss = r->z_norm = NAN;
    *gate = (UpdateGate){step_gate_skip, g};
    return gate;
}

int model_descriptor(const char* model, GPT2Config* mc) {
    int r = gpt2_config_from_descriptor(model, DESCRIPTOR_VOCAB, DESCRIPTOR_MAX_SEQ_LEN, mc);
    if (r == -2) {
        fatal("-e %s: a descriptor dN (a random GPT-2 of depth N; d12 is the 124M model) takes N from 1 to %d",
              model, GPT2_MAX_DESCRIPTOR_DEPTH);
    }
    if (r == 0) gpt2_config_check(mc, model);
    return r == 0;
}

void model_shape_of(const char* model, GPT2Config* mc) {
    if (!model_descriptor(model, mc)) {
        gpt2_model_file_shape(model, mc);
    }
}

float* load_initial_weights(const TrainConfig* cfg, GPT2Config* mc) {
    if (cfg->resume) {
        model_shape_of(cfg->model, mc);
        return NULL;
    }
    if (model_descriptor(cfg->model, mc)) {
        float* dense = (float*)mallocCheck(gpt2_num_parameters(mc) * sizeof(float));
        gpt2_init_random(mc, dense, (uint64_t)cfg->seed);
        return dense;
    }
    int version;
    float* dense = gpt2_model_file_read(cfg->model, mc, &version);
    gpt2_dense_check_finite(mc, dense, cfg->model, "a model with non-finite weights cannot train");
    return dense;
}

int check_run_config(const TrainConfig* cfg, const GPT2Config* mc, int world, int have_plugin,
                     const char* rebuild) {
    if (cfg->T > mc->max_seq_len) fatal("-t %d exceeds the model's maximum sequence length %d", cfg->T, mc->max_seq_len);
    long long per_micro = (long long)cfg->B * cfg->T * world;
    if (cfg->total_batch_tokens != -1 && (cfg->total_batch_tokens <= 0 || cfg->total_batch_tokens % per_micro != 0)) {
        fatal("-d %d is not a positive multiple of B*T*ranks = %d*%d*%d = %lld", cfg->total_batch_tokens, cfg->B,
              cfg->T, world, per_micro);
    }
    if (!have_plugin) {
        const char* needs = cfg->zero_stage == 1                ? "-z 1 needs"
                            : cfg->grad_dtype != DTYPE_FP32     ? "--grad-dtype bf16 needs"
                            : cfg->trace_file                   ? "--trace needs"
                            : cfg->average_in_collective        ? "--average-in-collective needs"
                            : cfg->dist_opt_instances > 1       ? "--dist-opt-instances needs"
                            : cfg->dp_invariant                 ? "--dp-invariant needs"
                                                                : NULL;
        if (needs) fatal("%s the zero1/ plugin: rebuild with `%s`", needs, rebuild);
    }
    if ((cfg->checkpoint_every > 0 || cfg->resume_asked || cfg->start_over) && cfg->output_dir == NULL) {
        fatal("checkpoints (-n, -nk, -y, --start-over) live in the output directory: give one with -o");
    }
    int micro_steps = train_micro_steps(cfg, world);
    if (cfg->dp_invariant) dp_invariant_check(cfg, world, micro_steps);
    return micro_steps;
}

float step_loss_scale(const TrainConfig* cfg, int micro_steps, int world) {
    return 1.0f / ((float)cfg->B * cfg->T * micro_steps * (cfg->average_in_collective ? 1 : world));
}

void loader_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    DataLoader* d = (DataLoader*)ctx;
    dataloader_next_batch(d);
    *inputs = d->inputs;
    *targets = d->targets;
}

void fixed_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    DataLoader* d = (DataLoader*)ctx;
    *inputs = d->inputs;
    *targets = d->targets;
}

int all_ranks_equal(uint64_t mine, int world) {
    uint64_t* all = (uint64_t*)mallocCheck((size_t)world * sizeof(uint64_t));
    mpi_allgather_deadline(&mine, all, 1, MPI_UINT64_T, "replica check", -1);
    int same = 1;
    for (int r = 0; r < world; r++) same &= all[r] == all[0];
    free(all);
    return same;
}

// Samples the next token from the first V logits (softmax computed in place).
static int sample_from_logits(float* logits, int V, float coin) {
    float maxv = -INFINITY, sum = 0.0f;
    for (int v = 0; v < V; v++) maxv = fmaxf(maxv, logits[v]);
    for (int v = 0; v < V; v++) sum += (logits[v] = expf(logits[v] - maxv));
    for (int v = 0; v < V; v++) logits[v] /= sum;
    return sample_from_probs(logits, V, coin);
}

void print_sample(void* ctx, void (*next_logits)(void* ctx, const int* tokens, int n, float* logits),
                  const GPT2Config* c, int T, int gen_tokens, int rank, const Tokenizer* tok,
                  uint64_t* rng_state) {
    int* tokens = (int*)mallocCheck((size_t)T * sizeof(int));
    float* logits = (float*)mallocCheck((size_t)c->padded_vocab_size * sizeof(float));
    int eot = tok->init_ok ? (int)tok->eot_token : 50256;
    tokens[0] = eot < c->vocab_size ? eot : 0;
    if (rank == 0) printf("generating:\n---\n");
    int len = 1;
    for (int i = 0; i < gen_tokens; i++) {
        next_logits(ctx, tokens, len, logits);
        int next = sample_from_logits(logits, c->vocab_size, rng_f32(rng_state));
        if (len == T) {  // slide the context window
            memmove(tokens, tokens + 1, (size_t)(T - 1) * sizeof(int));
            len--;
        }
        tokens[len++] = next;
        if (rank == 0) {
            if (tok->init_ok) tokenizer_print(tok, (uint32_t)next);
            else printf("%d ", next);
            fflush(stdout);
        }
    }
    if (rank == 0) printf("\n---\n");
    free(tokens);
    free(logits);
}

// The tokenizer for samples: --tokenizer's file, or where the flag was not given the
// corpus's own gpt2_tokenizer.bin beside the first train shard (prepro_corpus writes one
// there), else the default in data/.
static const char* run_tokenizer_path(const TrainConfig* cfg, const DataLoader* train, char* buf, size_t n) {
    if (cfg->tokenizer_path != TRAIN_DEFAULT_TOKENIZER) return cfg->tokenizer_path;
    const char* shard = train->files.gl_pathv[0];
    const char* slash = strrchr(shard, '/');
    path_format(buf, n, "%.*s/gpt2_tokenizer.bin", slash ? (int)(slash - shard) : 1, slash ? shard : ".");
    return access(buf, F_OK) == 0 ? buf : cfg->tokenizer_path;
}

void run_io_open(RunIO* io, const TrainConfig* cfg, int rank, int world, int vocab_size,
                 int grad_accum_steps) {
    memset(io, 0, sizeof(*io));
    dataloader_init(&io->train, cfg->train_pattern, cfg->B, cfg->T, rank, world, vocab_size);
    if (cfg->shuffle) dataloader_shuffle(&io->train, (uint64_t)cfg->seed, (size_t)world * cfg->B * grad_accum_steps);
    if (cfg->dp_invariant) dataloader_rank_major(&io->train, grad_accum_steps);
    dataloader_trace(&io->train);
    dataloader_identity(&io->train, &io->train_identity);
    outlier_state_init(&io->outliers, cfg->outlier_window);
    io->has_val = cfg->val_every > 0;
    if (io->has_val) dataloader_init(&io->val, cfg->val_pattern, cfg->B, cfg->T, rank, world, vocab_size);
    io->has_hellaswag = cfg->hellaswag;
    if (io->has_hellaswag) {  // every rank reads and checks it: a bad file stops every rank here
        hellaswag_read(&io->hellaswag, cfg->hellaswag_path, vocab_size);
        hellaswag_check_fits(&io->hellaswag, cfg->T);
        if (rank == 0) printf("hellaswag: %s, %d items\n", cfg->hellaswag_path, io->hellaswag.num_items);
    }
    if (cfg->sample_every > 0) {
        char beside_shards[PATH_MAX_LEN];
        tokenizer_init(&io->tok, run_tokenizer_path(cfg, &io->train, beside_shards, sizeof(beside_shards)));
    }
    logger_init(&io->logger, cfg->output_dir, rank);
    if (rank == 0 && cfg->output_dir && !cfg->resume) checkpoint_claim_output_dir(cfg->output_dir, cfg->resume_asked, cfg->start_over);
    logger_open(&io->logger, cfg->resume);
}

void run_io_close(RunIO* io) {
    logger_close(&io->logger);
    tokenizer_free(&io->tok);
    dataloader_free(&io->train);
    if (io->has_val) dataloader_free(&io->val);
    if (io->has_hellaswag) hellaswag_free(&io->hellaswag);
}
