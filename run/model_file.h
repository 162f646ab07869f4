/*
 * llm.c model files: int32 header[256] (magic 20240326; version 3 = fp32 or 5 = bf16;
 * maxT, V, L, NH, C, Vp), then every parameter in llm.c's tensor-major order.
 *
 * In memory, this module speaks "dense canonical" arrays: the tensors in canonical
 * (layer-major) order, back to back, fp32. Trainers scatter that into their own buffer
 * layout (zero1/ adds alignment and padding) with gpt2_tensor_offsets_dense().
 */
#ifndef RUN_MODEL_FILE_H
#define RUN_MODEL_FILE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "llmc/bf16.h"
#include "llmc/gpt2_spec.h"
#include "llmc/rng.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_MAGIC 20240326
#define MODEL_VERSION_FP32 3
#define MODEL_VERSION_BF16 5
#define MODEL_HEADER_INTS 256

// offsets[i] = start of canonical tensor i in a dense canonical array; returns the total.
size_t gpt2_tensor_offsets_dense(const GPT2Config* c, size_t* offsets);

// The index of the first NaN or infinity in x[0..n), or n when every value is finite. The
// exponent test runs over blocks without a branch (vectorised), so a scan costs about one
// read of the data; the block that holds one is searched again.
size_t floats_first_nonfinite(const float* x, size_t n);

// Stops with one error naming the first tensor (llm.c's name) of a dense canonical array
// that holds a NaN or infinity, its element and value; what: the file, why: the consequence.
void gpt2_dense_check_finite(const GPT2Config* c, const float* dense, const char* what, const char* why);

// Bounds on a model's shape, checked before any size arithmetic. Generous: GPT-2 XL is
// maxT=1024 V=50257 Vp=50304 L=48 NH=25 C=1600, and these leave 20x or more of headroom
// in L, C and maxT (uint16 token ids cap V, and Vp follows V). Within them every tensor
// has fewer than 2^37 elements and a model fewer than 2^46, so element counts cannot
// overflow a 64-bit size_t; byte counts are still computed with checks.
#define MODEL_MAX_SEQ_LEN (1 << 20)     // maxT
#define MODEL_MAX_VOCAB 65536           // V: token shards hold uint16 ids
#define MODEL_MAX_PADDED_VOCAB 131072   // Vp: a multiple of 128 (llm.c pads V to one), >= V
#define MODEL_MAX_LAYERS 1024           // L
#define MODEL_MAX_CHANNELS 65536        // C (NH divides it, so NH <= C)
#define MODEL_VOCAB_ALIGN 128

#ifdef __cplusplus
static_assert(sizeof(size_t) >= 8, "model sizes need a 64-bit size_t");
#else
_Static_assert(sizeof(size_t) >= 8, "model sizes need a 64-bit size_t");
#endif

// what: the file (or descriptor) the shape came from, for the message.
void gpt2_config_check(const GPT2Config* c, const char* what);

// Reorders a dense canonical array into llm.c's tensor-major file order (to_file = 1) or
// back (to_file = 0). dst and src must not overlap.
void gpt2_dense_reorder(const GPT2Config* cfg, float* dst, const float* src, int to_file);

// The shape of a model file, checked, without reading its parameters.
void gpt2_model_file_shape(const char* path, GPT2Config* cfg);

// Reads a model file into a new dense canonical fp32 array; fills cfg and *version.
float* gpt2_model_file_read(const char* path, GPT2Config* cfg, int* version);

// Writes a dense canonical array as a model file (version 3 or 5), atomically:
// to path.tmp first, renamed over path only when complete.
void gpt2_model_file_write(const char* path, const GPT2Config* cfg, const float* dense, int version);

// GPT-2 initialisation into a dense canonical array: weights N(0, 0.02), residual
// projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1, padded vocab rows 0.
// Every rank draws the same numbers from the same seed.
void gpt2_init_random(const GPT2Config* cfg, float* dense, uint64_t seed);

// 1 when two shapes are the same model (every header field).
int gpt2_config_equal(const GPT2Config* a, const GPT2Config* b);

// The header of a model file of shape cfg (version 3 or 5).
void gpt2_model_file_header_for(const GPT2Config* cfg, int version, int header[MODEL_HEADER_INTS]);


// Descriptors dN are GPT-2s: its vocabulary and context length.
#define DESCRIPTOR_VOCAB 50257
#define DESCRIPTOR_MAX_SEQ_LEN 1024

// 1 when -e is a descriptor dN (mc filled and checked), 0 when it names a file; a "dN"
// whose depth is out of range is an error, not a file name to look for.
int model_descriptor(const char* model, GPT2Config* mc);

// The shape of -e without its weights: a descriptor's, or a model file's header (checked).
void model_shape_of(const char* model, GPT2Config* mc);

// The model of -e: an llm.c model file, or a descriptor dN initialised from seed. Every
// rank does the same. Returns a dense canonical fp32 array; NULL when resuming (-y found a
// checkpoint, and model is its model.bin: run/checkpoint_io.h), which loads each rank's
// pieces instead and needs only the shape here.
float* load_initial_weights(const char* model, uint64_t seed, int resuming, GPT2Config* mc);

#ifdef __cplusplus
}
#endif
#endif
