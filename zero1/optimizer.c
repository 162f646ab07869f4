/*
 * zero1/optimizer.c: the zero1/ runtime behind run/optimizer.h's table, model-neutral.
 * See zero1/optimizer.h.
 * Errors end the program (fatal), on every rank.
 */
#include "zero1/optimizer.h"

#include <sys/resource.h>

#include "run/files.h"
#include "run/seams.h"
#include "zero1/ledger.h"
#include "zero1/trace.h"

typedef struct {
    Optimizer base;              // first: the table the trainer holds
    TrainConfig cfg;
    Zero1Backend* backend;
    Zero1Runtime* rt;
    Zero1Tracer* tracer;
    size_t* offsets;             // buffer offset of every parameter
    size_t* dense_offsets;       // offset of every parameter in the dense canonical arrays
    size_t model_numel;          // parameters (unpadded)
    int step;                    // of the step in progress (0-based)
    size_t embedding_width;  // the split embedding's row width (host views of its rows)
    double block_start_us;       // host clock (host model)
    Zero1Event block_start;      // device clock (a model queued on a device)
} Zero1Optimizer;

static Zero1Optimizer* impl(Optimizer* o) { return (Zero1Optimizer*)o; }

// Distributed-optimizer instances: groups that each shard the state (1 without cross).
static int instances_of(const Zero1Backend* be) { return be->cross ? be->cross->size : 1; }

// Groups are consecutive ranks, and cross orders the groups by rank.
static int world_rank(const Zero1Optimizer* z) {
    const Zero1Backend* be = z->backend;
    return (be->cross ? be->cross->rank * be->comm->size : 0) + be->comm->rank;
}

// A host model is about to read or write the buffers: what was queued must have run.
static void sync_for_host_model(Zero1Optimizer* z) {
    const Zero1Device* d = &z->backend->device;
    if (z->backend->host_model) d->ops->sync_stream(d->ctx, d->compute);
}

// ---------------------------------------------------------------------------- the model's hooks

// A block's compute span: on the device's clock where the model's work is queued on a
// device, else on the host's.
static void block_begin(Zero1Optimizer* z) {
    if (!z->tracer) return;
    z->block_start_us = zero1_now_us();
    z->block_start = zero1_trace_begin(z->tracer, z->backend->device.compute);
}

static void block_end(Zero1Optimizer* z, const char* what, int block) {
    if (!z->tracer) return;
    if (zero1_tracer_has_device_clock(z->tracer)) {
        zero1_trace_end(z->tracer, TRACE_COMPUTE, z->block_start, z->backend->device.compute, "%s %d", what, block);
    } else {
        zero1_trace(z->tracer, TRACE_COMPUTE, z->block_start_us, zero1_now_us(), "%s %d", what, block);
    }
}

// The two round trips of the runtime (zero1/runtime.h): a forward block waits for its
// params (param sync); each finished gradient contribution may start a bucket's grad sync.
static void hook_forward_begin(void* ctx, int block) {
    Zero1Optimizer* z = (Zero1Optimizer*)ctx;
    zero1_finish_param_sync(z->rt, block);
    sync_for_host_model(z);
    block_begin(z);
}

static void hook_forward_end(void* ctx, int block) { block_end((Zero1Optimizer*)ctx, "forward", block); }

static void hook_backward_begin(void* ctx, int block) {
    Zero1Optimizer* z = (Zero1Optimizer*)ctx;
    zero1_progress(z->rt);
    sync_for_host_model(z);
    block_begin(z);
}

static void hook_backward_end(void* ctx, int block) {
    Zero1Optimizer* z = (Zero1Optimizer*)ctx;
    block_end(z, "backward", block);
    zero1_progress(z->rt);
}

static void hook_grad_ready(void* ctx, int tensor) { zero1_register_grad_ready(((Zero1Optimizer*)ctx)->rt, tensor); }

// The split embedding's compact rows; a host model reaches them through host views once
// the runtime's zero-fill and upload have run.
static float* hook_embedding_grad_rows(void* ctx, int tensor, const int* tokens, int n, const int** row_of_position) {
    Zero1Optimizer* z = (Zero1Optimizer*)ctx;
    float* rows = zero1_embedding_rows(z->rt, tensor, tokens, n, row_of_position);
    if (!rows || !z->backend->host_model) return rows;
    sync_for_host_model(z);
    const Zero1Backend* be = z->backend;
    if (be->host_view) {
        size_t width = z->embedding_width;
        rows = (float*)be->host_view(&be->device, rows, (size_t)n * width * sizeof(float));
        *row_of_position = (const int*)be->host_view(&be->device, *row_of_position, (size_t)n * sizeof(int));
    }
    return rows;
}

// ---------------------------------------------------------------------------- the trace

// --trace FILE: this rank's FILE.rankN.json (a FILE ending in .json loses it first); returns
// the prefix's length.
static int trace_path(const Zero1Optimizer* z, char* path) {
    const char* f = z->cfg.trace_file;
    size_t len = strlen(f);
    if (len > 5 && strcmp(f + len - 5, ".json") == 0) len -= 5;
    path_format(path, PATH_MAX_LEN, "%.*s.rank%d.json", (int)len, f, world_rank(z));
    return (int)len;
}

static void write_trace(Zero1Optimizer* z, int at_end) {
    char path[PATH_MAX_LEN];
    int len = trace_path(z, path);
    zero1_tracer_write(z->tracer, path);
    if (at_end && world_rank(z) == 0) printf("zero1: trace written to %.*s.rank*.json\n", len, z->cfg.trace_file);
}

// The trace's file checked (a bad path stops the job now, not at the first rewrite) and
// every rank's clock measured against rank 0's.
static Zero1Tracer* start_trace(Zero1Optimizer* z) {
    char path[PATH_MAX_LEN];
    trace_path(z, path);
    file_replace_check(path, "--trace");
    Zero1Tracer* t = zero1_tracer_create(world_rank(z));
    double skew_us = seam_trace_clock_skew_us(world_rank(z));
    zero1_tracer_set_clock(t, zero1_trace_clock_sync(skew_us), skew_us);
    if (z->cfg.trace_from) zero1_tracer_set_steps(t, z->cfg.trace_from, z->cfg.trace_to);
    return t;
}

// ---------------------------------------------------------------------------- the table

static void op_load_weights(Optimizer* o, const float* dense) {
    zero1_load_weights(impl(o)->rt, dense, impl(o)->dense_offsets);
}
static void op_begin_step(Optimizer* o, int step) {
    Zero1Optimizer* z = impl(o);
    z->step = step;
    zero1_tracer_step_begin(z->tracer, step + 1, z->backend->device.compute);
    zero1_begin_step(z->rt, step);
}
static void op_begin_micro_step(Optimizer* o, int is_last) { zero1_begin_micro_step(impl(o)->rt, is_last); }
static float op_read_norm(Optimizer* o) {
    Zero1Optimizer* z = impl(o);
    if (z->backend->sync_compute) z->backend->sync_compute(z->backend, z->step + 1);
    return zero1_read_norm(z->rt);
}
// The update gate sees the norm read like every other: under the backend's deadline (a
// stopped peer ends the job instead of hanging the wait).
typedef struct {
    Optimizer* o;
    const UpdateGate* gate;
} GateAtNorm;
static int gate_at_norm(void* ctx) {
    GateAtNorm* g = (GateAtNorm*)ctx;
    return g->gate->skip(g->gate->ctx, op_read_norm(g->o));
}
static void op_finish_step(Optimizer* o, int step, float lr, const UpdateGate* gate, double* blocked_ms) {
    Zero1Optimizer* z = impl(o);
    GateAtNorm g = {o, gate};
    zero1_finish_step(z->rt, step, lr, gate ? gate_at_norm : NULL, &g, blocked_ms);
    zero1_tracer_step_end(z->tracer, z->backend->device.compute);
    // Every rank rewrites its trace at the same steps; the last step of --trace-steps completes it.
    if (z->tracer && ((step + 1) % z->cfg.trace_every == 0 || step + 1 == z->cfg.trace_to)) write_trace(z, 0);
}
static void op_sync_params(Optimizer* o) {
    zero1_sync_params(impl(o)->rt);
    sync_for_host_model(impl(o));
}
static int op_checkpoint_pieces(Optimizer* o, OptimizerPiece* out, int max) {
    Zero1Runtime* rt = impl(o)->rt;
    if (!zero1_holds_checkpoint_pieces(rt)) return 0;  // instances: group 0 saves and loads for all
    int count = zero1_checkpoint_pieces(rt, NULL, 0);
    Zero1Piece* pieces = (Zero1Piece*)mallocCheck((size_t)count * sizeof(Zero1Piece));
    zero1_checkpoint_pieces(rt, pieces, count);
    for (int i = 0; out && i < count && i < max; i++) {
        out[i].param = pieces[i].param;
        out[i].start = pieces[i].range.start;
        out[i].n = pieces[i].range.end - pieces[i].range.start;
    }
    free(pieces);
    return count;
}
static Zero1Range piece_range(const OptimizerPiece* r) {
    Zero1Range range = {r->start, r->start + r->n};
    return range;
}
static Zero1State zero1_state_of(OptimizerState which) {
    return which == OPTIMIZER_M ? ZERO1_STATE_M : which == OPTIMIZER_V ? ZERO1_STATE_V : ZERO1_STATE_MASTER;
}
static void op_read_piece(Optimizer* o, OptimizerState which, const OptimizerPiece* r, float* host) {
    zero1_read_state(impl(o)->rt, zero1_state_of(which), r->param, piece_range(r), host);
}
static void op_write_piece(Optimizer* o, OptimizerState which, const OptimizerPiece* r, const float* host) {
    zero1_write_state(impl(o)->rt, zero1_state_of(which), r->param, piece_range(r), host);
}
static void op_finish_import(Optimizer* o, int steps_done) {
    zero1_share_state_across(impl(o)->rt);
    zero1_finish_import(impl(o)->rt, steps_done);
}
static size_t op_state_bytes(const Optimizer* o) { return zero1_state_bytes(((const Zero1Optimizer*)o)->rt); }

// Rank 0: the bucket table and the per-rank memory ledger of this run.
// One buffer's ledger of numel elements. muon_owned: Muon's state on that many elements (0:
// AdamW's); extras: the temporaries and split rows, which the run has once.
static void print_ledger(Zero1Optimizer* z, Optimizer* o, size_t numel, int instances, size_t muon_owned, int extras) {
    const TrainConfig* cfg = &z->cfg;
    Zero1Ledger ledger = zero1_ledger_compute_instances(numel, zero1_layout(z->rt)->dp, instances,
                                                        cfg->param_dtype == DTYPE_BF16 ? 2 : 4,
                                                        cfg->grad_dtype == DTYPE_BF16 ? 2 : 4);
    if (muon_owned) zero1_ledger_set_muon_state(&ledger, muon_owned);
    size_t temporaries = extras ? zero1_recv_temporary_bytes(z->rt) : 0, tokens, width, wte_bucket;
    if (cfg->dp_invariant && extras) {
        zero1_ledger_add_dp_invariant(&ledger, config_micro_steps(cfg, o->world), temporaries / 8);
    } else if (temporaries) {
        zero1_ledger_add_recv_temporaries(&ledger, temporaries / 4);
    }
    if (extras && zero1_split_shape(z->rt, &tokens, &width, &wte_bucket)) {
        zero1_ledger_add_split(&ledger, tokens, width, wte_bucket);
    }
    zero1_ledger_print(stdout, &ledger);
}

static void op_print_start(Optimizer* o) {
    Zero1Optimizer* z = impl(o);
    const TrainConfig* cfg = &z->cfg;
    if (world_rank(z) != 0) return;
    const Zero1Layout* lay = zero1_layout(z->rt);
    int instances = instances_of(z->backend);
    if (instances > 1) {
        printf("zero1: %d distributed-optimizer instances of %d ranks: reduce-scatter and all-gather inside each, "
               "the shard all-reduced across them\n", instances, z->backend->comm->size);
    }
    char bucket_size[32] = "none";
    if (lay->bucket_size) snprintf(bucket_size, sizeof(bucket_size), "%zu", lay->bucket_size);
    printf("zero1: %s, DP=%d, %d bucket%s (bucket_size %s), param %s, grad reduce %s%s%s, overlap grad %s / "
           "param %s, device %s, comm %s\n",
           cfg->zero_stage == 1 ? "ZeRO-1 sharded optimizer" : "replicated optimizer (bucketed all-reduce)", o->world,
           lay->num_buckets, lay->num_buckets == 1 ? "" : "s", bucket_size,
           cfg->param_dtype == DTYPE_BF16 ? "bf16" : "fp32", cfg->grad_dtype == DTYPE_BF16 ? "bf16" : "fp32",
           cfg->dp_invariant                   ? " in the DP-invariant mode (micro-steps folded pairwise, all-to-all)"
           : zero1_recv_temporary_bytes(z->rt) ? " on the wire (all-to-all), fp32 sums"
                                               : "",
           cfg->average_in_collective ? ", averaged in the collective" : "",
           cfg->overlap_grad_reduce ? "on" : "off", cfg->overlap_param_gather ? "on" : "off",
           z->backend->device.ops->name, z->backend->comm->name);
    if (!cfg->overlap_grad_reduce && cfg->bucket_size > 0) {
        printf("zero1: note: --no-overlap-grad-reduce lays out one bucket, as Megatron does without overlap; "
               "--bucket-size %lld is not used\n", cfg->bucket_size);
    }
    printf("zero1: bucket      start        end   unpadded   padding  params\n");
    for (int b = 0; b < lay->num_buckets; b++) {
        const Zero1Bucket* bk = &lay->buckets[b];
        printf("zero1: %6d %10zu %10zu %10zu %9zu  %d..%d%s\n", b, bk->start, bk->end, bk->numel_unpadded,
               bk->end - bk->start - bk->numel_unpadded, bk->first_param, bk->last_param,
               zero1_bucket_is_muon(lay, b) ? " Muon's matrices, each whole on one rank" : "");
    }
    printf("zero1: buffer %zu elements for %zu parameters (padding and alignment %.3f%%)\n", lay->numel,
           z->model_numel, 100.0 * (double)(lay->numel - z->model_numel) / (double)lay->numel);
    Zero1FullLayout full;
    if (zero1_runtime_full_layout(z->rt, &full) != 0) {
        print_ledger(z, o, lay->numel, instances, 0, 1);
    } else {  // Muon: each buffer its own ledger, the layer-wise one with the busiest rank's state
        printf("zero1: AdamW's buffer (element-wise), %zu elements:\n", full.adamw.numel);
        print_ledger(z, o, full.adamw.numel, instances, 0, 1);
        printf("zero1: Muon's layer-wise buffer, %zu elements, each matrix whole on one rank (ZeRO-1's state: the "
               "rank that owns the most):\n", full.layerwise.numel);
        print_ledger(z, o, full.layerwise.numel, instances, zero1_layerwise_most_owned(&full.layerwise), 0);
        zero1_full_layout_free(&full);
    }
    checkpoint_print_bound();
}

// rows (host) holds c->size rows of `width` doubles, this rank's at c->rank; afterwards
// every rank's. Through the communicator, so that this file needs no MPI.
static void all_gather_rows(Zero1Optimizer* z, Zero1Comm* c, double* rows, int width) {
    const Zero1Device* dev = &z->backend->device;
    size_t bytes = (size_t)c->size * width * sizeof(double), mine = (size_t)c->rank * width;
    double* host = (double*)dev->ops->alloc_host(dev->ctx, bytes);
    double* buf = (double*)dev->ops->alloc(dev->ctx, bytes);
    memcpy(host + mine, rows + mine, width * sizeof(double));
    dev->ops->from_host(dev->ctx, dev->compute, buf + mine, host + mine, width * sizeof(double));
    zero1_comm_wait(c, zero1_comm_all_gather(c, buf, (size_t)c->size * width, ZERO1_FP64, ZERO1_LABEL_REPORT));
    dev->ops->to_host(dev->ctx, dev->compute, host, buf, bytes);
    dev->ops->sync_stream(dev->ctx, dev->compute);
    dev->ops->free(dev->ctx, buf);
    memcpy(rows, host, bytes);
    dev->ops->free_host(dev->ctx, host);
}

// Every rank's row (state bytes, owned elements, peak RSS), in world rank order: within
// the group, then (instances) the groups' tables across them.
static double* gather_rows(Zero1Optimizer* z, const double* mine, int width) {
    Zero1Comm* comm = z->backend->comm;
    int group = instances_of(z->backend) > 1 ? z->backend->cross->rank : 0;
    size_t group_width = (size_t)comm->size * width;
    double* rows = (double*)mallocCheck((size_t)z->base.world * width * sizeof(double));
    double* group_rows = rows + group * group_width;
    memcpy(group_rows + (size_t)comm->rank * width, mine, width * sizeof(double));
    all_gather_rows(z, comm, group_rows, width);
    if (instances_of(z->backend) > 1) all_gather_rows(z, z->backend->cross, rows, (int)group_width);
    return rows;
}

static void op_print_end(Optimizer* o) {
    Zero1Optimizer* z = impl(o);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double mine[3] = {(double)zero1_state_bytes(z->rt), (double)zero1_owned_numel(z->rt),
                      (double)ru.ru_maxrss * 1024.0};
    double* all = gather_rows(z, mine, 3);
    if (world_rank(z) == 0) {
        printf("zero1: rank  owned elements  optimizer state bytes  bytes/element  peak RSS MiB\n");
        double owned_total = 0.0;
        for (int r = 0; r < o->world; r++) {
            double* row = all + 3 * r;
            owned_total += row[1];
            printf("zero1: %4d %15.0f %22.0f %14.1f %13.1f\n", r, row[1], row[0], row[1] > 0 ? row[0] / row[1] : 0.0,
                   row[2] / (1024.0 * 1024.0));
        }
        // Each group shards the buffer; replicated, every rank owns it all.
        size_t numel = zero1_layout(z->rt)->numel;
        int sharded = z->cfg.zero_stage == 1 || o->world == 1;
        int instances = instances_of(z->backend);
        if (sharded && instances > 1) {
            printf("zero1: owned elements over all ranks %.0f (buffer %zu x %d instances)\n", owned_total, numel,
                   instances);
        } else {
            printf("zero1: owned elements over all ranks %.0f (buffer %zu)\n", owned_total,
                   sharded ? numel : numel * (size_t)o->world);
        }
    }
    free(all);
    size_t rows = zero1_embedding_rows_sent(z->rt);
    if (z->cfg.split_embedding && world_rank(z) == 0 && z->step >= 0) {
        double per_step = (double)rows / (z->step + 1);
        printf("zero1: split embedding: rank 0 sent %.1f rows per step to other ranks (%.1f KiB per step)\n", per_step,
               per_step * z->embedding_width * sizeof(float) / 1024.0);
    }
    if (z->tracer) write_trace(z, 1);
}

static void op_destroy(Optimizer* o) {
    Zero1Optimizer* z = impl(o);
    zero1_runtime_destroy(z->rt);
    zero1_tracer_destroy(z->tracer);  // its device events go before the device
    Zero1Backend* be = z->backend;
    if (be->cross) zero1_comm_destroy(be->cross);
    zero1_comm_destroy(be->comm);
    if (be->destroy_device) be->destroy_device(&be->device);
    free(be);
    free(z->offsets);
    free(z->dense_offsets);
    free(z);
}

// ---------------------------------------------------------------------------- creation

int zero1_instance_group_size(const TrainConfig* cfg, int world) {
    int k = cfg->dist_opt_instances;
    if (k == 1) return world;
    if (world % k != 0) fatal("--dist-opt-instances %d does not divide the %d ranks into equal groups", k, world);
    if (cfg->zero_stage != 1) {
        fatal("--dist-opt-instances %d needs ZeRO-1 (-z 1): instances split the sharded optimizer state", k);
    }
    return world / k;
}

static Zero1Options options_from(const TrainConfig* cfg, const Zero1ModelSpec* spec, Zero1Dtype compute_dtype,
                                  int world) {
    Zero1Options opt;
    memset(&opt, 0, sizeof(opt));
    opt.zero_stage = cfg->zero_stage;
    opt.bucket_size = cfg->bucket_size;
    opt.pad_busbw = cfg->pad_busbw;
    // The split embedding needs its tensor in a bucket of its own (Megatron's shared-embedding bucket).
    opt.split_embedding = cfg->split_embedding;
    opt.shared_embedding = cfg->split_embedding ? spec->embedding : -1;
    opt.max_positions = cfg->B * cfg->T;
    opt.overlap_grad_reduce = cfg->overlap_grad_reduce;
    opt.overlap_param_gather = cfg->overlap_param_gather;
    opt.check_nan = cfg->check_nan;
    opt.param_dtype = cfg->param_dtype == DTYPE_BF16 ? ZERO1_BF16 : ZERO1_FP32;
    opt.compute_dtype = compute_dtype;
    opt.grad_dtype = cfg->grad_dtype == DTYPE_BF16 ? ZERO1_BF16 : ZERO1_FP32;
    opt.fp32_accumulation = cfg->fp32_accumulation;
    opt.average_in_collective = cfg->average_in_collective;
    opt.dp_invariant = cfg->dp_invariant;
    opt.micro_steps = config_micro_steps(cfg, world);
    opt.beta1 = cfg->beta1;
    opt.beta2 = cfg->beta2;
    opt.eps = cfg->eps;
    opt.weight_decay = cfg->weight_decay;
    opt.grad_clip = cfg->grad_clip;
    opt.stochastic_rounding = cfg->stochastic_rounding;
    opt.rounding_seed = (uint64_t)cfg->seed;
    opt.muon = config_uses_muon(cfg);
    config_muon(cfg, &opt.muon_config);
    opt.muon_ns_bf16 = cfg->muon_ns_bf16;
    return opt;
}

static const OptimizerOps zero1_ops = {
    op_load_weights, op_begin_step, op_begin_micro_step, op_finish_step, op_read_norm, op_sync_params,
    op_checkpoint_pieces, op_read_piece, op_write_piece, op_finish_import, op_state_bytes, op_print_start,
    op_print_end, op_destroy,
};

Optimizer* zero1_optimizer_create(const TrainConfig* cfg, const Zero1ModelSpec* spec, Zero1Backend* backend,
                                  Zero1Dtype compute_dtype) {
    Zero1Optimizer* z = (Zero1Optimizer*)callocCheck(1, sizeof(Zero1Optimizer));
    z->cfg = *cfg;
    z->backend = backend;
    Zero1Comm* comm = backend->comm;
    if (instances_of(backend) != cfg->dist_opt_instances) {  // a backend that does not make them, say so
        fatal("--dist-opt-instances %d: the %s backend made %d instance%s (the communicator across them is %s)",
              cfg->dist_opt_instances, backend->device.ops->name, instances_of(backend),
              instances_of(backend) == 1 ? "" : "s", backend->cross ? "there" : "missing");
    }
    z->tracer = cfg->trace_file ? start_trace(z) : NULL;
    if (!backend->host_model) zero1_tracer_use_device(z->tracer, &backend->device);
    Zero1Options opt = options_from(cfg, spec, compute_dtype, comm->size * instances_of(backend));
    z->embedding_width = spec->embedding_width;
    z->rt = zero1_runtime_create(&opt, spec, comm, backend->cross, &backend->device, z->tracer);
    int n = spec->num_params;
    z->offsets = (size_t*)mallocCheck(n * sizeof(size_t));
    z->dense_offsets = (size_t*)mallocCheck(n * sizeof(size_t));
    for (int p = 0; p < n; p++) {
        z->offsets[p] = zero1_param_offset(z->rt, p);
        z->dense_offsets[p] = z->model_numel;
        z->model_numel += spec->numels[p];
    }
    Optimizer* o = &z->base;
    o->params = zero1_compute_params(z->rt);
    o->grads = zero1_grad_buffer(z->rt);
    if (backend->host_view) {
        size_t numel = zero1_layout(z->rt)->numel;
        o->params = backend->host_view(&backend->device, o->params, numel * zero1_dtype_size(compute_dtype));
        o->grads = (float*)backend->host_view(&backend->device, o->grads, numel * sizeof(float));
    }
    o->offsets = z->offsets;
    o->numel = zero1_layout(z->rt)->numel;
    ModelHooks hooks = {z, hook_forward_begin, hook_forward_end, hook_backward_begin, hook_backward_end,
                        hook_grad_ready, hook_embedding_grad_rows};
    o->hooks = hooks;
    o->name = "zero1";
    o->world = comm->size * instances_of(backend);
    o->ops = &zero1_ops;
    return o;
}

Zero1Runtime* zero1_optimizer_runtime(Optimizer* o) { return impl(o)->rt; }
