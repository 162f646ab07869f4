/*
 * GPT-2's shape and its parameter tensors, in one place for every program
 * (both trainers, zero1_plan, tests).
 *
 * Canonical order (docs/design.md, "Canonical parameter order") is layer-major, so that one layer's tensors are
 * contiguous and reverse canonical order is exactly backprop order:
 *   wte, wpe, for each layer: ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb
 *   fcprojw fcprojb, then lnfw lnfb.
 * llm.c's model files are tensor-major (every layer's ln1w, then every layer's ln1b, ...);
 * gpt2_file_index() maps a canonical index to its position in a file.
 */
#ifndef LLMC_GPT2_SPEC_H
#define LLMC_GPT2_SPEC_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int max_seq_len;        // maxT
    int vocab_size;         // V, e.g. 50257
    int padded_vocab_size;  // Vp, V rounded up to a multiple of 128
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
} GPT2Config;

// The twelve tensors of one transformer block, in canonical order.
enum {
    LAYER_LN1W, LAYER_LN1B, LAYER_QKVW, LAYER_QKVB, LAYER_ATTPROJW, LAYER_ATTPROJB,
    LAYER_LN2W, LAYER_LN2B, LAYER_FCW, LAYER_FCB, LAYER_FCPROJW, LAYER_FCPROJB,
    LAYER_NUM_TENSORS
};

static inline int gpt2_padded_vocab(int vocab_size) { return ((vocab_size + 127) / 128) * 128; }

// Canonical indices.
static inline int gpt2_num_tensors(const GPT2Config* c) { return 2 + LAYER_NUM_TENSORS * c->num_layers + 2; }
static inline int gpt2_idx_wte(void) { return 0; }
static inline int gpt2_idx_wpe(void) { return 1; }
static inline int gpt2_idx_layer(int layer, int kind) { return 2 + LAYER_NUM_TENSORS * layer + kind; }
static inline int gpt2_idx_lnfw(const GPT2Config* c) { return 2 + LAYER_NUM_TENSORS * c->num_layers; }
static inline int gpt2_idx_lnfb(const GPT2Config* c) { return 3 + LAYER_NUM_TENSORS * c->num_layers; }
// The bias of a LayerNorm's or Linear layer's weight: the tensor right after it (the blocks'
// and the final LayerNorm's weights come first, each followed by its bias).
static inline int gpt2_idx_bias_of(int weight) { return weight + 1; }

// Block index of a canonical tensor: -1 for wte/wpe, L for lnfw/lnfb, else the layer.
static inline int gpt2_tensor_layer(const GPT2Config* c, int idx) {
    if (idx < 2) return -1;
    if (idx >= gpt2_idx_lnfw(c)) return c->num_layers;
    return (idx - 2) / LAYER_NUM_TENSORS;
}

// Element count of a canonical tensor.
static inline size_t gpt2_tensor_numel(const GPT2Config* c, int idx) {
    size_t C = (size_t)c->channels;
    if (idx == 0) return (size_t)c->padded_vocab_size * C;
    if (idx == 1) return (size_t)c->max_seq_len * C;
    if (idx >= gpt2_idx_lnfw(c)) return C;
    switch ((idx - 2) % LAYER_NUM_TENSORS) {
        case LAYER_QKVW: return 3 * C * C;
        case LAYER_QKVB: return 3 * C;
        case LAYER_ATTPROJW: return C * C;
        case LAYER_FCW: return 4 * C * C;
        case LAYER_FCB: return 4 * C;
        case LAYER_FCPROJW: return 4 * C * C;
        default: return C;  // ln1w ln1b attprojb ln2w ln2b fcprojb
    }
}

static inline size_t gpt2_num_parameters(const GPT2Config* c) {
    size_t n = 0;
    for (int i = 0; i < gpt2_num_tensors(c); i++) n += gpt2_tensor_numel(c, i);
    return n;
}

// Weight decay applies to the 2-D tensors only: wte, wpe and the four weight matrices.
static inline int gpt2_tensor_decays(const GPT2Config* c, int idx) {
    if (idx < 2) return 1;
    if (idx >= gpt2_idx_lnfw(c)) return 0;
    int k = (idx - 2) % LAYER_NUM_TENSORS;
    return k == LAYER_QKVW || k == LAYER_ATTPROJW || k == LAYER_FCW || k == LAYER_FCPROJW;
}

// The 2-D hidden matrices of the blocks (qkvw, attprojw, fcw, fcprojw): what --optimizer muon
// updates with Muon (llmc/muon.h); every other tensor (wte with the tied classifier, wpe, biases,
// LayerNorms) stays with AdamW. Megatron-core routes wpe to Muon too: docs/training.md says why not here.
static inline int gpt2_tensor_is_hidden_matrix(const GPT2Config* c, int idx) {
    return idx >= 2 && idx < gpt2_idx_lnfw(c) && gpt2_tensor_decays(c, idx);
}

// A hidden matrix's shape as stored (out_features x in_features, row-major, as torch's Linear).
static inline void gpt2_matrix_shape(const GPT2Config* c, int idx, int* rows, int* cols) {
    int k = (idx - 2) % LAYER_NUM_TENSORS, C = c->channels;
    *rows = k == LAYER_QKVW ? 3 * C : k == LAYER_FCW ? 4 * C : C;
    *cols = k == LAYER_FCPROJW ? 4 * C : C;
}

// The hidden matrix that holds Q, K and V (--muon-split-qkv orthogonalizes its thirds apart).
static inline int gpt2_matrix_is_qkv(const GPT2Config* c, int idx) {
    return gpt2_tensor_is_hidden_matrix(c, idx) && (idx - 2) % LAYER_NUM_TENSORS == LAYER_QKVW;
}

// Writes a readable name ("wte", "h3.qkvw", "lnfw") into buf.
static inline const char* gpt2_tensor_name(const GPT2Config* c, int idx, char* buf, size_t n) {
    static const char* kinds[LAYER_NUM_TENSORS] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                                   "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb"};
    if (idx == 0) snprintf(buf, n, "wte");
    else if (idx == 1) snprintf(buf, n, "wpe");
    else if (idx == gpt2_idx_lnfw(c)) snprintf(buf, n, "lnfw");
    else if (idx == gpt2_idx_lnfb(c)) snprintf(buf, n, "lnfb");
    else snprintf(buf, n, "h%d.%s", (idx - 2) / LAYER_NUM_TENSORS, kinds[(idx - 2) % LAYER_NUM_TENSORS]);
    return buf;
}

// Position of canonical tensor idx in llm.c's tensor-major file order.
static inline int gpt2_file_index(const GPT2Config* c, int idx) {
    if (idx < 2 || idx >= gpt2_idx_lnfw(c)) return idx;
    int layer = (idx - 2) / LAYER_NUM_TENSORS, kind = (idx - 2) % LAYER_NUM_TENSORS;
    return 2 + kind * c->num_layers + layer;
}

// Fills cfg from a descriptor "dN": the GPT-2 family by depth (d12 = 124M with C=768,
// d24 = 350M, d36 = 774M, d48 = 1558M); any other depth N gets C = 64*N. Heads are
// always 64 channels wide. Returns 0 on success, -1 if s is not a descriptor, -2 if it
// is "d" and digits with a depth outside 1..GPT2_MAX_DESCRIPTOR_DEPTH.
#define GPT2_MAX_DESCRIPTOR_DEPTH 1024  // a model file's L bound
static inline int gpt2_config_from_descriptor(const char* s, int vocab_size, int max_seq_len, GPT2Config* cfg) {
    if (s == NULL || s[0] != 'd' || s[1] < '0' || s[1] > '9') return -1;
    char* end = NULL;
    long depth = strtol(s + 1, &end, 10);
    if (*end != '\0') return -1;
    if (depth < 1 || depth > GPT2_MAX_DESCRIPTOR_DEPTH) return -2;
    int C;
    if (depth == 12) C = 768;
    else if (depth == 24) C = 1024;
    else if (depth == 36) C = 1280;
    else if (depth == 48) C = 1600;
    else C = 64 * (int)depth;
    cfg->num_layers = (int)depth;
    cfg->channels = C;
    cfg->num_heads = C / 64;
    cfg->vocab_size = vocab_size;
    cfg->padded_vocab_size = gpt2_padded_vocab(vocab_size);
    cfg->max_seq_len = max_seq_len;
    return 0;
}

#ifdef __cplusplus
}
#endif
#endif
