/*
 * hf_convert: llm.c GPT-2 model files <-> Hugging Face `transformers` GPT-2 directories.
 *
 *   hf_convert export IN OUT_DIR [--dtype fp32|bf16] [--allow-nonfinite]
 *       IN: an llm.c model file, a checkpoint directory (DIR/checkpoint_00000100: its
 *       model.bin, checked against the manifest), or a run's output directory (-o DIR:
 *       its newest checkpoint). Writes OUT_DIR/model.safetensors and OUT_DIR/config.json,
 *       loadable with GPT2LMHeadModel.from_pretrained(OUT_DIR).
 *   hf_convert import IN OUT.bin [--dtype fp32|bf16] [--allow-nonfinite]
 *       IN: a directory holding model.safetensors and config.json, or a .safetensors file
 *       with config.json beside it. Writes an llm.c model file (version 3, or 5 for bf16)
 *       that the trainers take as -e OUT.bin.
 *
 * The name mapping and the transpose rule are in docs/huggingface.md ("The layout").
 * In short: HF's GPT-2 computes its four matrix layers with Conv1D, y = x W + b with W of
 * shape (in, out), where llm.c's matmul takes W as (out, in); those four weights are
 * transposed both ways, everything else is copied. The LM head is tied to wte, so no
 * lm_head.weight is written (transformers ties it on load); an import accepts one only
 * if it equals wte. llm.c pads the vocabulary to Vp rows of wte; the export drops the rows
 * beyond V (a trainer keeps them zero; non-zero ones are reported) and the import pads
 * with zero rows to the smallest multiple of 128.
 *
 * A NaN or infinity among the weights (a run that diverged) is refused both ways, naming
 * the tensor and its first bad index, unless --allow-nonfinite says to convert it anyway.
 *
 * Outputs are written under temporary names and renamed when complete; on any error the
 * temporaries are removed, so no half-written file is ever left. Bad input is one
 * `error:` line and exit status 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "run/checkpoint.h"
#include "run/config.h"
#include "run/crc32c.h"
#include "llmc/gpt2_spec.h"
#include "run/model_file.h"
#include "run/files.h"
#include "tools/json.h"
#include "tools/safetensors.h"

#define HF_PREFIX "transformer."
#define GPT2_EOT_TOKEN 50256  // GPT-2's <|endoftext|>, its bos and eos
#define LAYER_NORM_EPS 1e-5   // llmc/layernorm.h, fixed

// ----------------------------------------------------------------------------
// Temporaries, removed at exit unless renamed into place (fatal() exits through here).

static char hf_temporaries[2][PATH_MAX_LEN];

static void hf_remove_temporaries(void) {
    for (int k = 0; k < 2; k++) {
        if (hf_temporaries[k][0]) remove(hf_temporaries[k]);
    }
}

static FILE* hf_open_temporary(int slot, const char* final_path) {
    path_format(hf_temporaries[slot], PATH_MAX_LEN, "%s.tmp", final_path);
    return fopenCheck(hf_temporaries[slot], "wb");
}

static void hf_commit_temporary(int slot, const char* final_path) {
    if (rename(hf_temporaries[slot], final_path) != 0) {
        fatal("cannot rename %s to %s: %s", hf_temporaries[slot], final_path, strerror(errno));
    }
    hf_temporaries[slot][0] = '\0';
}

// ----------------------------------------------------------------------------
// The mapping: llm.c's canonical tensors <-> HF GPT-2 names and shapes.

// Per block, indexed by LAYER_* kind: the name after "h.N." and whether the tensor is one
// of the four matmul weights, stored (out, in) by llm.c and (in, out) by HF's Conv1D.
static const struct {
    const char* suffix;
    int transposed;
} HF_LAYER_TENSORS[LAYER_NUM_TENSORS] = {
    [LAYER_LN1W] = {"ln_1.weight", 0},        [LAYER_LN1B] = {"ln_1.bias", 0},
    [LAYER_QKVW] = {"attn.c_attn.weight", 1}, [LAYER_QKVB] = {"attn.c_attn.bias", 0},
    [LAYER_ATTPROJW] = {"attn.c_proj.weight", 1}, [LAYER_ATTPROJB] = {"attn.c_proj.bias", 0},
    [LAYER_LN2W] = {"ln_2.weight", 0},        [LAYER_LN2B] = {"ln_2.bias", 0},
    [LAYER_FCW] = {"mlp.c_fc.weight", 1},     [LAYER_FCB] = {"mlp.c_fc.bias", 0},
    [LAYER_FCPROJW] = {"mlp.c_proj.weight", 1}, [LAYER_FCPROJB] = {"mlp.c_proj.bias", 0},
};

static int hf_layer_kind(const GPT2Config* c, int idx) {
    int layer = gpt2_tensor_layer(c, idx);
    return (layer >= 0 && layer < c->num_layers) ? (idx - 2) % LAYER_NUM_TENSORS : -1;
}

static int hf_transposed(const GPT2Config* c, int idx) {
    int kind = hf_layer_kind(c, idx);
    return kind >= 0 && HF_LAYER_TENSORS[kind].transposed;
}

// The HF name of canonical tensor idx, without the "transformer." prefix.
static const char* hf_tensor_name(const GPT2Config* c, int idx, char* buf, size_t n) {
    int kind = hf_layer_kind(c, idx);
    if (idx == gpt2_idx_wte()) snprintf(buf, n, "wte.weight");
    else if (idx == gpt2_idx_wpe()) snprintf(buf, n, "wpe.weight");
    else if (idx == gpt2_idx_lnfw(c)) snprintf(buf, n, "ln_f.weight");
    else if (idx == gpt2_idx_lnfb(c)) snprintf(buf, n, "ln_f.bias");
    else snprintf(buf, n, "h.%d.%s", gpt2_tensor_layer(c, idx), HF_LAYER_TENSORS[kind].suffix);
    return buf;
}

// llm.c's (rows, cols) of a 2-D tensor, with wte cut to the real vocabulary; cols = 0 for
// a 1-D one. HF's shape is the same, or (cols, rows) where hf_transposed().
static void hf_llmc_shape(const GPT2Config* c, int idx, uint64_t* rows, uint64_t* cols) {
    uint64_t C = (uint64_t)c->channels, numel = gpt2_tensor_numel(c, idx);
    int matrix = idx == gpt2_idx_wte() || idx == gpt2_idx_wpe() || hf_transposed(c, idx);
    int kind = hf_layer_kind(c, idx);
    uint64_t in = kind == LAYER_FCPROJW ? 4 * C : C;  // every matrix's input width but fcproj's is C
    if (idx == gpt2_idx_wte()) numel = (uint64_t)c->vocab_size * C;
    *rows = matrix ? numel / in : numel;
    *cols = matrix ? in : 0;
}

static void hf_shape(const GPT2Config* c, int idx, uint64_t shape[2], int* ndim) {
    uint64_t rows, cols;
    hf_llmc_shape(c, idx, &rows, &cols);
    *ndim = cols ? 2 : 1;
    int t = hf_transposed(c, idx);
    shape[0] = t ? cols : rows;
    shape[1] = t ? rows : cols;
}

// dst (cols x rows) = transpose of src (rows x cols).
static void hf_transpose(float* dst, const float* src, uint64_t rows, uint64_t cols) {
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t k = 0; k < cols; k++) dst[k * rows + r] = src[r * cols + k];
    }
}

// ----------------------------------------------------------------------------
// export

// The model file that IN names (see the top): a file as it is; a checkpoint directory's
// model.bin once its size and CRC32C match the manifest; a run directory's newest one's.
static void hf_resolve_model(const char* in, char* model, size_t n) {
    struct stat st;
    if (stat(in, &st) != 0) fatal("cannot read '%s': %s", in, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        path_format(model, n, "%s", in);
        return;
    }
    char dir[PATH_MAX_LEN], manifest[PATH_MAX_LEN];
    path_format(dir, sizeof(dir), "%s", in);
    path_format(manifest, sizeof(manifest), "%s/%s", dir, CHECKPOINT_MANIFEST);
    if (stat(manifest, &st) != 0 && checkpoint_find_latest(in, dir, sizeof(dir)) < 0) {
        fatal("'%s' is a directory but neither a checkpoint (no %s) nor a run directory with checkpoint_* in it", in,
              CHECKPOINT_MANIFEST);
    }
    CheckpointManifest m;
    checkpoint_read_manifest(dir, &m);
    path_format(model, n, "%s/%s", dir, CHECKPOINT_FILES[CHECKPOINT_MODEL]);
    size_t bytes;
    uint32_t crc = crc32c_file(model, &bytes);
    if (crc != m.crc[CHECKPOINT_MODEL]) checkpoint_checksum_mismatch(model, crc, m.crc[CHECKPOINT_MODEL]);
    printf("export: checkpoint %s (model.bin checksum ok)\n", dir);
}

// wte rows V..Vp-1 have no place in HF's layout. A trainer keeps them at zero (they get no
// gradient, and weight decay keeps zero at zero); say so when they are not.
static void hf_check_padding(const GPT2Config* c, const float* wte, const char* path) {
    size_t from = (size_t)c->vocab_size * c->channels, to = (size_t)c->padded_vocab_size * c->channels, nonzero = 0;
    for (size_t j = from; j < to; j++) nonzero += wte[j] != 0.0f;
    if (nonzero) {
        fprintf(stderr, "warning: %s: %zu values in the padded vocabulary rows %d..%d of wte are not zero; they are "
                "dropped (Hugging Face's wte has V = %d rows), so an import gives them back as zeros\n",
                path, nonzero, c->vocab_size, c->padded_vocab_size - 1, c->vocab_size);
    }
}

static void hf_write_config(const char* path, const GPT2Config* c, int bf16) {
    FILE* f = hf_open_temporary(1, path);
    int eot = c->vocab_size > GPT2_EOT_TOKEN ? GPT2_EOT_TOKEN : c->vocab_size - 1;
    // Dropout 0, as the llm.c trainers train; "gelu_new" is GPT-2's tanh GELU (llmc/gelu.h).
    fprintf(f,
            "{\n"
            "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
            "  \"model_type\": \"gpt2\",\n"
            "  \"vocab_size\": %d,\n"
            "  \"n_positions\": %d,\n"
            "  \"n_embd\": %d,\n"
            "  \"n_layer\": %d,\n"
            "  \"n_head\": %d,\n"
            "  \"n_inner\": null,\n"
            "  \"activation_function\": \"gelu_new\",\n"
            "  \"layer_norm_epsilon\": 1e-05,\n"
            "  \"resid_pdrop\": 0.0,\n"
            "  \"embd_pdrop\": 0.0,\n"
            "  \"attn_pdrop\": 0.0,\n"
            "  \"initializer_range\": 0.02,\n"
            "  \"scale_attn_weights\": true,\n"
            "  \"scale_attn_by_inverse_layer_idx\": false,\n"
            "  \"reorder_and_upcast_attn\": false,\n"
            "  \"use_cache\": true,\n"
            "  \"bos_token_id\": %d,\n"
            "  \"eos_token_id\": %d,\n"
            "  \"tie_word_embeddings\": true,\n"
            "  \"torch_dtype\": \"%s\"\n"
            "}\n",
            c->vocab_size, c->max_seq_len, c->channels, c->num_layers, c->num_heads, eot, eot,
            bf16 ? "bfloat16" : "float32");
    fcloseCheck(f, hf_temporaries[1]);
}

// The output directory: created if missing (its parent must exist).
static void hf_make_output_dir(const char* dir) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) fatal("output '%s' exists and is not a directory", dir);
        return;
    }
    if (mkdir(dir, 0755) != 0) fatal("cannot create output directory '%s': %s", dir, strerror(errno));
}

#define HF_NONFINITE_HINT "refused: a model that diverged (--allow-nonfinite converts it anyway)"

static void hf_export(const char* in, const char* out_dir, int bf16, int allow_nonfinite, int overwrite) {
    char model[PATH_MAX_LEN], st_path[PATH_MAX_LEN], config_path[PATH_MAX_LEN];
    hf_resolve_model(in, model, sizeof(model));
    GPT2Config c;
    int version;
    float* dense = gpt2_model_file_read(model, &c, &version);
    if (!allow_nonfinite) gpt2_dense_check_finite(&c, dense, model, HF_NONFINITE_HINT);
    hf_check_padding(&c, dense, model);
    int NT = gpt2_num_tensors(&c);
    size_t* offsets = (size_t*)mallocCheck((size_t)NT * sizeof(size_t));
    gpt2_tensor_offsets_dense(&c, offsets);
    SafetensorsTensor* tensors = (SafetensorsTensor*)callocCheck((size_t)NT, sizeof(SafetensorsTensor));
    for (int i = 0; i < NT; i++) {
        char name[128];
        path_format(tensors[i].name, sizeof(tensors[i].name), HF_PREFIX "%s", hf_tensor_name(&c, i, name, sizeof(name)));
        snprintf(tensors[i].dtype, sizeof(tensors[i].dtype), "%s", bf16 ? "BF16" : "F32");
        hf_shape(&c, i, tensors[i].shape, &tensors[i].ndim);
    }
    size_t header_len;
    char* header = safetensors_header(tensors, NT, &header_len);

    hf_make_output_dir(out_dir);
    path_format(st_path, sizeof(st_path), "%s/model.safetensors", out_dir);
    path_format(config_path, sizeof(config_path), "%s/config.json", out_dir);
    const char* there = access(st_path, F_OK) == 0 ? st_path : access(config_path, F_OK) == 0 ? config_path : NULL;
    if (there && !overwrite) fatal("%s exists (an earlier export?): --overwrite replaces it", there);
    FILE* f = hf_open_temporary(0, st_path);
    safetensors_write_header(f, header, header_len, hf_temporaries[0]);
    float* scratch = (float*)mallocCheck(gpt2_tensor_numel(&c, gpt2_idx_wte()) * sizeof(float));
    uint16_t* half = (uint16_t*)mallocCheck(gpt2_tensor_numel(&c, gpt2_idx_wte()) * sizeof(uint16_t));
    for (int i = 0; i < NT; i++) {
        uint64_t rows, cols;
        hf_llmc_shape(&c, i, &rows, &cols);
        size_t n = (size_t)safetensors_numel(&tensors[i]);
        const float* src = dense + offsets[i];  // wte: its first V rows are the first n values
        if (hf_transposed(&c, i)) {
            hf_transpose(scratch, src, rows, cols);
            src = scratch;
        }
        if (bf16) {
            for (size_t j = 0; j < n; j++) half[j] = float_to_bf16(src[j]);
            fwriteCheck(half, sizeof(uint16_t), n, f, hf_temporaries[0]);
        } else {
            fwriteCheck(src, sizeof(float), n, f, hf_temporaries[0]);
        }
    }
    fcloseCheck(f, hf_temporaries[0]);
    hf_write_config(config_path, &c, bf16);
    hf_commit_temporary(0, st_path);
    hf_commit_temporary(1, config_path);
    printf("export: %s (L=%d C=%d NH=%d V=%d maxT=%d, %s) -> %s and %s\n", model, c.num_layers, c.channels,
           c.num_heads, c.vocab_size, c.max_seq_len, bf16 ? "BF16" : "F32", st_path, config_path);
    free(half);
    free(scratch);
    free(header);
    free(tensors);
    free(offsets);
    free(dense);
}

// ----------------------------------------------------------------------------
// import: config.json

// config.json's integer field key, required, in [min, max].
static int hf_config_int(const JsonValue* cfg, const char* key, const char* path, int min, int max) {
    const JsonValue* v = json_get(cfg, key);
    if (!v) fatal("%s: no \"%s\"", path, key);
    if (v->type != JSON_NUMBER || !v->is_integer) fatal("%s: \"%s\" is %s, expected an integer", path, key,
                                                        json_type_name(v->type));
    char field[64];
    snprintf(field, sizeof(field), "field %s", key);
    return (int)field_range_check(path, field, v->integer, min, max);
}

// A setting llm.c's GPT-2 has fixed: absent (GPT2Config's default is llm.c's) or equal to it.
static void hf_config_bool_is(const JsonValue* cfg, const char* key, int want, const char* path) {
    const JsonValue* v = json_get(cfg, key);
    if (v && (v->type != JSON_BOOL || v->boolean != want)) {
        fatal("%s: \"%s\" must be %s for llm.c's GPT-2", path, key, want ? "true" : "false");
    }
}

// The shape from config.json, and a refusal of any GPT-2 variant that llm.c's model
// cannot compute (another activation, LayerNorm epsilon, MLP width, attention scaling).
static void hf_read_config(const char* path, GPT2Config* c) {
    FILE* f = fopenCheck(path, "rb");
    long size = file_size_of(f, path);
    if (size > (1 << 20)) fatal("%s: %ld bytes, too large for a config.json", path, size);
    char* text = (char*)mallocCheck((size_t)size + 1);
    freadCheck(text, 1, (size_t)size, f, path);
    fcloseCheck(f, path);
    JsonValue cfg;
    json_parse(text, (size_t)size, path, &cfg);
    free(text);
    if (cfg.type != JSON_OBJECT) fatal("%s: not a JSON object", path);
    const JsonValue* type = json_get(&cfg, "model_type");
    if (type && (type->type != JSON_STRING || strcmp(type->string, "gpt2") != 0)) {
        fatal("%s: model_type is not \"gpt2\"", path);
    }
    c->num_layers = hf_config_int(&cfg, "n_layer", path, 1, MODEL_MAX_LAYERS);
    c->num_heads = hf_config_int(&cfg, "n_head", path, 1, MODEL_MAX_CHANNELS);
    c->channels = hf_config_int(&cfg, "n_embd", path, 1, MODEL_MAX_CHANNELS);
    c->vocab_size = hf_config_int(&cfg, "vocab_size", path, 1, MODEL_MAX_VOCAB);
    c->max_seq_len = hf_config_int(&cfg, "n_positions", path, 1, MODEL_MAX_SEQ_LEN);
    c->padded_vocab_size = gpt2_padded_vocab(c->vocab_size);
    gpt2_config_check(c, path);
    const JsonValue* inner = json_get(&cfg, "n_inner");
    if (inner && inner->type != JSON_NULL && !(inner->type == JSON_NUMBER && inner->number == 4.0 * c->channels)) {
        fatal("%s: \"n_inner\" must be null or 4 * n_embd = %d for llm.c's GPT-2", path, 4 * c->channels);
    }
    const JsonValue* act = json_get(&cfg, "activation_function");
    if (act && (act->type != JSON_STRING ||
                (strcmp(act->string, "gelu_new") != 0 && strcmp(act->string, "gelu_pytorch_tanh") != 0))) {
        fatal("%s: \"activation_function\" must be \"gelu_new\" (GPT-2's tanh GELU, as llm.c computes it)", path);
    }
    const JsonValue* eps = json_get(&cfg, "layer_norm_epsilon");
    if (eps && (eps->type != JSON_NUMBER || eps->number != LAYER_NORM_EPS)) {
        fatal("%s: \"layer_norm_epsilon\" must be 1e-05, as llm.c's LayerNorm uses", path);
    }
    hf_config_bool_is(&cfg, "scale_attn_weights", 1, path);
    hf_config_bool_is(&cfg, "tie_word_embeddings", 1, path);  // llm.c's classifier is wte
    hf_config_bool_is(&cfg, "scale_attn_by_inverse_layer_idx", 0, path);
    json_free(&cfg);
}

// ----------------------------------------------------------------------------
// import: tensors

enum { HF_IGNORED = -1, HF_LM_HEAD = -2, HF_UNKNOWN = -3 };

// The canonical index of HF tensor `name` (with or without the "transformer." prefix), or
// HF_IGNORED for the attention mask buffers of older checkpoints, HF_LM_HEAD, HF_UNKNOWN.
static int hf_tensor_index(const GPT2Config* c, const char* full_name, const char* path) {
    const char* name = full_name;
    if (strcmp(name, "lm_head.weight") == 0) return HF_LM_HEAD;
    if (strncmp(name, HF_PREFIX, strlen(HF_PREFIX)) == 0) name += strlen(HF_PREFIX);
    if (strcmp(name, "wte.weight") == 0) return gpt2_idx_wte();
    if (strcmp(name, "wpe.weight") == 0) return gpt2_idx_wpe();
    if (strcmp(name, "ln_f.weight") == 0) return gpt2_idx_lnfw(c);
    if (strcmp(name, "ln_f.bias") == 0) return gpt2_idx_lnfb(c);
    if (strncmp(name, "h.", 2) != 0) return HF_UNKNOWN;
    const char* dot = strchr(name + 2, '.');
    char digits[16];
    uint64_t layer;
    size_t nd = dot ? (size_t)(dot - (name + 2)) : 0;
    if (nd == 0 || nd >= sizeof(digits)) return HF_UNKNOWN;
    memcpy(digits, name + 2, nd);
    digits[nd] = '\0';
    if (!parse_u64_strict(digits, &layer) || (nd > 1 && digits[0] == '0')) return HF_UNKNOWN;
    const char* suffix = dot + 1;
    // Causal-mask buffers (not parameters) that checkpoints written by older transformers hold.
    int buffer = strcmp(suffix, "attn.bias") == 0 || strcmp(suffix, "attn.masked_bias") == 0;
    int kind = -1;
    for (int k = 0; k < LAYER_NUM_TENSORS && kind < 0; k++) {
        if (strcmp(suffix, HF_LAYER_TENSORS[k].suffix) == 0) kind = k;
    }
    if (!buffer && kind < 0) return HF_UNKNOWN;
    if (layer >= (uint64_t)c->num_layers) {
        fatal("%s: tensor '%s' is for layer %llu, but config.json has n_layer = %d", path, full_name,
              (unsigned long long)layer, c->num_layers);
    }
    return buffer ? HF_IGNORED : gpt2_idx_layer((int)layer, kind);
}

// Reads tensor t into canonical tensor idx of dense, checking its shape first, and unless
// allow_nonfinite that its values are finite (the index named is the file's, before any transpose).
static void hf_import_tensor(SafetensorsFile* sf, const SafetensorsTensor* t, const GPT2Config* c, int idx,
                             float* dst, float* scratch, int allow_nonfinite) {
    uint64_t want[2];
    int ndim;
    hf_shape(c, idx, want, &ndim);
    if (t->ndim != ndim || t->shape[0] != want[0] || (ndim == 2 && t->shape[1] != want[1])) {
        char have_text[128], want_text[128];
        fatal("%s: tensor '%s' has shape %s, expected %s for config.json's shape (L=%d C=%d V=%d n_positions=%d)",
              sf->path, t->name, safetensors_shape_text(t->shape, t->ndim, have_text, sizeof(have_text)),
              safetensors_shape_text(want, ndim, want_text, sizeof(want_text)), c->num_layers, c->channels,
              c->vocab_size, c->max_seq_len);
    }
    float* read = hf_transposed(c, idx) ? scratch : dst;
    safetensors_read_f32(sf, t, read);
    size_t n = (size_t)safetensors_numel(t), bad = floats_first_nonfinite(read, n);
    if (!allow_nonfinite && bad < n) {
        fatal("%s: tensor '%s' holds a non-finite value (%g) at index %zu: " HF_NONFINITE_HINT, sf->path, t->name,
              (double)read[bad], bad);
    }
    if (read == scratch) hf_transpose(dst, scratch, want[0], want[1]);
}

// A stored lm_head.weight must be the tied one: llm.c's logits use wte.
static void hf_check_lm_head(SafetensorsFile* sf, const SafetensorsTensor* t, const GPT2Config* c, const float* wte,
                             float* scratch) {
    uint64_t want[2];
    int ndim;
    hf_shape(c, gpt2_idx_wte(), want, &ndim);
    if (t->ndim != 2 || t->shape[0] != want[0] || t->shape[1] != want[1]) {
        fatal("%s: tensor 'lm_head.weight' is not shaped like wte (V x C = %d x %d)", sf->path, c->vocab_size,
              c->channels);
    }
    safetensors_read_f32(sf, t, scratch);
    if (memcmp(scratch, wte, (size_t)(want[0] * want[1]) * sizeof(float)) != 0) {
        fatal("%s: tensor 'lm_head.weight' differs from wte: an untied LM head, which llm.c's GPT-2 (logits from "
              "wte) cannot hold", sf->path);
    }
}

// IN (see the top) -> the safetensors file and the config.json beside it.
static void hf_resolve_import(const char* in, char* st_path, char* config_path) {
    struct stat st;
    if (stat(in, &st) != 0) fatal("cannot read '%s': %s", in, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        path_format(st_path, PATH_MAX_LEN, "%s/model.safetensors", in);
        path_format(config_path, PATH_MAX_LEN, "%s/config.json", in);
        return;
    }
    path_format(st_path, PATH_MAX_LEN, "%s", in);
    const char* slash = strrchr(in, '/');
    if (slash) path_format(config_path, PATH_MAX_LEN, "%.*s/config.json", (int)(slash - in), in);
    else path_format(config_path, PATH_MAX_LEN, "config.json");
}

static void hf_import(const char* in, const char* out, int bf16, int allow_nonfinite) {
    char st_path[PATH_MAX_LEN], config_path[PATH_MAX_LEN];
    hf_resolve_import(in, st_path, config_path);
    struct stat st;
    if (stat(out, &st) == 0 && !S_ISREG(st.st_mode)) fatal("output '%s' exists and is not a regular file", out);
    GPT2Config c;
    hf_read_config(config_path, &c);
    SafetensorsFile sf;
    safetensors_open(st_path, &sf);

    int NT = gpt2_num_tensors(&c);
    const SafetensorsTensor** found = (const SafetensorsTensor**)callocCheck((size_t)NT, sizeof(void*));
    const SafetensorsTensor* lm_head = NULL;
    for (int k = 0; k < sf.count; k++) {
        const SafetensorsTensor* t = &sf.tensors[k];
        int idx = hf_tensor_index(&c, t->name, st_path);
        if (idx == HF_UNKNOWN) fatal("%s: unknown tensor '%s' (not part of GPT-2's layout)", st_path, t->name);
        if (idx == HF_IGNORED) continue;
        if (idx == HF_LM_HEAD) {
            lm_head = t;
            continue;
        }
        if (found[idx]) fatal("%s: tensors '%s' and '%s' are the same parameter", st_path, found[idx]->name, t->name);
        found[idx] = t;
    }
    for (int i = 0; i < NT; i++) {
        char name[128];
        if (!found[i]) fatal("%s: tensor '%s' is missing (with or without the '" HF_PREFIX "' prefix)", st_path,
                             hf_tensor_name(&c, i, name, sizeof(name)));
    }
    size_t* offsets = (size_t*)mallocCheck((size_t)NT * sizeof(size_t));
    // calloc: the padded vocabulary rows V..Vp-1 of wte stay zero.
    float* dense = (float*)callocCheck(gpt2_tensor_offsets_dense(&c, offsets), sizeof(float));
    float* scratch = (float*)mallocCheck(gpt2_tensor_numel(&c, gpt2_idx_wte()) * sizeof(float));
    for (int i = 0; i < NT; i++) hf_import_tensor(&sf, found[i], &c, i, dense + offsets[i], scratch, allow_nonfinite);
    if (lm_head) hf_check_lm_head(&sf, lm_head, &c, dense, scratch);
    safetensors_close(&sf);

    int version = bf16 ? MODEL_VERSION_BF16 : MODEL_VERSION_FP32;
    path_format(hf_temporaries[0], PATH_MAX_LEN, "%s.tmp", out);  // gpt2_model_file_write's temporary
    gpt2_model_file_write(out, &c, dense, version);
    hf_temporaries[0][0] = '\0';
    printf("import: %s (L=%d C=%d NH=%d V=%d maxT=%d) -> %s (version %d, Vp=%d)\n", st_path, c.num_layers,
           c.channels, c.num_heads, c.vocab_size, c.max_seq_len, out, version, c.padded_vocab_size);
    free(scratch);
    free(dense);
    free(offsets);
    free(found);
}

// ----------------------------------------------------------------------------

static void hf_usage(FILE* f) {
    fprintf(f,
            "usage: hf_convert export IN OUT_DIR [--dtype fp32|bf16] [--allow-nonfinite] [--overwrite]\n"
            "         IN: llm.c model file, checkpoint directory, or run directory (newest checkpoint)\n"
            "         writes OUT_DIR/model.safetensors and OUT_DIR/config.json (transformers' GPT2LMHeadModel)\n"
            "       hf_convert import IN OUT.bin [--dtype fp32|bf16] [--allow-nonfinite]\n"
            "         IN: directory with model.safetensors and config.json, or a .safetensors file beside config.json\n"
            "         writes an llm.c model file (version 3 fp32, or 5 bf16) for the trainers' -e\n"
            "       --allow-nonfinite: convert weights that hold NaN or infinity (refused by default)\n"
            "       --overwrite: replace an export already in OUT_DIR (refused by default)\n");
}

int main(int argc, char** argv) {
    atexit(hf_remove_temporaries);
    files_size_limit_fails_writes();
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        hf_usage(stdout);
        return 0;
    }
    const char* positional[3];
    int npos = 0, bf16 = 0, allow_nonfinite = 0, overwrite = 0;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--allow-nonfinite") == 0) {
            allow_nonfinite = 1;
        } else if (strcmp(argv[a], "--overwrite") == 0) {
            overwrite = 1;
        } else if (strcmp(argv[a], "--dtype") == 0) {
            if (a + 1 >= argc) fatal("--dtype needs a value (fp32|bf16)");
            cli_choice("--dtype", argv[++a], "fp32|bf16");
            bf16 = strcmp(argv[a], "bf16") == 0;
        } else if (argv[a][0] == '-' && argv[a][1] == '-') {
            fatal("unknown option '%s' (see hf_convert -h)", argv[a]);
        } else if (npos < 3) {
            positional[npos++] = argv[a];
        } else {
            fatal("too many arguments (see hf_convert -h)");
        }
    }
    if (npos != 3 || (strcmp(positional[0], "export") != 0 && strcmp(positional[0], "import") != 0)) {
        hf_usage(stderr);
        fatal("expected 'export IN OUT_DIR' or 'import IN OUT.bin'");
    }
    if (strcmp(positional[0], "export") == 0) hf_export(positional[1], positional[2], bf16, allow_nonfinite, overwrite);
    else hf_import(positional[1], positional[2], bf16, allow_nonfinite);
    return 0;
}
