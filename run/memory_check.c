// run/memory_check.c: what run/memory_check.h declares.
#include "run/memory_check.h"

#include <omp.h>
#include <sys/resource.h>

#include "llmc/matmul.h"  // openblas_get_num_threads: weak, set where OpenBLAS is linked

#include "llmc/muon_gpt2.h"  // muon_matrix_work_floats, muon_gpt2_batched_work

// Adds bytes to the term of that name (a new one if there is none).
static void memory_add(MemoryNeed* n, const char* name, double bytes) {
    if (bytes <= 0) return;
    for (int i = 0; i < n->count; i++) {
        if (strcmp(n->term[i].name, name) == 0) {
            n->term[i].bytes += bytes;
            return;
        }
    }
    if (n->count == MEMORY_MAX_TERMS) fatal("memory_check.h: more than %d terms", MEMORY_MAX_TERMS);
    n->term[n->count].name = name;
    n->term[n->count].bytes = bytes;
    n->count++;
}

// NCCL's device buffers per communicator of two ranks or more: 1 GiB, measured on 8 H100s
// (docs/cuda_cpu.md's "Device memory" says where); the CPU layer charges the same.
#define MEMORY_NCCL_COMM_BYTES (1024 * MEMORY_MIB)

static double memory_total(const MemoryNeed* n) {
    double sum = 0;
    for (int i = 0; i < n->count; i++) sum += n->term[i].bytes;
    return sum;
}

// Loading the initial weights needs `transient` bytes more (the dense fp32 copy of -e,
// zero1/'s fp32 staging buffer) while only `resident` bytes of the rest are in use yet:
// on the host, malloc/calloc'd buffers take memory when first written, and at that point
// only the weights have been. The peak is then the larger of the two moments.
static void memory_add_loading(MemoryNeed* n, double resident, double transient) {
    memory_add(n, "loading", resident + transient - memory_total(n));
}

// What the allocator, the libraries (OpenMP and OpenBLAS thread buffers, MPI's collective
// buffers, the CUDA layer's page rounding, NCCL's channels), the data loader and the
// tokenizer take on top of the buffers counted: measured at a few tens of MiB on a small
// model; a fixed 64 MiB plus 3% of the rest is a margin above that, which still refuses
// only what would have come within 3% of the limit.
static void memory_add_overhead(MemoryNeed* n) { memory_add(n, "overhead", 64 * MEMORY_MIB + 0.03 * memory_total(n)); }

// zero1 NULL: the trainers' own replicated optimizers, dense and unpadded.
static MemoryBuffers memory_buffers(const TrainConfig* cfg, const GPT2Config* mc, int world,
                                    MemoryZero1Sizes zero1) {
    if (zero1) return zero1(cfg, mc, world);
    double P = (double)gpt2_num_parameters(mc);
    MemoryBuffers b = {P, P, 0, P, world > 1};  // the plain replicated optimizer keeps v for every element;
                                                // one NCCL all-reduce over all ranks
    return b;
}

// The checkpoint code's staging buffer, allocated when checkpoints are saved or loaded.
static double memory_checkpoint_staging(const TrainConfig* cfg) {
    return cfg->checkpoint_every > 0 || cfg->resume ? (double)checkpoint_staging_bytes() : 0;
}

// --async-save's host snapshot (run/checkpoint_async.h): master, m and v of this rank's
// checkpoint pieces, its shard under ZeRO-1 or its 1/world part of the replicated state.
static double memory_async_snapshot(const TrainConfig* cfg, int zero1, double owned, double numel, int world) {
    return cfg->async_save ? 12 * (zero1 ? owned : numel / world) : 0;
}

// The CPU trainer (train_gpt2.c): zero1/ on the host device (zero1/runtime.c
// allocate_buffers; the model computes in fp32), or the plain replicated optimizer
// (fp32 params, grads, m, v), and llmc/gpt2_cpu.h's gpt2_init.
static MemoryNeed memory_need_cpu(const TrainConfig* cfg, const GPT2Config* mc, int world,
                                  MemoryZero1Sizes zero1_sizes) {
    MemoryNeed n;
    memset(&n, 0, sizeof(n));
    MemoryBuffers buffers = memory_buffers(cfg, mc, world, zero1_sizes);
    double numel = buffers.numel, owned = buffers.owned;
    int zero1 = zero1_sizes != NULL;
    int bf16_params = zero1 && cfg->param_dtype == DTYPE_BF16, bf16_grads = zero1 && cfg->grad_dtype == DTYPE_BF16;
    // bf16 params: the bf16 buffer and the fp32 copy the model computes with.
    double params = numel * (bf16_params ? 2 + 4 : 4), master = bf16_params ? 4 * owned : 0;
    memory_add(&n, "params", params);
    memory_add(&n, "grads", numel * (4 + (bf16_grads ? 2 : 0)));  // + the bf16 copy that is reduced
    if (config_uses_muon(cfg)) {
        memory_add(&n, "Muon momentum, AdamW m,v", 4 * owned + 4 * buffers.second_moment);
        double per_thread = 4.0 * muon_matrix_work_floats(4 * mc->channels, mc->channels);  // llmc/muon_cpu.h
        memory_add(&n, "Newton-Schulz scratch", per_thread * omp_get_max_threads());
    } else {
        memory_add(&n, "AdamW m,v", 8 * owned);
    }
    memory_add(&n, "master weights", master);
    // ZeRO-1 over MPI (zero1/comm_mpi.c): each reduce-scatter's result lands in a scratch
    // shard, and Open MPI's non-blocking reduce-scatter sums along a tree through
    // temporary buffers (measured on d4 at np 4: 1.5x the grad buffer on rank 0, half of
    // it on a middle rank, none on the leaves), counted as one grad buffer per rank. The
    // in-place all-reduces of -z 0 measured no such growth.
    int grad_bytes = bf16_grads ? 2 : 4;
    if (world > 1 && zero1 && cfg->zero_stage == 1) memory_add(&n, "MPI buffers", (owned + numel) * grad_bytes);
    memory_add(&n, "zero1 temporaries", buffers.temporaries);
    double L = mc->num_layers, C = mc->channels, NH = mc->num_heads, Vp = mc->padded_vocab_size;
    double BT = (double)cfg->B * cfg->T, att = (double)cfg->B * NH * cfg->T * cfg->T;
    // fp32, every layer's kept for the backward: encoded and lnf (B,T,C); per layer ln1,
    // atty, attproj, residual2, ln2, fcproj, residual3 (B,T,C), qkv (B,T,3C), fch and
    // fch_gelu (B,T,4C); preatt and att (B,NH,T,T); LayerNorm means and rstds, losses (B,T).
    memory_add(&n, "activations", 4 * (BT * C * (2 + 18 * L) + 2 * L * att + BT * (4 * L + 3)));
    memory_add(&n, "logits", 4 * 2 * BT * Vp);  // logits and probs (B,T,Vp)
    // One layer's backward: dresidual, dbtc (B,T,C), dqkv (3C), dfch, dfch_gelu (4C);
    // dpreatt, datt (B,NH,T,T); dlosses (B,T).
    memory_add(&n, "backward scratch", 4 * (BT * C * 13 + 2 * att + BT));
    memory_add(&n, "checkpoint staging", memory_checkpoint_staging(cfg));
    memory_add(&n, "async checkpoint snapshot", memory_async_snapshot(cfg, zero1, owned, numel, world));
    if (!cfg->resume) memory_add_loading(&n, params + master, 4 * gpt2_num_parameters(mc) + (zero1 ? 4 * numel : 0));
    memory_add_overhead(&n);
    return n;
}

// The GPU trainer (train_gpt2.cu), x = sizeof(floatX): zero1/ on the CUDA device (the
// param buffer is what the model reads), or the plain replicated optimizer (floatX
// params, fp32 grads, master, m, v), and llmc/gpt2_cuda.cuh's gpt2_init. On the device
// every buffer exists from its cudaMalloc on, so loading adds zero1/'s fp32 staging
// buffer to all of it. staged: zero1/'s collectives go through MPI staged in page-locked
// host memory (ranks share a GPU, or --comm mpi).
static void memory_need_gpu(const TrainConfig* cfg, const GPT2Config* mc, const GPT2Kernels* kernels, int world,
                            MemoryZero1Sizes zero1_sizes, int x, int staged, int device_on_host, MemoryNeed* device,
                            MemoryNeed* host) {
    // kernels->attention picks the attention term, kernels->recompute_gelu where fch_gelu
    // is counted; the fused kernels need no buffer of their own (the bias-gradient epilogue
    // writes into the column-reduction partials).
    memset(device, 0, sizeof(*device));
    memset(host, 0, sizeof(*host));
    MemoryBuffers buffers = memory_buffers(cfg, mc, world, zero1_sizes);
    double numel = buffers.numel, owned = buffers.owned;
    int zero1 = zero1_sizes != NULL, grad_bytes = zero1 && cfg->grad_dtype == DTYPE_BF16 ? 2 : 4;
    memory_add(device, "params", x * numel);
    memory_add(device, "grads", numel * (4 + (grad_bytes == 2 ? 2 : 0)));
    if (config_uses_muon(cfg)) {  // Newton-Schulz batched by shape (llmc/muon.cuh)
        size_t ns_x, ns_a;
        muon_gpt2_batched_work(mc, cfg->muon_split_qkv, &ns_x, &ns_a);
        memory_add(device, "Muon momentum, AdamW m,v", 4 * owned + 4 * buffers.second_moment);
        // X, A and B in the GEMMs' dtype and X's next value in fp32 (llmc/muon.cuh), and the 32 MiB
        // cuBLASLt workspace of zero1/'s device op (zero1/device_cuda_muon.cu; counted either way).
        double x_bytes = cfg->muon_ns_bf16 ? 2.0 : 4.0;
        memory_add(device, "Newton-Schulz scratch", x_bytes * (ns_x + 2 * ns_a) + 4.0 * ns_x + 32.0 * (1 << 20));
    } else {
        memory_add(device, "AdamW m,v", 8 * owned);
    }
    memory_add(device, "master weights", !zero1 || x == 2 ? 4 * owned : 0);
    memory_add(device, "zero1 temporaries", buffers.temporaries);
    double L = mc->num_layers, C = mc->channels, NH = mc->num_heads, Vp = mc->padded_vocab_size;
    double BT = (double)cfg->B * cfg->T, att = (double)cfg->B * NH * cfg->T * cfg->T;
    // floatX: encoded and lnf (B,T,C); per layer ln1, atty, residual2, ln2, residual3
    // (B,T,C), qkv (3C), fch (4C). fp32: LayerNorm means and rstds, losses and logsumexps
    // (B,T).
    memory_add(device, "activations", x * (BT * C * (2 + 12 * L)) + 4 * BT * (4 * L + 4));
    // fch_gelu (4C): per layer with -r 0; with -r 1 one buffer the backward refills (scratch)
    int recompute = kernels->recompute_gelu;
    memory_add(device, recompute ? "scratch" : "activations", x * BT * 4 * C * (recompute ? 1 : L));
    memory_add(device, "logits", x * BT * Vp);
    // Attention (llmc/gpt2_cuda.cuh's gpt2_init), kept per layer and as scratch. Naive: att
    // (B,NH,T,T) floatX per layer; dpreatt (B,NH,T,T) floatX, scores (B,NH,T,T) fp32, perm
    // (B,T,C), qkvr and dqkvr (3C) floatX. Flash: the lse (B,NH,T) fp32 per layer and D
    // (B,NH,T) fp32.
    double att_rows = (double)cfg->B * NH * cfg->T;
    int naive_attention = kernels->attention == ATTENTION_NAIVE;
    memory_add(device, "attention",
               naive_attention ? x * (L * att + att + 7 * BT * C) + 4 * att : 4 * att_rows * (L + 1));
    // btc, dresidual (B,T,C), dqkv (3C), dfch (4C) in floatX; the column-reduction partials
    // (at most 256 chunks of 64 rows, 4C wide: llmc/layernorm.cuh) in fp32; the norm
    // partials (512 doubles); the token ids of the two batch slots (inputs and targets each:
    // llmc/batch_upload.cuh) and the encoder backward's plan (3 ints a token).
    double chunks = (double)(long long)((BT + 63) / 64);
    if (chunks > 256) chunks = 256;
    memory_add(device, "scratch", x * (BT * C * 9) + 4 * chunks * 4 * C + 8 * 512 + 4 * 7 * BT);
    if (!cfg->resume && zero1) memory_add_loading(device, memory_total(device), 4 * numel);
    memory_add_overhead(device);
    // NCCL's buffers, an estimate of their own (no margin on it): communicators are made after
    // the check (staged MPI makes none).
    memory_add(device, "NCCL buffers", staged ? 0 : buffers.communicators * MEMORY_NCCL_COMM_BYTES);

    // The host keeps the dense fp32 weights of -e while they load, the checkpoint staging
    // buffer, and with staged collectives a page-locked copy of each bucket in flight (at
    // most the grad or param buffer, whichever is wider) plus the reduce-scatter shards.
    memory_add(host, "staged MPI copies", staged ? numel * (grad_bytes > x ? grad_bytes : x) + owned * grad_bytes : 0);
    memory_add(host, "checkpoint staging", memory_checkpoint_staging(cfg));
    memory_add(host, "async checkpoint snapshot", memory_async_snapshot(cfg, zero1, owned, numel, world));
    // Pinned: the encoder plan's two sets of 3 ints a token (plus its 2-int sort scratch,
    // pageable) and the two batch slots' inputs and targets.
    memory_add(host, "encoder plan", 4 * 8 * BT);
    memory_add(host, "pinned batches", 4 * 4 * BT);
    if (!cfg->resume) memory_add_loading(host, 0, 4 * gpt2_num_parameters(mc));
    // The CPU execution layer's device memory is this process's memory, written (so
    // resident) by cudaMalloc: the device's need is the host's too (its margin aside: the
    // host's covers the process; NCCL's buffers are only counted there, not made).
    for (int i = 0; device_on_host && i < device->count; i++) {
        const char* name = device->term[i].name;
        if (strcmp(name, "overhead") != 0 && strcmp(name, "NCCL buffers") != 0) {
            memory_add(host, name, device->term[i].bytes);
        }
    }
    memory_add_overhead(host);
}

double memory_read_key(const char* path, const char* key) {
    FILE* f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    double value = -1;
    size_t len = strlen(key);
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, len) == 0 && (line[len] == ' ' || line[len] == ':' || line[len] == '\t')) {
            value = atof(line + len + 1);
            break;
        }
    }
    fclose(f);
    return value;
}

// The single number in a cgroup file; -1 if missing or "max" (no limit).
static double memory_read_number(const char* dir, const char* file) {
    char path[PATH_MAX_LEN + 64];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    FILE* f = fopen(path, "r");
    if (!f) return -1;
    char text[64] = "";
    if (!fgets(text, sizeof(text), f)) text[0] = '\0';
    fclose(f);
    if (text[0] < '0' || text[0] > '9') return -1;
    return atof(text);
}

// The headroom of one cgroup directory, v2 (memory.max, memory.current) or v1
// (memory.limit_in_bytes, memory.usage_in_bytes). Page cache counts as usage there,
// but the kernel drops its inactive part before it refuses memory: that part is room.
// A v1 limit near 2^63 means none.
static void memory_cgroup_level(const char* dir, int v2, MemoryLimit* m) {
    double limit = memory_read_number(dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    double usage = memory_read_number(dir, v2 ? "memory.current" : "memory.usage_in_bytes");
    if (limit < 0 || limit > 1e18 || usage < 0) return;
    char stat[PATH_MAX_LEN + 64];
    snprintf(stat, sizeof(stat), "%s/memory.stat", dir);
    double inactive = memory_read_key(stat, v2 ? "inactive_file" : "total_inactive_file");
    double room = limit - usage + (inactive > 0 ? inactive : 0);
    if (room < 0) room = 0;
    if (m->cgroup_limit < 0 || room < m->cgroup_room) {
        m->cgroup_limit = limit;
        m->cgroup_room = room;
    }
}

// Every level from this process's cgroup (/proc/self/cgroup) up to the mount's root:
// a parent's limit binds its children too.
static void memory_cgroup(MemoryLimit* m) {
    FILE* f = fopen("/proc/self/cgroup", "r");
    if (!f) return;
    char line[PATH_MAX_LEN];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char* controllers = strchr(line, ':');
        char* path = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!path) continue;
        *path++ = '\0';
        controllers++;
        int v2 = strcmp(line, "0") == 0 && *controllers == '\0';
        int v1 = !v2 && (strcmp(controllers, "memory") == 0 || strstr(controllers, "memory,") ||
                         (strlen(controllers) > 7 && strcmp(controllers + strlen(controllers) - 7, ",memory") == 0));
        if (!v1 && !v2) continue;
        const char* root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
        char dir[PATH_MAX_LEN + 32];
        snprintf(dir, sizeof(dir), "%s%s", root, strcmp(path, "/") == 0 ? "" : path);
        for (;;) {
            memory_cgroup_level(dir, v2, m);
            if (strlen(dir) <= strlen(root)) break;
            *strrchr(dir, '/') = '\0';
        }
    }
    fclose(f);
}

// ulimit -v bounds each process's address space, which holds more than its resident memory:
// what is mapped and not resident at the check (libraries, thread stacks, MPI's shared
// memory) is taken off the limit, and so are OpenBLAS's buffers (below).
static void memory_address_space(MemoryLimit* m) {
    struct rlimit lim;
    if (getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return;
    double size = memory_read_key("/proc/self/status", "VmSize"), rss = memory_read_key("/proc/self/status", "VmRSS");
    m->as_limit = (double)lim.rlim_cur;
    if (size >= 0 && rss >= 0) m->as_room = m->as_limit - (size - rss) * 1024;
    // OpenBLAS (Debian's build) takes a 128 MiB buffer in each thread that calls it, and spins
    // forever when malloc refuses one: counted here, so that the run is refused instead.
    if (m->as_room >= 0 && openblas_get_num_threads) m->as_room -= omp_get_max_threads() * 128.0 * MEMORY_MIB;
}

static MemoryLimit memory_host_limit(void) {
    MemoryLimit m = {-1, -1, -1, -1, 0, -1, -1};
    memory_address_space(&m);
    const char* text = getenv(MEMORY_LIMIT_ENV);
    if (text && *text) {
        char* end;
        double mib = strtod(text, &end);
        if (*end != '\0' || !(mib > 0)) fatal("%s = '%s': expected a positive number of MiB", MEMORY_LIMIT_ENV, text);
        m.bytes = mib * MEMORY_MIB;
        m.overridden = 1;
        m.as_room = -1;  // the override stands for every limit
        return m;
    }
    double kib = memory_read_key("/proc/meminfo", "MemAvailable");
    m.mem_available = kib < 0 ? -1 : kib * 1024;
    memory_cgroup(&m);
    m.bytes = m.mem_available;
    if (m.cgroup_limit >= 0 && (m.bytes < 0 || m.cgroup_room < m.bytes)) m.bytes = m.cgroup_room;
    return m;
}

static const char* memory_size(double bytes, char* buf, size_t n) {
    if (bytes >= MEMORY_GIB) snprintf(buf, n, "%.1f GiB", bytes / MEMORY_GIB);
    else snprintf(buf, n, "%.0f MiB", bytes / MEMORY_MIB);
    return buf;
}

// "params 5.1, grads 5.1, ..." in the unit memory_size picks for `total`, largest first:
// what dominates comes first.
static const char* memory_terms(const MemoryNeed* need, double total, char* buf, size_t n) {
    double unit = total >= MEMORY_GIB ? MEMORY_GIB : MEMORY_MIB;
    MemoryNeed sorted = *need;
    for (int i = 1; i < sorted.count; i++) {
        for (int j = i; j > 0 && sorted.term[j].bytes > sorted.term[j - 1].bytes; j--) {
            MemoryTerm t = sorted.term[j];
            sorted.term[j] = sorted.term[j - 1];
            sorted.term[j - 1] = t;
        }
    }
    buf[0] = '\0';
    int decimals = unit == MEMORY_GIB ? 1 : 0;
    for (int i = 0; i < sorted.count; i++) {
        double value = sorted.term[i].bytes / unit;
        if (value < (decimals ? 0.05 : 0.5)) break;  // the rest would print as 0
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s %.*f", i ? ", " : "", sorted.term[i].name, decimals, value);
    }
    return buf;
}

// The device ledger's word on the kernel choices (llmc/gpt2_kernels.h), for the trainer's
// "kernels:" line: the attention term of these kernels against the naive path's, and what
// -r 1 saves against -r 0 (the same job otherwise; overhead margin included).
static const char* memory_size_small(double bytes, char* buf, size_t n) {
    if (bytes >= MEMORY_MIB) return memory_size(bytes, buf, n);
    snprintf(buf, n, "%.0f KiB", bytes / 1024);
    return buf;
}

static double memory_term_bytes(const MemoryNeed* n, const char* name) {
    for (int i = 0; i < n->count; i++) {
        if (strcmp(n->term[i].name, name) == 0) return n->term[i].bytes;
    }
    return 0;
}

void memory_kernel_choices(const TrainConfig* cfg, const GPT2Config* mc, const GPT2Kernels* k, int x,
                           char* buf, size_t n) {
    MemoryNeed dev, host;
    GPT2Kernels naive = *k, keep = *k;
    naive.attention = ATTENTION_NAIVE;
    keep.recompute_gelu = 0;
    memory_need_gpu(cfg, mc, k, 1, NULL, x, 0, 0, &dev, &host);
    double total = memory_total(&dev), attention = memory_term_bytes(&dev, "attention");
    memory_need_gpu(cfg, mc, &naive, 1, NULL, x, 0, 0, &dev, &host);
    double naive_attention = memory_term_bytes(&dev, "attention");
    memory_need_gpu(cfg, mc, &keep, 1, NULL, x, 0, 0, &dev, &host);
    double gelu_saved = memory_total(&dev) - total;
    char a[32], b[32], c[32];
    snprintf(buf, n, "ledger: attention %s (naive: %s), -r 1 saves %s", memory_size_small(attention, a, sizeof(a)),
             memory_size_small(naive_attention, b, sizeof(b)), memory_size_small(gelu_saved, c, sizeof(c)));
}

// Where the host limit came from, for the messages.
static const char* memory_limit_source(const MemoryLimit* m, char* buf, size_t n) {
    char a[32], b[32], c[32];
    if (m->overridden) snprintf(buf, n, "%s=%s", MEMORY_LIMIT_ENV, getenv(MEMORY_LIMIT_ENV));
    else if (m->cgroup_limit < 0) snprintf(buf, n, "MemAvailable %s; cgroup limit none", memory_size(m->mem_available, a, 32));
    else {
        snprintf(buf, n, "MemAvailable %s; cgroup limit %s with %s free", memory_size(m->mem_available, a, 32),
                 memory_size(m->cgroup_limit, b, 32), memory_size(m->cgroup_room, c, 32));
    }
    return buf;
}

// The ranks of rows[r]'s node (same_gpu: of its GPU too); *first: whether r is the first.
static int memory_peers(const MemoryRow* rows, int world, int r, int same_gpu, int* first) {
    int count = 0;
    *first = 1;
    for (int i = 0; i < world; i++) {
        if (strcmp(rows[i].node, rows[r].node) != 0 || (same_gpu && rows[i].gpu != rows[r].gpu)) continue;
        if (i < r) *first = 0;
        count++;
    }
    return count;
}

static void memory_describe_job(const TrainConfig* cfg, char* buf, size_t n) {
    snprintf(buf, n, "-e %s -b %d -t %d -z %d", cfg->model, cfg->B, cfg->T, cfg->zero_stage);
}

// Ends the job if a node (of_gpu: a GPU) cannot hold what its ranks need, each judged on
// its first rank's row; rank 0 prints its own node's (GPU's) estimate when it fits.
static void memory_judge(const TrainConfig* cfg, const MemoryRow* rows, int world, const MemoryNeed* need,
                         int of_gpu) {
    double per_rank = memory_total(need);
    int single_node = 1;
    for (int i = 1; i < world; i++) single_node &= strcmp(rows[i].node, rows[0].node) == 0;
    for (int r = 0; r < world; r++) {
        if (!of_gpu && rows[r].host.as_room >= 0 && per_rank > rows[r].host.as_room) {
            char job[PATH_MAX_LEN + 64], p[32], l[32], room[32], terms[512];
            memory_describe_job(cfg, job, sizeof(job));
            memory_terms(need, per_rank, terms, sizeof(terms));
            fatal("%s needs about %s of host memory per rank (%s) but rank %d's ulimit -v of %s leaves room for %s "
                  "(the rest is mapped already: libraries, stacks, MPI); raise ulimit -v or make the job smaller",
                  job, memory_size(per_rank, p, sizeof(p)), terms, r, memory_size(rows[r].host.as_limit, l, sizeof(l)),
                  memory_size(rows[r].host.as_room > 0 ? rows[r].host.as_room : 0, room, sizeof(room)));
        }
        int first, ranks = memory_peers(rows, world, r, of_gpu, &first);
        double limit = of_gpu ? rows[r].gpu_free : rows[r].host.bytes, total = ranks * per_rank;
        if (!first || limit < 0) continue;
        char job[PATH_MAX_LEN + 64], where[MPI_MAX_PROCESSOR_NAME + 16], t[32], p[32], l[32], terms[512], source[160];
        memory_describe_job(cfg, job, sizeof(job));
        snprintf(where, sizeof(where), "%s%s", single_node ? "this node" : "node ", single_node ? "" : rows[r].node);
        memory_terms(need, per_rank, terms, sizeof(terms));
        if (r == 0 && utils_rank() == 0 && total <= limit) {
            printf("memory: need about %.0f MiB per rank of %s (%s); %d rank%s on this %s: %.0f MiB of %.0f MiB %s (%s)\n",
                   per_rank / MEMORY_MIB, of_gpu ? "GPU memory" : "host memory", terms, ranks, ranks == 1 ? "" : "s",
                   of_gpu ? "GPU" : "node", total / MEMORY_MIB, limit / MEMORY_MIB, of_gpu ? "free" : "available",
                   of_gpu ? "cudaMemGetInfo" : memory_limit_source(&rows[r].host, source, sizeof(source)));
            fflush(stdout);
        }
        if (total <= limit) continue;
        memory_size(total, t, sizeof(t));
        memory_size(per_rank, p, sizeof(p));
        memory_size(limit, l, sizeof(l));
        if (of_gpu) {
            fatal("%s needs about %s of GPU memory on a GPU of %s (%d rank%s x %s: %s) but cudaMemGetInfo reports %s free",
                  job, t, where, ranks, ranks == 1 ? "" : "s", p, terms, l);
        }
        fatal("%s needs about %s of host memory on %s (%d rank%s x %s: %s) but %s is available (%s)", job, t, where,
              ranks, ranks == 1 ? "" : "s", p, terms, l, memory_limit_source(&rows[r].host, source, sizeof(source)));
    }
}

static double memory_rss_at_check_ = -1;

static MemoryNeed memory_reported_;

static double memory_status_mib(const char* field) {
    return memory_read_key("/proc/self/status", field) / 1024.0;
}

static void memory_report_at_exit(void) {
    double peak = memory_status_mib("VmHWM"), margin = 0;
    for (int i = 0; i < memory_reported_.count; i++) {
        if (strcmp(memory_reported_.term[i].name, "overhead") == 0) margin = memory_reported_.term[i].bytes;
    }
    printf("memory: rank %d peak RSS %.0f MiB, %.0f MiB above the %.0f MiB it held at the check (estimate %.0f MiB, "
           "%.0f MiB of it the overhead margin)\n",
           utils_rank(), peak, peak - memory_rss_at_check_, memory_rss_at_check_,
           memory_total(&memory_reported_) / MEMORY_MIB, margin / MEMORY_MIB);
    fflush(stdout);
}

static void memory_report_arm(const MemoryNeed* host) {
    const char* on = getenv(MEMORY_REPORT_ENV);
    if (!on || strcmp(on, "1") != 0 || memory_rss_at_check_ >= 0) return;
    memory_rss_at_check_ = memory_status_mib("VmRSS");
    memory_reported_ = *host;
    atexit(memory_report_at_exit);
}

// Collective: every rank's row, in rank order (freed by the caller).
static MemoryRow* memory_gather(int world, uint64_t gpu, double gpu_free) {
    MemoryRow mine;
    memset(&mine, 0, sizeof(mine));
    int len = 0;
    mpiCheck(MPI_Get_processor_name(mine.node, &len));
    mine.gpu = gpu;
    mine.gpu_free = gpu_free;
    mine.host = memory_host_limit();
    MemoryRow* rows = (MemoryRow*)mallocCheck((size_t)world * sizeof(MemoryRow));
    mpi_allgather_deadline(&mine, rows, (int)sizeof(MemoryRow), MPI_BYTE, "memory check", -1);
    return rows;
}

void memory_check_cpu(const TrainConfig* cfg, const GPT2Config* mc, int world,
                      MemoryZero1Sizes zero1_sizes) {
    MemoryNeed need = memory_need_cpu(cfg, mc, world, zero1_sizes);
    MemoryRow* rows = memory_gather(world, 0, -1);
    memory_report_arm(&need);
    memory_judge(cfg, rows, world, &need, 0);
    free(rows);
}

void memory_check_gpu(const TrainConfig* cfg, const GPT2Config* mc, const GPT2Kernels* kernels,
                      int world, MemoryZero1Sizes zero1_sizes, int x, const MemoryGpu* gpu) {
    MemoryRow* rows = memory_gather(world, gpu->id, gpu->free_bytes);
    // zero1/backend_cuda.cu: collectives go through staged MPI when asked to, or (auto)
    // when ranks on a node share a GPU.
    int shared = 0, first;
    for (int r = 0; r < world; r++) shared |= memory_peers(rows, world, r, 1, &first) > 1;
    int staged = zero1_sizes && world > 1 &&
                 (strcmp(cfg->comm_backend, "mpi") == 0 || (strcmp(cfg->comm_backend, "auto") == 0 && shared));
    MemoryNeed device, host;
    memory_need_gpu(cfg, mc, kernels, world, zero1_sizes, x, staged, gpu->is_host_memory, &device, &host);
    memory_report_arm(&host);
    memory_judge(cfg, rows, world, &device, 1);
    memory_judge(cfg, rows, world, &host, 0);
    free(rows);
}
