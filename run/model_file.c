// run/model_file.c: what run/model_file.h declares.
#include "run/model_file.h"

static size_t gpt2_model_elem_bytes(int version) { return version == MODEL_VERSION_FP32 ? 4 : 2; }

size_t gpt2_tensor_offsets_dense(const GPT2Config* c, size_t* offsets) {
    size_t off = 0;
    for (int i = 0; i < gpt2_num_tensors(c); i++) {
        offsets[i] = off;
        off += gpt2_tensor_numel(c, i);
    }
    return off;
}

size_t floats_first_nonfinite(const float* x, size_t n) {
    const size_t block = 1024;
    for (size_t at = 0; at < n; at += block) {
        size_t end = n - at < block ? n : at + block;
        uint32_t any = 0;
        for (size_t j = at; j < end; j++) {
            uint32_t bits;
            memcpy(&bits, &x[j], sizeof(bits));
            any |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
        }
        if (!any) continue;
        for (size_t j = at; j < end; j++) {
            if (!isfinite(x[j])) return j;
        }
    }
    return n;
}

void gpt2_dense_check_finite(const GPT2Config* c, const float* dense, const char* what, const char* why) {
    size_t off = 0;
    for (int i = 0; i < gpt2_num_tensors(c); i++) {
        size_t n = gpt2_tensor_numel(c, i), j = floats_first_nonfinite(dense + off, n);
        if (j < n) {
            char name[64];
            fatal("%s: tensor %s holds a non-finite value (%g) at element %zu: %s", what,
                  gpt2_tensor_name(c, i, name, sizeof(name)), (double)dense[off + j], j, why);
        }
        off += n;
    }
}

void gpt2_config_check(const GPT2Config* c, const char* what) {
    field_range_check(what, "header field maxT", c->max_seq_len, 1, MODEL_MAX_SEQ_LEN);
    field_range_check(what, "header field V", c->vocab_size, 1, MODEL_MAX_VOCAB);
    field_range_check(what, "header field L", c->num_layers, 1, MODEL_MAX_LAYERS);
    field_range_check(what, "header field C", c->channels, 1, MODEL_MAX_CHANNELS);
    field_range_check(what, "header field NH", c->num_heads, 1, c->channels);
    if (c->channels % c->num_heads != 0) fatal("%s: C=%d is not divisible by NH=%d", what, c->channels, c->num_heads);
    field_range_check(what, "header field Vp", c->padded_vocab_size, c->vocab_size, MODEL_MAX_PADDED_VOCAB);
    if (c->padded_vocab_size % MODEL_VOCAB_ALIGN != 0) {
        fatal("%s: header field Vp = %d is not a multiple of %d", what, c->padded_vocab_size, MODEL_VOCAB_ALIGN);
    }
}

int gpt2_config_equal(const GPT2Config* a, const GPT2Config* b) {
    return a->max_seq_len == b->max_seq_len && a->vocab_size == b->vocab_size &&
           a->padded_vocab_size == b->padded_vocab_size && a->num_layers == b->num_layers &&
           a->num_heads == b->num_heads && a->channels == b->channels;
}

void gpt2_dense_reorder(const GPT2Config* cfg, float* dst, const float* src, int to_file) {
    int NT = gpt2_num_tensors(cfg);
    size_t* canonical = (size_t*)mallocCheck(NT * sizeof(size_t));
    size_t* file = (size_t*)mallocCheck(NT * sizeof(size_t));
    gpt2_tensor_offsets_dense(cfg, canonical);
    int* by_file = (int*)mallocCheck(NT * sizeof(int));
    for (int i = 0; i < NT; i++) by_file[gpt2_file_index(cfg, i)] = i;
    size_t off = 0;
    for (int k = 0; k < NT; k++) {
        file[by_file[k]] = off;
        off += gpt2_tensor_numel(cfg, by_file[k]);
    }
    for (int i = 0; i < NT; i++) {
        size_t n = gpt2_tensor_numel(cfg, i);
        if (to_file) memcpy(dst + file[i], src + canonical[i], n * sizeof(float));
        else memcpy(dst + canonical[i], src + file[i], n * sizeof(float));
    }
    free(by_file);
    free(file);
    free(canonical);
}

// Reads and checks a model file's header: magic, version, every shape field in range,
// and a file size exact for that shape, so nothing is allocated for a file that cannot
// hold it. Fills cfg and *version; returns the parameter count; leaves f after the header.
static size_t gpt2_model_file_header(FILE* f, const char* path, GPT2Config* cfg, int* version) {
    long size = file_size_of(f, path);
    int header[MODEL_HEADER_INTS];
    if (size < (long)sizeof(header)) fatal("%s: too small to be a model file (%ld bytes)", path, size);
    freadCheck(header, sizeof(int), MODEL_HEADER_INTS, f, path);
    if (header[0] != MODEL_MAGIC) fatal("%s: not a GPT-2 model file (magic %d, expected %d)", path, header[0], MODEL_MAGIC);
    if (header[1] != MODEL_VERSION_FP32 && header[1] != MODEL_VERSION_BF16) {
        fatal("%s: unsupported model version %d (3 = fp32, 5 = bf16)", path, header[1]);
    }
    cfg->max_seq_len = header[2];
    cfg->vocab_size = header[3];
    cfg->num_layers = header[4];
    cfg->num_heads = header[5];
    cfg->channels = header[6];
    cfg->padded_vocab_size = header[7];
    gpt2_config_check(cfg, path);
    *version = header[1];
    size_t n = gpt2_num_parameters(cfg);
    size_t expected = size_add_check(sizeof(header), size_mul_check(n, gpt2_model_elem_bytes(*version), path), path);
    if ((size_t)size != expected) {
        fatal("%s: expected %zu bytes for this shape (L=%d C=%d V=%d Vp=%d maxT=%d), found %ld (truncated or "
              "corrupt)", path, expected, cfg->num_layers, cfg->channels, cfg->vocab_size, cfg->padded_vocab_size,
              cfg->max_seq_len, size);
    }
    return n;
}

void gpt2_model_file_shape(const char* path, GPT2Config* cfg) {
    FILE* f = fopenCheck(path, "rb");
    int version;
    gpt2_model_file_header(f, path, cfg, &version);
    fcloseCheck(f, path);
}

float* gpt2_model_file_read(const char* path, GPT2Config* cfg, int* version) {
    FILE* f = fopenCheck(path, "rb");
    size_t n = gpt2_model_file_header(f, path, cfg, version);
    size_t elem = gpt2_model_elem_bytes(*version);
    // The file is tensor-major: read it whole, then reorder into canonical order.
    float* file_order = (float*)mallocCheck(n * sizeof(float));
    if (elem == 4) {
        freadCheck(file_order, sizeof(float), n, f, path);
    } else {
        uint16_t* tmp = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
        freadCheck(tmp, sizeof(uint16_t), n, f, path);
        for (size_t j = 0; j < n; j++) file_order[j] = bf16_to_float(tmp[j]);
        free(tmp);
    }
    float* dense = (float*)mallocCheck(n * sizeof(float));
    gpt2_dense_reorder(cfg, dense, file_order, 0);
    free(file_order);
    fcloseCheck(f, path);
    return dense;
}

void gpt2_model_file_header_for(const GPT2Config* cfg, int version, int header[MODEL_HEADER_INTS]) {
    memset(header, 0, MODEL_HEADER_INTS * sizeof(int));
    header[0] = MODEL_MAGIC;
    header[1] = version;
    header[2] = cfg->max_seq_len;
    header[3] = cfg->vocab_size;
    header[4] = cfg->num_layers;
    header[5] = cfg->num_heads;
    header[6] = cfg->channels;
    header[7] = cfg->padded_vocab_size;
}

void gpt2_model_file_write(const char* path, const GPT2Config* cfg, const float* dense, int version) {
    char tmp_path[PATH_MAX_LEN];
    path_format(tmp_path, sizeof(tmp_path), "%s.tmp", path);
    FILE* f = fopenCheck(tmp_path, "wb");
    int header[MODEL_HEADER_INTS];
    gpt2_model_file_header_for(cfg, version, header);
    fwriteCheck(header, sizeof(int), MODEL_HEADER_INTS, f, tmp_path);
    size_t n = gpt2_num_parameters(cfg);
    float* file_order = (float*)mallocCheck(n * sizeof(float));
    gpt2_dense_reorder(cfg, file_order, dense, 1);
    if (version == MODEL_VERSION_FP32) {
        fwriteCheck(file_order, sizeof(float), n, f, tmp_path);
    } else {
        uint16_t* tmp = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
        for (size_t j = 0; j < n; j++) tmp[j] = float_to_bf16(file_order[j]);
        fwriteCheck(tmp, sizeof(uint16_t), n, f, tmp_path);
        free(tmp);
    }
    free(file_order);
    fcloseCheck(f, tmp_path);
    if (rename(tmp_path, path) != 0) fatal("cannot rename %s to %s: %s", tmp_path, path, strerror(errno));
}

void gpt2_init_random(const GPT2Config* cfg, float* dense, uint64_t seed) {
    int NT = gpt2_num_tensors(cfg);
    uint64_t state = rng_seed(seed);
    float residual_std = 0.02f / sqrtf(2.0f * cfg->num_layers);
    size_t off = 0;
    for (int i = 0; i < NT; i++) {
        size_t numel = gpt2_tensor_numel(cfg, i);
        float* t = dense + off;
        int kind = (i >= 2 && i < gpt2_idx_lnfw(cfg)) ? (i - 2) % LAYER_NUM_TENSORS : -1;
        int is_ln_weight = kind == LAYER_LN1W || kind == LAYER_LN2W || i == gpt2_idx_lnfw(cfg);
        if (is_ln_weight) {
            for (size_t j = 0; j < numel; j++) t[j] = 1.0f;
        } else if (gpt2_tensor_decays(cfg, i)) {
            float std = (kind == LAYER_ATTPROJW || kind == LAYER_FCPROJW) ? residual_std : 0.02f;
            for (size_t j = 0; j < numel; j++) t[j] = std * rng_normal(&state);
        } else {
            for (size_t j = 0; j < numel; j++) t[j] = 0.0f;
        }
        off += numel;
    }
    // wte rows beyond the real vocabulary never receive gradient; keep them at zero.
    size_t C = (size_t)cfg->channels;
    for (size_t j = (size_t)cfg->vocab_size * C; j < (size_t)cfg->padded_vocab_size * C; j++) dense[j] = 0.0f;
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
    if (!model_descriptor(model, mc)) gpt2_model_file_shape(model, mc);
}

float* load_initial_weights(const char* model, uint64_t seed, int resuming, GPT2Config* mc) {
    if (resuming) {
        model_shape_of(model, mc);
        return NULL;
    }
    if (model_descriptor(model, mc)) {
        float* dense = (float*)mallocCheck(gpt2_num_parameters(mc) * sizeof(float));
        gpt2_init_random(mc, dense, seed);
        return dense;
    }
    int version;
    float* dense = gpt2_model_file_read(model, mc, &version);
    gpt2_dense_check_finite(mc, dense, model, "a model with non-finite weights cannot train");
    return dense;
}
