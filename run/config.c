// run/config.c: what run/config.h declares.
#include "run/config.h"

#include <ctype.h>

const char* const TRAIN_DEFAULT_TOKENIZER = "data/gpt2_tokenizer.bin";

const OptionSpec TRAIN_OPTIONS[] = {
    {"-i", "--train-data", OPT_STR, CLI_FIELD(train_pattern), 0, 0, "train token shards (glob pattern)"},
    {"-j", "--val-data", OPT_STR, CLI_FIELD(val_pattern), 0, 0, "validation token shards (glob pattern)"},
    {NULL, "--allow-train-val-overlap", OPT_FLAG, CLI_FIELD(allow_train_val_overlap), 0, 0,
     "let -i and -j read the same shard (validation on training data, on purpose)"},
    {"-e", "--model", OPT_STR, CLI_FIELD(model), 0, 0, "llm.c model file, or dN for a random GPT-2 of depth N"},
    {"-o", "--output-dir", OPT_STR, CLI_FIELD(output_dir), 0, 0, "directory for main.log and checkpoints"},
    {NULL, "--tokenizer", OPT_STR, CLI_FIELD(tokenizer_path), 0, 0,
     "llm.c tokenizer file, for printing samples (not given: the gpt2_tokenizer.bin beside the train shards, if there "
     "is one)"},
    {"-b", "--batch-size", OPT_INT, CLI_FIELD(B), 1, 1 << 20, "micro-batch size per rank (sequences)"},
    {"-t", "--seq-len", OPT_INT, CLI_FIELD(T), 1, 1 << 20, "sequence length (<= the model's maxT)"},
    {"-d", "--total-batch", OPT_INT, CLI_FIELD(total_batch_tokens), -1, INT_MAX,
     "tokens per optimizer step, a multiple of B*T*ranks (-1: B*T*ranks)"},
    {"-x", "--max-steps", OPT_INT, CLI_FIELD(max_steps), -1, INT_MAX, "optimizer steps (-1: one pass over the data)"},
    {"-l", "--lr", OPT_FLOAT, CLI_FIELD(lr), 0, 10, "peak learning rate"},
    {"-u", "--warmup", OPT_INT, CLI_FIELD(warmup_steps), 0, INT_MAX, "linear warmup steps"},
    {"-q", "--final-lr-frac", OPT_FLOAT, CLI_FIELD(final_lr_fraction), 0, 1,
     "cosine decay ends at lr * this (1: constant)"},
    {"-c", "--weight-decay", OPT_FLOAT, CLI_FIELD(weight_decay), 0, 10, "AdamW weight decay (2-D tensors only)"},
    {"-v", "--val-every", OPT_INT, CLI_FIELD(val_every), 0, INT_MAX, "validation loss every N steps (0: never)"},
    {"-m", "--val-steps", OPT_INT, CLI_FIELD(val_steps), 1, INT_MAX,
     "validation batches per evaluation: global B x T batches split over the ranks (at most the val split's)"},
    {"-H", "--hellaswag", OPT_INT, CLI_FIELD(hellaswag), 0, 1,
     "1: HellaSwag-style accuracy at every validation point (-v) and at the end (llm.c's -h 1 works too)"},
    {NULL, "--hellaswag-file", OPT_STR, CLI_FIELD(hellaswag_path), 0, 0,
     "the eval file for -H 1, llm.c's format (llm.c's hellaswag.py writes hellaswag_val.bin)"},
    {NULL, "--hellaswag-dump", OPT_STR, CLI_FIELD(hellaswag_dump), 0, 0,
     "with -H 1: write every item's 4 completion losses to FILE (rank 0, at each evaluation)"},
    {"-s", "--sample-every", OPT_INT, CLI_FIELD(sample_every), 0, INT_MAX, "print a sample every N steps (0: never)"},
    {"-g", "--gen-tokens", OPT_INT, CLI_FIELD(gen_tokens), 1, 1 << 16, "tokens per sample"},
    {"-n", "--checkpoint-every", OPT_INT, CLI_FIELD(checkpoint_every), 0, INT_MAX,
     "checkpoint every N steps (and at the end) into -o (0: never)"},
    {"-nk", "--checkpoints-keep", OPT_INT, CLI_FIELD(checkpoints_keep), 0, INT_MAX,
     "keep the newest N checkpoints, removing older ones once a newer one is complete (0: keep all)"},
    {NULL, "--async-save", OPT_INT, CLI_FIELD(async_save), 0, 1,
     "1: a checkpoint is copied to host memory and written by a background thread while training goes on (one in "
     "flight; committed the same way)"},
    {"-y", "--resume", OPT_INT, CLI_FIELD(resume), 0, 1,
     "1: resume from the newest checkpoint in -o (any rank count; none yet: start at step 0)"},
    {NULL, "--allow-resume-change", OPT_FLAG, CLI_FIELD(allow_resume_change), 0, 0,
     "with -y 1: continue even if the tokens per step, -t, -a, the schedule or AdamW's settings differ from the "
     "checkpoint's"},
    {NULL, "--allow-corpus-change", OPT_FLAG, CLI_FIELD(allow_corpus_change), 0, 0,
     "with -y 1: continue even if the train data (-i) is not the corpus the checkpoint was trained on"},
    {NULL, "--start-over", OPT_FLAG, CLI_FIELD(start_over), 0, 0,
     "a fresh run (no -y 1) into an -o that holds another run's checkpoints or main.log: remove them first (without "
     "it, such an -o is refused)"},
    {"-z", "--zero-stage", OPT_INT, CLI_FIELD(zero_stage), 0, 1, "0: replicated AdamW, 1: ZeRO-1 (zero1/ plugin)"},
    {"-w", "--master-weights", OPT_INT, CLI_FIELD(master_weights), 1, 1,
     "llm.c's master-weights flag, accepted so that llm.c command lines run: only 1 (fp32 master weights are always "
     "kept)"},
    {"-a", "--overfit-single-batch", OPT_INT, CLI_FIELD(overfit_single_batch), 0, 1, "1: train on one batch only"},
    {NULL, "--beta1", OPT_FLOAT, CLI_FIELD(beta1), 0, 0.999999, "AdamW beta1"},
    {NULL, "--beta2", OPT_FLOAT, CLI_FIELD(beta2), 0, 0.999999, "AdamW beta2"},
    {NULL, "--eps", OPT_FLOAT, CLI_FIELD(eps), 1e-30, 1, "AdamW epsilon"},
    {NULL, "--grad-clip", OPT_FLOAT, CLI_FIELD(grad_clip), 0, 1e30, "clip the global grad norm to this (0: off)"},
    {NULL, "--seed", OPT_INT, CLI_FIELD(seed), 0, INT_MAX, "seed for init, sampling and --shuffle"},
    {NULL, "--shuffle", OPT_FLAG, CLI_FIELD(shuffle), 0, 0,
     "permute the train shards, and the rows of T tokens in each, every epoch (from --seed; resumable)"},
    {NULL, "--skip-batches", OPT_STR, CLI_FIELD(skip_batches), 0, 0,
     "A-B (or A): do not train on the global batches that steps A to B would read; step A reads what step B+1 would "
     "have (the data a run diverged on; recorded in checkpoints)"},
    {NULL, "--bucket-size", OPT_BUCKET, CLI_FIELD(bucket_size), 0, 0,
     "ZeRO-1 bucket size in elements, or none (default max(40M, 1M*DP), DP all data-parallel ranks; one bucket "
     "with --no-overlap-grad-reduce)"},
    {NULL, "--pad-busbw", OPT_FLAG, CLI_FIELD(pad_busbw), 0, 0, "pad buckets to lcm(DP,128,65536) for NCCL bus bandwidth"},
    {NULL, "--no-overlap-grad-reduce", OPT_NOFLAG, CLI_FIELD(overlap_grad_reduce), 0, 0,
     "reduce-scatter after backward instead of during it, as one bucket"},
    {NULL, "--no-overlap-param-gather", OPT_NOFLAG, CLI_FIELD(overlap_param_gather), 0, 0,
     "all-gather synchronously after the update instead of during the next forward"},
    {NULL, "--check-nan", OPT_FLAG, CLI_FIELD(check_nan), 0, 0,
     "stop at the first non-finite gradient, naming its parameter (costs a scan per step)"},
    {NULL, "--exit-signal-handler", OPT_INT, CLI_FIELD(exit_signal_handler), 0, 1,
     "1: on SIGTERM or SIGINT every rank finishes its step, saves a checkpoint in -o and exits 128 + the signal (a "
     "second signal ends at once); 0: the signals end the job at once"},
    {NULL, "--exit-duration-in-mins", OPT_FLOAT, CLI_FIELD(exit_duration_mins), 0, 1e9,
     "end the run with a checkpoint in -o after the first step that ends this many minutes after the start "
     "(0: never)"},
    {NULL, "--max-nonfinite-steps", OPT_INT, CLI_FIELD(max_nonfinite_steps), 0, INT_MAX,
     "a step whose loss or grad norm is not finite is skipped; more than N such steps in a row stop the run (0: stop "
     "at the first)"},
    {NULL, "--trace", OPT_STR, CLI_FIELD(trace_file), 0, 0, "write a Chrome trace per rank to FILE.rankN.json"},
    {NULL, "--trace-every", OPT_INT, CLI_FIELD(trace_every), 1, INT_MAX,
     "with --trace: rewrite the trace files every K steps, atomically (a killed run leaves the steps up to the last "
     "rewrite)"},
    {NULL, "--trace-steps", OPT_STR, CLI_FIELD(trace_steps), 0, 0,
     "with --trace: A-B (or A), record only steps A to B (1-based, as the step lines count)"},
    {NULL, "--tensorboard", OPT_INT, CLI_FIELD(tensorboard), 0, 1,
     "1: rank 0 writes TensorBoard event files (the step line's figures, val loss) into --tensorboard-dir; 0: none"},
    {NULL, "--tensorboard-dir", OPT_STR, CLI_FIELD(tensorboard_dir), 0, 0,
     "directory of the TensorBoard event files (created if missing; none given: -o); one run's: a fresh run removes "
     "the event files already there, a resume the events it repeats"},
    {NULL, "--straggler-every", OPT_INT, CLI_FIELD(straggler_every), 0, INT_MAX,
     "every N steps gather each rank's busy and comm-wait times: min, median, max and the slowest rank in main.log "
     "and TensorBoard (0: never)"},
    {NULL, "--param-dtype", OPT_DTYPE, CLI_FIELD(param_dtype), 0, 0, "fp32|bf16 storage of the param buffer"},
    {NULL, "--stochastic-rounding", OPT_FLAG, CLI_FIELD(stochastic_rounding), 0, 0,
     "round the fp32 master into the bf16 params stochastically after each AdamW step (unbiased; the bits depend only "
     "on --seed, the step and the element, so any DP, bucket size or resume gives the same weights)"},
    {NULL, "--grad-dtype", OPT_DTYPE, CLI_FIELD(grad_dtype), 0, 0, "fp32|bf16 grad buffer / reduction dtype"},
    {NULL, "--fp32-accumulation", OPT_FLAG, CLI_FIELD(fp32_accumulation), 0, 0,
     "with --grad-dtype bf16 and -z 1: send bf16 (all-to-all), sum each rank's shard in fp32 in rank order"},
    {NULL, "--average-in-collective", OPT_FLAG, CLI_FIELD(average_in_collective), 0, 0,
     "the gradient reductions average over the ranks (ncclAvg) instead of each rank scaling by 1/ranks"},
    {"-sl", "--skip-loss-z", OPT_FLOAT, CLI_FIELD(skip_loss_z), 0, 1e6,
     "skip the update when the loss's z-score over the last --outlier-window steps exceeds this (0: off)"},
    {"-sg", "--skip-norm-z", OPT_FLOAT, CLI_FIELD(skip_norm_z), 0, 1e6,
     "skip the update when the grad norm's z-score over the last --outlier-window steps exceeds this (0: off)"},
    {NULL, "--outlier-window", OPT_INT, CLI_FIELD(outlier_window), 2, OUTLIER_MAX_WINDOW,
     "steps whose losses and grad norms -sl/-sg compare with"},
    {NULL, "--spike-loss-factor", OPT_FLOAT, CLI_FIELD(spike_loss_factor), 0, 1e6,
     "a loss spike: a loss above this times the median of the last --spike-window good steps' losses; the step is "
     "skipped (0: off, else > 1)"},
    {NULL, "--spike-norm-factor", OPT_FLOAT, CLI_FIELD(spike_norm_factor), 0, 1e6,
     "a grad norm spike: a grad norm above this times the median of the last --spike-window good steps' norms; the "
     "step is skipped (0: off, else > 1)"},
    {NULL, "--spike-window", OPT_INT, CLI_FIELD(spike_window), 1, SPIKE_MAX_WINDOW,
     "good steps (neither a spike nor non-finite) whose median loss and grad norm a step is compared with"},
    {NULL, "--max-spike-steps", OPT_INT, CLI_FIELD(max_spike_steps), 0, INT_MAX,
     "more spike steps than this in one streak of skipped steps stop the run, naming the last checkpoint before it "
     "(0: stop at the first)"},
    {NULL, "--comm-timeout", OPT_FLOAT, CLI_FIELD(comm_timeout), 0, 1e9,
     "seconds a rank waits on any collective before it names it and aborts the job (0: forever, else >= 1)"},
    {NULL, "--dist-opt-instances", OPT_INT, CLI_FIELD(dist_opt_instances), 1, 1 << 20,
     "ZeRO-1 in K groups of ranks/K consecutive ranks: shard within a group, all-reduce shards across groups"},
    {NULL, "--split-embedding", OPT_FLAG, CLI_FIELD(split_embedding), 0, 0,
     "ZeRO-1: reduce wte's classifier gradient as soon as it is final and send the encoder's rows sparsely to their "
     "owners (off: wte's bucket waits for the encoder)"},
    {NULL, "--dp-invariant", OPT_FLAG, CLI_FIELD(dp_invariant), 0, 0,
     "bitwise the same params, optimizer state, loss and grad norm for any split of the step over power-of-two ranks "
     "and micro-steps (same -b, -t, -d, binary, device type and threads per rank): resume or replay at another GPU "
     "count"},
    {NULL, "--comm", OPT_STR, CLI_FIELD(comm_backend), 0, 0,
     "GPU zero1/ communication: auto (NCCL, or MPI staged through host memory when ranks share a GPU), nccl, mpi"},
    {NULL, "--attention", OPT_STR, CLI_FIELD(attention), 0, 0,
     "GPU trainer: flash (default: tiled kernels with an online softmax, tensor cores in BF16; keeps one fp32 "
     "logsumexp per row and layer instead of the (B,NH,T,T) scores and probabilities, recomputes them in the "
     "backward; head size a multiple of 16 up to 128), naive (scores materialised: the reference; any head size), "
     "or cudnn (USE_CUDNN=1 builds)"},
    {"-r", "--recompute", OPT_INT, CLI_FIELD(recompute), 0, 1,
     "GPU trainer: 1 recomputes GELU in the backward instead of keeping its output per layer (less memory)"},
    {NULL, "--fused-kernels", OPT_INT, CLI_FIELD(fused_kernels), 0, 1,
     "GPU trainer: 0 runs the unfused reference kernels (GELU, bias gradients, classifier, residual add as passes "
     "of their own)"},
    {NULL, "--optimizer", OPT_STR, CLI_FIELD(optimizer), 0, 0,
     "adamw, or muon: Muon (llmc/muon.h) on the blocks' 2-D matrices (qkvw, attprojw, fcw, fcprojw), AdamW on the "
     "rest (wte, wpe, biases, LayerNorms); one -l and schedule for both, -c decays the matrices"},
    {NULL, "--muon-momentum", OPT_FLOAT, CLI_FIELD(muon_momentum), 0, 0.999999, "Muon: momentum"},
    {NULL, "--muon-nesterov", OPT_INT, CLI_FIELD(muon_nesterov), 0, 1, "Muon: 1 orthogonalizes the Nesterov look-ahead"},
    {NULL, "--muon-ns-steps", OPT_INT, CLI_FIELD(muon_ns_steps), 1, 100, "Muon: Newton-Schulz iterations"},
    {NULL, "--muon-coefficients", OPT_STR, CLI_FIELD(muon_coefficients), 0, 0,
     "Muon: Newton-Schulz coefficients, simple (one set) or quintic (five sets, cycled)"},
    {NULL, "--muon-scale", OPT_STR, CLI_FIELD(muon_scale), 0, 0,
     "Muon: the update's scale from the matrix shape: spectral sqrt(max(rows,cols)), shape_scaling "
     "sqrt(max(1,rows/cols)), unit_rms_norm sqrt(rows/cols)"},
    {NULL, "--muon-extra-scale", OPT_FLOAT, CLI_FIELD(muon_extra_scale), 0, 1e6, "Muon: a factor on top of the scale"},
    {NULL, "--muon-split-qkv", OPT_INT, CLI_FIELD(muon_split_qkv), 0, 1,
     "Muon: 1 orthogonalizes Q, K and V (qkvw's thirds) separately, as Megatron does"},
    {NULL, "--muon-ns-bf16", OPT_FLAG, CLI_FIELD(muon_ns_bf16), 0, 0,
     "GPU trainer, Muon: Newton-Schulz in bf16 with fp32 accumulation (Megatron's default 'medium' precision)"},
};
const int NUM_TRAIN_OPTIONS = (int)(sizeof(TRAIN_OPTIONS) / sizeof(TRAIN_OPTIONS[0]));

void config_defaults(TrainConfig* c, const TrainerBuild* build) {
    memset(c, 0, sizeof(*c));
    c->train_pattern = "data/tinyshakespeare_train.bin";
    c->val_pattern = "data/tinyshakespeare_val.bin";
    c->model = "d12";
    c->output_dir = NULL;
    c->tokenizer_path = TRAIN_DEFAULT_TOKENIZER;
    c->B = 4;
    c->T = 1024;
    c->total_batch_tokens = -1;
    c->max_steps = -1;
    c->lr = 3e-4f;
    c->warmup_steps = 0;
    c->final_lr_fraction = 1.0f;
    c->weight_decay = 0.0f;
    c->val_every = 20;
    c->val_steps = 20;
    c->hellaswag_path = "dev/data/hellaswag/hellaswag_val.bin";
    c->sample_every = 20;
    c->gen_tokens = 64;
    c->zero_stage = build->has_zero1 ? 1 : 0;
    c->master_weights = 1;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    c->grad_clip = 1.0f;
    c->seed = 42;
    c->bucket_size = -1;
    c->overlap_grad_reduce = 1;
    c->overlap_param_gather = 1;
    c->param_dtype = build->param_dtype;
    c->grad_dtype = DTYPE_FP32;
    c->outlier_window = 128;
    c->max_nonfinite_steps = 3;
    c->exit_signal_handler = 1;
    c->trace_every = TRACE_EVERY_DEFAULT;
    c->spike_loss_factor = 2.0f;  // the defaults' margins: docs/training.md, "Loss spikes"
    c->spike_norm_factor = 10.0f;
    c->spike_window = 16;
    c->max_spike_steps = 3;
    c->comm_timeout = 600.0f;
    c->dist_opt_instances = 1;
    c->comm_backend = "auto";
    c->attention = "flash";
    c->recompute = 1;
    c->fused_kernels = 1;
    c->optimizer = "adamw";
    c->muon_momentum = 0.95f;
    c->muon_ns_steps = 5;
    c->muon_coefficients = "quintic";
    c->muon_scale = "spectral";
    c->muon_extra_scale = 1.0f;
    c->muon_split_qkv = 1;
    c->tensorboard = 1;
    c->straggler_every = 10;
}

const char* cli_value_text(const void* fields, const OptionSpec* o, char* buf, size_t n) {
    const char* field = (const char*)fields + o->offset;
    switch (o->kind) {
        case OPT_INT: snprintf(buf, n, "%d", *(const int*)field); break;
        case OPT_FLOAT: snprintf(buf, n, "%g", *(const float*)field); break;
        case OPT_STR: snprintf(buf, n, "%s", *(const char* const*)field ? *(const char* const*)field : "none"); break;
        case OPT_DTYPE: snprintf(buf, n, "%s", *(const int*)field == DTYPE_BF16 ? "bf16" : "fp32"); break;
        case OPT_BUCKET: {
            long long v = *(const long long*)field;
            if (v < 0) snprintf(buf, n, "auto");
            else if (v == 0) snprintf(buf, n, "none");
            else snprintf(buf, n, "%lld", v);
            break;
        }
        default: buf[0] = '\0';
    }
    return buf;
}

static void cli_print_table(FILE* out, const OptionTable* t) {
    for (int i = 0; i < t->count; i++) {
        const OptionSpec* o = &t->options[i];
        char names[64], value[256];
        int flag = o->kind == OPT_FLAG || o->kind == OPT_NOFLAG;
        if (o->short_name) snprintf(names, sizeof(names), "%s, %s%s", o->short_name, o->long_name, flag ? "" : " V");
        else snprintf(names, sizeof(names), "    %s%s", o->long_name, flag ? "" : " V");
        if (flag) fprintf(out, "  %-32s %s\n", names, o->help);
        else fprintf(out, "  %-32s %s [%s]\n", names, o->help, cli_value_text(t->fields, o, value, sizeof(value)));
    }
}

// tables[0] is TRAIN_OPTIONS; the others are a test binary's.
static void config_print_usage(FILE* out, const char* prog, const OptionTable* tables, int n_tables) {
    fprintf(out, "usage: %s [options]\n", prog);
    for (int t = 0; t < n_tables; t++) cli_print_table(out, &tables[t]);
    fprintf(out, "  %-32s %s\n", "-h, --help", "this help");
}

// The option arg names in the tables (and the struct its offset points into), or NULL.
static const OptionSpec* cli_find_option(const OptionTable* tables, int n_tables, const char* arg,
                                         char** fields) {
    for (int t = 0; t < n_tables; t++) {
        for (int i = 0; i < tables[t].count; i++) {
            const OptionSpec* s = &tables[t].options[i];
            if ((s->short_name && strcmp(arg, s->short_name) == 0) || strcmp(arg, s->long_name) == 0) {
                if (fields) *fields = (char*)tables[t].fields;
                return s;
            }
        }
    }
    return NULL;
}

static double cli_number(const char* flag, const char* value, int integer, double min, double max) {
    char* end = NULL;
    errno = 0;
    double x = integer ? (double)strtoll(value, &end, 10) : strtod(value, &end);
    // strtod and strtoll pass over leading blanks: ' 5' is refused as '5 ' is
    if (end == value || *end != '\0' || errno != 0 || isspace((unsigned char)value[0])) {
        fatal("%s expects %s, got '%s'", flag, integer ? "an integer" : "a number", value);
    }
    if (!(x >= min && x <= max)) {  // NaN too
        if (integer) fatal("%s %s is out of range [%.0f, %.0f]", flag, value, min, max);
        fatal("%s %s is out of range [%g, %g]", flag, value, min, max);
    }
    return x;
}

void cli_choice(const char* flag, const char* value, const char* choices) {
    size_t n = strlen(value);
    for (const char* p = choices; *p;) {
        const char* end = strchr(p, '|');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, value, n) == 0) return;
        p += len + (end ? 1 : 0);
    }
    fatal("%s expects one of %s, got '%s'", flag, choices, value);
}

void config_parse(TrainConfig* c, const OptionTable* extra, int n_extra, int argc, char** argv) {
    if (n_extra > CLI_MAX_EXTRA_TABLES) fatal("config_parse: at most %d extra tables", CLI_MAX_EXTRA_TABLES);
    OptionTable tables[1 + CLI_MAX_EXTRA_TABLES] = {{TRAIN_OPTIONS, NUM_TRAIN_OPTIONS, c}};
    for (int t = 0; t < n_extra; t++) tables[1 + t] = extra[t];
    int n_tables = 1 + n_extra;
    for (int a = 1; a < argc; a++) {
        const char* arg = argv[a];
        // llm.c's "-h 0|1" is its HellaSwag flag: the same as -H here; -h alone (or before
        // another option) is the help, and any other value an error.
        if (strcmp(arg, "-h") == 0 && a + 1 < argc && strcmp(argv[a + 1], "--help") != 0 &&
            strcmp(argv[a + 1], "-h") != 0 && !cli_find_option(tables, n_tables, argv[a + 1], NULL)) {
            const char* value = argv[++a];
            if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0) {
                fatal("-h takes 0 or 1 (llm.c's HellaSwag flag, as -H), got '%s'; -h alone or --help prints the help",
                      value);
            }
            c->hellaswag = value[0] == '1';
            continue;
        }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            if (utils_rank() == 0) config_print_usage(stdout, argv[0], tables, n_tables);
            exit(0);
        }
        char* fields = NULL;
        const OptionSpec* o = cli_find_option(tables, n_tables, arg, &fields);
        if (!o) fatal("unknown option '%s' (see %s -h)", arg, argv[0]);
        char* field = fields + o->offset;
        if (o->kind == OPT_FLAG || o->kind == OPT_NOFLAG) {
            *(int*)field = o->kind == OPT_FLAG;
            continue;
        }
        if (a + 1 >= argc) fatal("%s needs a value (see %s -h)", arg, argv[0]);
        const char* value = argv[++a];
        switch (o->kind) {
            case OPT_INT: *(int*)field = (int)cli_number(arg, value, 1, o->min, o->max); break;
            case OPT_FLOAT: *(float*)field = (float)cli_number(arg, value, 0, o->min, o->max); break;
            case OPT_STR: *(const char**)field = value; break;
            case OPT_DTYPE:
                if (strcmp(value, "fp32") == 0) *(int*)field = DTYPE_FP32;
                else if (strcmp(value, "bf16") == 0) *(int*)field = DTYPE_BF16;
                else fatal("%s expects fp32 or bf16, got '%s'", arg, value);
                break;
            case OPT_BUCKET: {
                char err[256];
                if (zero1_parse_bucket_size(arg, value, (long long*)field, err, sizeof(err)) != 0) fatal("%s", err);
                break;
            }
            default: break;
        }
    }
    if (c->skip_batches && !skip_batches_parse_range(c->skip_batches, &c->skip_from, &c->skip_to)) {
        fatal("--skip-batches expects A-B or A, the 1-based steps whose batches to skip (1 <= A <= B), got '%s'",
              c->skip_batches);
    }
    if (c->trace_steps && !skip_batches_parse_range(c->trace_steps, &c->trace_from, &c->trace_to)) {
        fatal("--trace-steps expects A-B or A, the 1-based steps to record (1 <= A <= B), got '%s'", c->trace_steps);
    }
    c->resume_asked = c->resume;
}

int config_micro_steps(const TrainConfig* c, int world) {
    return c->total_batch_tokens == -1 ? 1 : (int)(c->total_batch_tokens / ((long long)c->B * c->T * world));
}

// What a build without zero1/ cannot do, or NULL.
static const char* config_needs_zero1(const TrainConfig* c, const TrainerBuild* build) {
    return c->zero_stage == 1                                    ? "-z 1 needs"
           : c->grad_dtype != DTYPE_FP32                         ? "--grad-dtype bf16 needs"
           : !build->gpu && c->param_dtype != DTYPE_FP32         ? "--param-dtype bf16 needs"
           : c->trace_file                                       ? "--trace needs"
           : c->average_in_collective                            ? "--average-in-collective needs"
           : c->dist_opt_instances > 1                           ? "--dist-opt-instances needs"
           : c->dp_invariant                                     ? "--dp-invariant needs"
                                                                 : NULL;
}

// The GPU trainer's kernel and communication choices have no CPU counterpart: on the CPU
// trainer a value other than the default would be silently ignored, so it is refused.
static void config_check_gpu_choices(const TrainConfig* c, const TrainerBuild* build) {
    TrainConfig defaults;
    config_defaults(&defaults, build);
    if (!build->gpu) {
        char given[96] = "";
        if (strcmp(c->attention, defaults.attention) != 0) snprintf(given, sizeof(given), "--attention %.60s", c->attention);
        else if (c->recompute != defaults.recompute) snprintf(given, sizeof(given), "-r %d", c->recompute);
        else if (c->fused_kernels != defaults.fused_kernels) snprintf(given, sizeof(given), "--fused-kernels %d", c->fused_kernels);
        if (given[0]) {
            fatal("%s: a choice of the GPU trainer's kernels (train_gpt2cu); the CPU trainer has one implementation of "
                  "each and cannot honour it: leave the option out", given);
        }
        if (strcmp(c->comm_backend, defaults.comm_backend) != 0) {
            fatal("--comm %.60s: a choice of the GPU trainer's communication (train_gpt2cu); the CPU trainer always "
                  "communicates over MPI and cannot honour it: leave the option out", c->comm_backend);
        }
        return;
    }
    if (c->param_dtype != build->param_dtype) {
        const char* precision = build->param_dtype == DTYPE_BF16 ? "BF16" : "FP32";
        fatal("--param-dtype %s: this train_gpt2cu is built with PRECISION=%s (its params are %s)",
              c->param_dtype == DTYPE_BF16 ? "bf16" : "fp32", precision, build->param_dtype == DTYPE_BF16 ? "bf16" : "fp32");
    }
    cli_choice("--attention", c->attention, "flash|naive|cudnn");
    if (strcmp(c->attention, "cudnn") == 0 && build->param_dtype == DTYPE_FP32) {
        fatal("--attention cudnn: cuDNN's attention has no fp32 path; build PRECISION=BF16 USE_CUDNN=1");
    }
    if (strcmp(c->attention, "cudnn") == 0 && !build->has_cudnn) {
        fatal("--attention cudnn needs a build with cuDNN: make train_gpt2cu USE_CUDNN=1");
    }
}

// What --dp-invariant cannot keep the same bits under (the mode and its contract:
// docs/zero1.md): the splits it keeps, one error each.
static void config_check_dp_invariant(const TrainConfig* c, int world, int micro_steps) {
    const char* why =
        c->zero_stage != 1 ? "-z 0 (the mode is ZeRO-1's; -z 1 at one rank is the replicated optimizer anyway)"
        : c->grad_dtype != DTYPE_FP32 ? "--grad-dtype bf16 (a bf16 reduction rounds each partial sum where it lies)"
        : c->average_in_collective ? "--average-in-collective (1/ranks would scale each split differently)"
        : c->split_embedding ? "--split-embedding (its sparse rows are summed in the order of the ranks)"
        : c->dist_opt_instances > 1 ? "--dist-opt-instances (the all-reduce across instances sums in its own order)"
        : c->overfit_single_batch ? "-a 1 (every rank would train on its own first batch)"
                                  : NULL;
    if (why) fatal("--dp-invariant cannot keep the same bits with %s", why);
    int pow2_world = world >= 1 && (world & (world - 1)) == 0;
    int pow2_micro = micro_steps >= 1 && (micro_steps & (micro_steps - 1)) == 0;
    if (!pow2_world || !pow2_micro) {
        fatal("--dp-invariant supports power-of-two ranks with power-of-two micro-steps (1, 2, 4, 8, ... of each, the "
              "same ranks x micro-steps and -b for every split); this run has %d ranks x %d micro-steps", world,
              micro_steps);
    }
}

void config_muon(const TrainConfig* c, MuonConfig* m) {
    m->momentum = c->muon_momentum;
    m->nesterov = c->muon_nesterov;
    m->ns_steps = c->muon_ns_steps;
    m->coefficients = strcmp(c->muon_coefficients, "simple") == 0 ? MUON_COEFFICIENTS_SIMPLE : MUON_COEFFICIENTS_QUINTIC;
    m->scale = strcmp(c->muon_scale, "shape_scaling") == 0   ? MUON_SCALE_SHAPE_SCALING
               : strcmp(c->muon_scale, "unit_rms_norm") == 0 ? MUON_SCALE_UNIT_RMS_NORM
                                                              : MUON_SCALE_SPECTRAL;
    m->extra_scale = c->muon_extra_scale;
    m->split_qkv = c->muon_split_qkv;
}

// --optimizer and the --muon-* flags. ZeRO-1 with Muon is Megatron's layer-wise distributed
// optimizer (zero1/layout_layerwise.h), which has no instances.
static void config_check_optimizer(const TrainConfig* c, const TrainerBuild* build, int world) {
    cli_choice("--optimizer", c->optimizer, "adamw|muon");
    cli_choice("--muon-coefficients", c->muon_coefficients, "simple|quintic");
    cli_choice("--muon-scale", c->muon_scale, "spectral|shape_scaling|unit_rms_norm");
    TrainConfig d;
    config_defaults(&d, build);
    if (!config_uses_muon(c)) {
        MuonConfig given, defaults;
        config_muon(c, &given);
        config_muon(&d, &defaults);
        if (memcmp(&given, &defaults, sizeof(given)) != 0 || c->muon_ns_bf16) {
            fatal("--muon-* flags set Muon, and this run's optimizer is --optimizer %s: add --optimizer muon, or leave "
                  "them out", c->optimizer);
        }
        return;
    }
    if (c->muon_ns_bf16 && !build->gpu) {
        fatal("--muon-ns-bf16: the CPU trainer runs Newton-Schulz in fp32 only (the flag is train_gpt2cu's)");
    }
    if (c->dist_opt_instances > 1) {
        fatal("--optimizer muon with --dist-opt-instances %d: Muon's layer-wise distributed optimizer gives each "
              "matrix one owner among all the ranks (as Megatron's, which refuses instances too)", c->dist_opt_instances);
    }
}

// A factor of 1 or less would call every step that does not improve a spike.
static void config_check_spike_factor(const char* flag, float factor) {
    if (factor != 0.0f && factor <= 1.0f) fatal("%s %g: use 0 (off) or a factor above 1", flag, factor);
}

int config_validate(const TrainConfig* c, const TrainerBuild* build, int world) {
    // A deadline shorter than a healthy collective can take would blame a network fault
    // that does not exist.
    if (c->comm_timeout > 0.0f && c->comm_timeout < CLI_MIN_COMM_TIMEOUT_S) {
        fatal("--comm-timeout %g: use 0 (wait forever) or at least %g s (a working job's collectives can take "
              "that long)", c->comm_timeout, CLI_MIN_COMM_TIMEOUT_S);
    }
    if (c->split_embedding && c->zero_stage != 1) {
        fatal("--split-embedding needs ZeRO-1 (-z 1): it sends the embedding's rows to the owners of its shards");
    }
    if (c->fp32_accumulation && (c->grad_dtype != DTYPE_BF16 || c->zero_stage != 1)) {
        fatal("--fp32-accumulation sums the bf16 slices of a ZeRO-1 reduce-scatter in fp32: it needs --grad-dtype bf16 "
              "and -z 1 (got --grad-dtype %s, -z %d)", c->grad_dtype == DTYPE_BF16 ? "bf16" : "fp32", c->zero_stage);
    }
    if (c->split_embedding && c->dist_opt_instances > 1 && c->grad_dtype == DTYPE_BF16) {
        fatal("--split-embedding: the split embedding with distributed-optimizer instances needs --grad-dtype fp32 (the "
              "rows would have to join a bf16 shard before its all-reduce across instances)");
    }
    if (c->stochastic_rounding && c->param_dtype != DTYPE_BF16) {
        fatal("--stochastic-rounding rounds the fp32 master into bf16 params, and these params are fp32 (train_gpt2: "
              "add --param-dtype bf16; train_gpt2cu: build with PRECISION=BF16)");
    }
    cli_choice("--comm", c->comm_backend, "auto|nccl|mpi");
    if (c->skip_batches && c->overfit_single_batch) {
        fatal("--skip-batches moves past train data, and -a 1 trains on one batch only");
    }
    if (c->start_over && c->resume_asked) {
        fatal("--start-over removes the run in -o to start a fresh one, -y 1 resumes it: give one of the two");
    }
    if ((c->allow_resume_change || c->allow_corpus_change) && !c->resume_asked) {
        fatal("%s allows a change against the checkpoint a resume continues: add -y 1, or leave it out",
              c->allow_resume_change ? "--allow-resume-change" : "--allow-corpus-change");
    }
    if (c->trace_file && c->trace_file[0] == '\0') fatal("--trace '': give the trace files' path prefix (FILE.rankN.json)");
    if (!c->trace_file && (c->trace_steps || c->trace_every != TRACE_EVERY_DEFAULT)) {
        fatal("%s says what --trace FILE records: give --trace too", c->trace_steps ? "--trace-steps" : "--trace-every");
    }
    if (c->trace_steps && c->max_steps > 0 && c->trace_from > c->max_steps) {
        fatal("--trace-steps %s: the run ends at step %d (-x), before step %d: the trace would hold no step",
              c->trace_steps, c->max_steps, c->trace_from);
    }
    if (c->output_dir && c->output_dir[0] == '\0') fatal("-o '': give the output directory");
    if (c->checkpoints_keep > 0 && c->checkpoint_every == 0) {
        fatal("-nk %d keeps the newest of the checkpoints that -n saves in -o: give -n and -o too", c->checkpoints_keep);
    }
    if (c->async_save && c->checkpoint_every == 0) {
        fatal("--async-save 1 writes the checkpoints that -n saves in -o in the background: give -n and -o too");
    }
    config_check_spike_factor("--spike-loss-factor", c->spike_loss_factor);
    config_check_spike_factor("--spike-norm-factor", c->spike_norm_factor);
    config_check_gpu_choices(c, build);
    config_check_optimizer(c, build, world);
    long long per_micro = (long long)c->B * c->T * world;
    if (c->total_batch_tokens != -1 && (c->total_batch_tokens <= 0 || c->total_batch_tokens % per_micro != 0)) {
        fatal("-d %d is not a positive multiple of B*T*ranks = %d*%d*%d = %lld", c->total_batch_tokens, c->B, c->T,
              world, per_micro);
    }
    const char* needs = build->has_zero1 ? NULL : config_needs_zero1(c, build);
    if (needs) fatal("%s the zero1/ plugin: rebuild with `%s`", needs, build->rebuild_with_zero1);
    if ((c->checkpoint_every > 0 || c->resume_asked || c->start_over) && c->output_dir == NULL) {
        fatal("checkpoints (-n, -nk, -y, --start-over) live in the output directory: give one with -o");
    }
    if (c->dist_opt_instances > 1 && world % c->dist_opt_instances != 0) {
        fatal("--dist-opt-instances %d does not divide the %d ranks into equal groups", c->dist_opt_instances, world);
    }
    if (c->dist_opt_instances > 1 && c->zero_stage != 1) {
        fatal("--dist-opt-instances %d needs ZeRO-1 (-z 1): instances split the sharded optimizer state",
              c->dist_opt_instances);
    }
    int micro_steps = config_micro_steps(c, world);
    if (c->dp_invariant) config_check_dp_invariant(c, world, micro_steps);
    return micro_steps;
}

void config_validate_model(const TrainConfig* c, const GPT2Config* mc) {
    if (c->T > mc->max_seq_len) fatal("-t %d exceeds the model's maximum sequence length %d", c->T, mc->max_seq_len);
}

void config_gpt2_kernels(const TrainConfig* c, GPT2Kernels* k) {
    memset(k, 0, sizeof(*k));
    k->attention = strcmp(c->attention, "naive") == 0   ? ATTENTION_NAIVE
                   : strcmp(c->attention, "cudnn") == 0 ? ATTENTION_CUDNN
                                                        : ATTENTION_FLASH;
    k->recompute_gelu = c->recompute;
    k->fused = c->fused_kernels;
}
