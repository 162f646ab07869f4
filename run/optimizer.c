// run/optimizer.c: what run/optimizer.h declares.
#include "run/optimizer.h"

Optimizer* optimizer_expose(Optimizer* o, const char* name, const OptimizerOps* ops, void* params,
                            float* grads, const size_t* offsets, size_t numel, int world) {
    Optimizer view = {ops, name, params, grads, offsets, numel, o->hooks, world};
    *o = view;
    return o;
}

void optimizer_split_range(size_t total, int rank, int world, size_t* lo, size_t* hi) {
    size_t base = total / (size_t)world, extra = total % (size_t)world, r = (size_t)rank;
    *lo = r * base + (r < extra ? r : extra);
    *hi = *lo + base + (r < extra ? 1 : 0);
}

int optimizer_split_pieces(const size_t* offsets, int num_tensors, size_t total, int rank, int world,
                           OptimizerPiece* out, int max) {
    size_t lo, hi;
    optimizer_split_range(total, rank, world, &lo, &hi);
    int count = 0;
    for (int p = 0; p < num_tensors; p++) {
        size_t start = offsets[p], end = p + 1 < num_tensors ? offsets[p + 1] : total;
        size_t a = lo > start ? lo : start, b = hi < end ? hi : end;
        if (a >= b) continue;
        if (out && count < max) {
            out[count].param = p;
            out[count].start = a - start;
            out[count].n = b - a;
        }
        count++;
    }
    return count;
}

size_t checkpoint_staging_bytes(void) {
    const char* text = getenv(CHECKPOINT_STAGING_ENV);
    if (text == NULL || *text == '\0') return (size_t)CHECKPOINT_STAGING_DEFAULT_MIB << 20;
    char* end;
    long mib = strtol(text, &end, 10);
    if (*end != '\0' || mib < 1 || mib > 1024) {
        fatal("%s = '%s': expected a whole number of MiB in 1..1024", CHECKPOINT_STAGING_ENV, text);
    }
    return (size_t)mib << 20;
}

void checkpoint_print_bound(void) {
    printf("checkpoint: each rank writes/reads only what it owns, through a %zu MiB staging buffer\n",
           checkpoint_staging_bytes() >> 20);
}

void optimizer_print_routing(const TrainConfig* cfg, const GPT2Config* mc) {
    size_t matrices = 0, total = gpt2_num_parameters(mc);
    for (int i = 0; i < gpt2_num_tensors(mc); i++) {
        if (gpt2_tensor_is_hidden_matrix(mc, i)) matrices += gpt2_tensor_numel(mc, i);
    }
    if (!config_uses_muon(cfg)) {
        printf("optimizer: adamw on every parameter (%zu elements)\n", total);
        return;
    }
    MuonConfig m;
    config_muon(cfg, &m);
    printf("optimizer: muon on the %d blocks' qkvw, attprojw, fcw, fcprojw (%d matrices, %zu elements); adamw on wte, "
           "wpe, biases, LayerNorms (%zu elements)\n", mc->num_layers, 4 * mc->num_layers, matrices, total - matrices);
    printf("muon: momentum %g, nesterov %d, %d Newton-Schulz steps (%s, %s), scale %s x %g, split qkv %d\n",
           (double)m.momentum, m.nesterov, m.ns_steps, cfg->muon_coefficients,
           cfg->muon_ns_bf16 ? "bf16 GEMMs accumulating in fp32" : "fp32", cfg->muon_scale,
           (double)m.extra_scale, m.split_qkv);
}
