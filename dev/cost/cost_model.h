/*
 * A FLOP and byte count of one GPU training step (llmc/gpt2_cuda.cuh's kernels), and the
 * roofline time it predicts: the cost model behind `gpt2_cost` (dev/cost/gpt2_cost.c).
 * Plain C, header only, no CUDA.
 *
 * One row per kernel (or per cuBLASLt call) of the forward, the backward and the optimizer,
 * with its FLOPs and the bytes it moves to and from HBM (read + written), counted from what
 * the kernel in llmc/ (the .cuh files) reads and writes. Rows marked per_layer run once per
 * transformer block. The path is GPT2Kernels (llmc/gpt2_kernels.h):
 *   naive (--attention naive --fused-kernels 0 -r 0): the kernels of llmc/ (.cuh) as they
 *     stand: permutes + cuBLAS strided-batched gemms over fp32 (B,NH,T,T) scores and floatX
 *     probabilities (llmc/attention.cuh), GELU, residual adds, bias gradients and the
 *     classifier's softmax/cross-entropy as passes of their own;
 *   new (--attention flash --fused-kernels 1 -r 1), the trainer's default kernels:
 *     flash attention: the forward reads qkv (B,T,3C) and writes out (B,T,C) and the
 *       logsumexp (B,NH,T) fp32; the backward is a preprocessing pass D = rowsum(dout*out),
 *       then two passes that recompute P per tile (S = QK^T, dP = dout V^T): one over key
 *       tiles for dK, dV (4 tile matmuls: S, dP, dV, dK), one over query tiles for dQ (3:
 *       S, dP, dQ), deterministic (no atomics, as the rest of the trainer); tiles of
 *       COST_FLASH_FWD_ROWS x COST_FLASH_FWD_COLS forward, COST_FLASH_BWD_TILE square backward,
 *       key tiles above the diagonal skipped, the tiles it crosses computed in full;
 *     fused (--fused-kernels 1): GELU in the fc matmul's cuBLASLt epilogue (GELU_AUX_BIAS:
 *       writes the GELU output and the pre-activation aux), DGELU in the epilogue of the
 *       fcproj backward's dinp matmul (reads the aux), bias gradients from the dweight
 *       matmul's BGRADB epilogue (no separate reduction pass), the classifier's softmax,
 *       cross-entropy and dlogits in one pass in the forward (one read of the logits, the
 *       row held on chip, dlogits written in place), the residual add fused into the next
 *       LayerNorm's forward (reads both addends, writes the sum and the normalised row);
 *     -r 1: the GELU output is recomputed from the aux in the backward (one extra GELU
 *       pass) instead of being kept per layer.
 *   cudnn attention is counted as the flash kernels (cuDNN's own tiling is not modelled).
 *
 * Counting rules (assumptions):
 *   - a cuBLASLt matmul reads each operand once and writes D once (plus C when beta = 1):
 *     ideal tiling, reuse in L2/shared memory; FLOPs = 2 M N K, on the tensor cores;
 *   - a row a kernel reads again (LayerNorm's three passes over C, the naive softmax's over
 *     T) is counted once when it is at most COST_ONCHIP_ROW_BYTES: it stays in L1/L2; the
 *     unfused classifier's two passes over a V-wide row (about 100 KB) count twice;
 *   - small tensors read by every block (wpe, LayerNorm weights, flash's K/V tiles of one
 *     head, about 2*T*hs*2 bytes) are read from HBM once;
 *   - the encoder's backward touches min(B*T, V) distinct dwte rows (an upper bound);
 *   - elementwise FLOPs are nominal (a few per element, on the fp32 CUDA cores): those
 *     kernels are bandwidth-bound by one to two orders of magnitude;
 *   - host work (descriptor set-up, the encoder plan, input uploads) overlaps the GPU and
 *     is not counted; one micro-step per optimizer step (no gradient accumulation).
 * Roofline time of a kernel = max(tc_flops / tensor peak + cc_flops / fp32 peak,
 * bytes / HBM bandwidth). The "achievable" time (CostEfficiency) divides the tensor-core
 * term by the fraction of peak that kind of kernel reaches (cuBLASLt GEMMs; our flash
 * tiles, WMMA = mma.sync, which FlashAttention-2 shows reaching about 35% of an H100's
 * dense peak; cuDNN) and the byte term by a fraction of the bandwidth, and adds a fixed
 * time per kernel launch (the gap between back-to-back kernels on one stream).
 *
 * Measured inputs of the achievable time (CostMeasurements; gpt2_cost --profile,
 * --occupancy), for the rows whose kernels of llmc/ they cover (`covers`), the rest assumed:
 *   - the CPU layer's profiler (docs/cuda_cpu.md, "Sanitizer and profiler"; a BF16 build's
 *     test_kernels_cuda): the bytes are those the kernels' warps move in whole 32-byte
 *     sectors, bytes x sectors / ideal sectors (a strided or scalar access pays for the
 *     sectors it touches, not the bytes it uses; no cache is modelled); for the flash rows
 *     the shared-memory wavefronts per tensor-core FLOP (the test's d12-shaped head,
 *     hs 64 at T 1024, holds most of its FLOPs), at one wavefront per clock per SM, a third
 *     bound beside FLOPs and bytes (bank conflicts make it the first);
 *   - the real compiler's blocks per SM (dev/test/check_compiler_report.py --json, BF16):
 *     for the rows whose grid is known here (the flash kernels), the last partial wave of
 *     blocks takes a whole wave's time: x ceil(waves) / waves.
 */
#ifndef LLMC_COST_MODEL_H
#define LLMC_COST_MODEL_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "llmc/gpt2_kernels.h"
#include "llmc/gpt2_spec.h"

// Flash tiles of the BF16 build (llmc/attention_flash.cuh: FLASH_QUERY_TILE x
// FLASH_KEY_TILE forward, FLASH_BWD_TILE square backward; dev/test/cost_reference.py reads
// them from that header and fails if these differ).
#define COST_FLASH_FWD_ROWS 64
#define COST_FLASH_FWD_COLS 32
#define COST_FLASH_BWD_TILE 32
// The flash kernels' instances (llmc/attention_flash.cuh): <64> for head sizes up to 64
// (every GPT-2), <128> above; the measured inputs are those of the instance the model runs.
#define COST_FLASH_HS_SMALL 64
#define COST_ONCHIP_ROW_BYTES 32768     // a row re-read within one kernel up to this size costs one HBM read
#define COST_COLREDUCE_ROWS 64          // llmc/layernorm.cuh's colreduce_num_chunks(), the bias/LN partials
#define COST_COLREDUCE_MAX_CHUNKS 256
#define COST_MAX_KERNELS 96

enum { COST_FWD = 0, COST_BWD = 1, COST_OPT = 2 };

typedef struct {
    const char* name;
    double tensor_core_tflops;  // dense bf16, no sparsity
    double fp32_tflops;         // CUDA cores, non-tensor fp32
    double hbm_tbs;             // TB/s
    int sms;
} CostGPU;

// H100 SXM5 and H200 (the same GH100 chip, 132 SMs; the H200 has HBM3e): NVIDIA's data sheets.
static const CostGPU COST_GPUS[] = {
    {"H100", 989.0, 67.0, 3.35, 132},
    {"H200", 989.0, 67.0, 4.8, 132},
};
#define COST_NUM_GPUS 2
// sm_90's tensor cores: 4 per SM, 1024 dense bf16 FLOPs a clock each; the clock of the data
// sheet's peak follows (1.83 GHz). Shared memory: 32 banks of 4 bytes, one wavefront a clock.
#define COST_TC_FLOPS_PER_SM_CLOCK 4096.0
static inline double cost_sm_clock_hz(const CostGPU* g) {
    return g->tensor_core_tflops * 1e12 / (g->sms * COST_TC_FLOPS_PER_SM_CLOCK);
}

// The "achievable" estimate: fractions of the peaks that kernels of each kind reach.
enum { COST_EFF_GEMM = 0, COST_EFF_FLASH = 1, COST_EFF_CUDNN = 2 };
typedef struct {
    double tensor[3];   // of the tensor-core peak, by COST_EFF_*: cuBLASLt GEMMs, our flash tiles, cuDNN
    double bandwidth;   // of the HBM bandwidth
    double launch_us;   // per kernel launch
    int measured;       // 1: the kernels' measured inputs apply (sectors, wavefronts, waves)
} CostEfficiency;

// The roofline: every peak reached, launches free, every access ideal.
static const CostEfficiency COST_ROOFLINE = {{1.0, 1.0, 1.0}, 1.0, 0.0, 0};

// What was measured of one kernel of llmc/ (gpt2_cost reads it from the files).
typedef struct {
    char kernel[64];
    double sectors, ideal_sectors;  // global loads + stores, in 32-byte sectors (profiler)
    double wavefronts, wmma_flops;  // shared loads + stores in wavefronts; WMMA FLOPs (profiler)
    int profiled;                   // the profile has it
    int blocks_per_sm;              // the compiler's, at the launch's block (0: not known)
} CostMeasured;
#define COST_MAX_MEASURED 160
typedef struct {
    CostMeasured k[COST_MAX_MEASURED];
    int n;
    int instance;  // the flash kernels' template argument that applies (COST_FLASH_HS_SMALL or 128)
} CostMeasurements;
enum { COST_MEASURED_PROFILE = 1, COST_MEASURED_COMPILER = 2 };

typedef struct {
    char name[64];
    int phase;          // COST_FWD / COST_BWD / COST_OPT
    int eff_class;      // COST_EFF_*: which tensor-core efficiency the achievable estimate applies
    int block;          // llmc/model_hooks.h's block: -1 embeddings, 0..L-1, L lnf+classifier; per_layer: 0
    int per_layer;      // 1: once in every transformer block (the figures below are one block's)
    double tc_flops;    // tensor-core FLOPs, one instance
    double cc_flops;    // CUDA-core FLOPs, one instance
    double bytes;       // HBM bytes read + written, one instance
    double launches;    // kernel launches, one instance
    char covers[160];   // the kernels of llmc/ it counts, comma-separated ("": cuBLAS, memset)
    double grid;        // blocks of one launch (0: not counted)
    // Measured (cost_apply_measurements); the neutral values otherwise.
    unsigned measured;          // COST_MEASURED_* bits
    double sector_factor;       // sectors / ideal sectors: 1
    double shared_wavefronts;   // one instance: 0
    int blocks_per_sm;          // 0
} CostKernel;

typedef struct {
    GPT2Config cfg;
    int B, T;
    GPT2Kernels kernels;
    int act_bytes;      // floatX: 2 (bf16, the GPU default)
    int zero_stage;     // 0 replicated AdamW over all N, 1 ZeRO-1 over the rank's owned elements
    int dp;
    double opt_numel;   // elements in the grad/param buffers (the ZeRO-1 layout pads them)
    const CostMeasurements* measured;  // NULL: nothing measured
} CostSetup;

typedef struct {
    CostKernel k[COST_MAX_KERNELS];
    int n;
} CostList;

static inline void cost_add(CostList* l, int phase, int block, int per_layer, const char* name, double tc_flops,
                            double cc_flops, double bytes, double launches) {
    if (l->n >= COST_MAX_KERNELS) return;  // cannot happen: the list below has fewer rows
    CostKernel* k = &l->k[l->n++];
    snprintf(k->name, sizeof(k->name), "%s", name);
    k->phase = phase;
    k->block = block;
    k->per_layer = per_layer;
    k->tc_flops = tc_flops;
    k->cc_flops = cc_flops;
    k->bytes = bytes;
    k->launches = launches;
    k->sector_factor = 1;
}

// The last row counts these kernels of llmc/ (comma-separated), launched with grid blocks (0: not counted).
static inline void cost_covers(CostList* l, const char* kernels, double grid) {
    CostKernel* k = &l->k[l->n - 1];
    snprintf(k->covers, sizeof(k->covers), "%s", kernels);
    k->grid = grid;
}

static inline const CostMeasured* cost_find_measured(const CostMeasurements* m, const char* kernel, size_t len) {
    for (int i = 0; i < m->n; i++) {
        if (strlen(m->k[i].kernel) == len && strncmp(m->k[i].kernel, kernel, len) == 0) return &m->k[i];
    }
    return NULL;
}

// The measured inputs of the rows whose kernels m has (cost_model.h's header says how).
static inline void cost_apply_measurements(CostList* l, const CostMeasurements* m) {
    for (int i = 0; i < l->n; i++) {
        CostKernel* k = &l->k[i];
        double sectors = 0, ideal = 0, wavefronts = 0, wmma = 0;
        int profiled = 0;
        for (const char* p = k->covers; *p;) {
            size_t len = strcspn(p, ",");
            const CostMeasured* x = cost_find_measured(m, p, len);
            if (x && x->profiled) {
                profiled = 1;
                sectors += x->sectors;
                ideal += x->ideal_sectors;
                wavefronts += x->wavefronts;
                wmma += x->wmma_flops;
            }
            if (x && x->blocks_per_sm > 0 && k->blocks_per_sm == 0 && k->grid > 0) {
                k->blocks_per_sm = x->blocks_per_sm;
                k->measured |= COST_MEASURED_COMPILER;
            }
            p += len + (p[len] == ',');
        }
        if (profiled && ideal > 0) {
            k->sector_factor = sectors / ideal;
            k->measured |= COST_MEASURED_PROFILE;
        }
        if (profiled && wmma > 0 && k->tc_flops > 0) k->shared_wavefronts = k->tc_flops * wavefronts / wmma;
    }
}

static inline double cost_ceil_div(double a, double b) { return ceil(a / b); }

static inline double cost_colreduce_chunks(double rows) {
    double n = (double)(((long long)rows + COST_COLREDUCE_ROWS - 1) / COST_COLREDUCE_ROWS);
    return n < COST_COLREDUCE_MAX_CHUNKS ? n : COST_COLREDUCE_MAX_CHUNKS;
}

// Query/key pairs the tiles compute: for each query tile (rows_tile rows, the last one
// partial), every key up to the end of the last key tile (cols_tile) that reaches its last
// row; key tiles wholly above the diagonal are skipped.
static inline double cost_flash_tile_area(int T, int rows_tile, int cols_tile) {
    double area = 0;
    for (int q0 = 0; q0 < T; q0 += rows_tile) {
        int q1 = q0 + rows_tile < T ? q0 + rows_tile : T;           // one past the tile's last row
        int keys = (q1 + cols_tile - 1) / cols_tile * cols_tile;  // through the last key tile it needs
        area += (double)(q1 - q0) * (keys < T ? keys : T);
    }
    return area;
}

// A linear layer (llmc/matmul.cuh): out (BT,OC) = inp (BT,IC) W^T + bias. Forward, or the
// backward's two matmuls and its bias gradient. X = activation bytes.
static inline void cost_linear_forward(CostList* l, int block, int per_layer, const char* name, double BT, double IC,
                                       double OC, int has_bias, double extra_out_bytes, double X) {
    char s[64];
    snprintf(s, sizeof(s), "matmul %s", name);
    cost_add(l, COST_FWD, block, per_layer, s, 2 * BT * IC * OC, 0,
             BT * IC * X + OC * IC * X + (has_bias ? OC * X : 0) + BT * OC * X + extra_out_bytes, 1);
}

static inline void cost_linear_backward(CostList* l, int block, int per_layer, const char* name, double BT, double IC,
                                        double OC, int has_bias, int fused, double dinp_extra_bytes, double X) {
    char s[64];
    snprintf(s, sizeof(s), "matmul %s dinp", name);
    // dinp (BT,IC) = dout (BT,OC) W (OC,IC), overwritten
    cost_add(l, COST_BWD, block, per_layer, s, 2 * BT * OC * IC, 0,
             BT * OC * X + OC * IC * X + BT * IC * X + dinp_extra_bytes, 1);
    snprintf(s, sizeof(s), "matmul %s dweight%s", name, has_bias && fused ? " +BGRADB" : "");
    // dW (OC,IC) += dout^T inp: fp32 C read and D written (beta = 1); BGRADB adds db (+=)
    cost_add(l, COST_BWD, block, per_layer, s, 2 * BT * OC * IC, 0,
             BT * IC * X + BT * OC * X + 2 * OC * IC * 4 + (has_bias && fused ? 2 * OC * 4 : 0), 1);
    if (has_bias && !fused) {
        double chunks = cost_colreduce_chunks(BT);
        snprintf(s, sizeof(s), "bias grad %s (2 passes)", name);
        // partial: dout read, chunks x OC fp32 partials written; final: partials read, db +=
        cost_add(l, COST_BWD, block, per_layer, s, 0, BT * OC, BT * OC * X + 2 * chunks * OC * 4 + 2 * OC * 4, 2);
        cost_covers(l, "bias_backward_partial_kernel,bias_backward_final_kernel", 0);
    }
}

// LayerNorm forward over (BT, C): one read of the row (C*X bytes, on chip), out, mean, rstd.
static inline void cost_layernorm_forward(CostList* l, int block, int per_layer, const char* name, double BT, double C,
                                          double X) {
    cost_add(l, COST_FWD, block, per_layer, name, 0, 8 * BT * C, BT * C * X + 2 * C * X + BT * C * X + 2 * BT * 4, 1);
    cost_covers(l, "layernorm_forward_kernel", 0);
}

// LayerNorm backward (llmc/layernorm.cuh): the input kernel reads dout, inp, w, mean, rstd
// and adds into dinp (read + write); the params' partial kernel reads dout, inp, mean, rstd
// and writes 2 x chunks x C partials; the final kernel sums them into dw, db (+=).
static inline void cost_layernorm_backward(CostList* l, int block, int per_layer, const char* name, double BT, double C,
                                           double X) {
    double chunks = cost_colreduce_chunks(BT);
    double input = 2 * BT * C * X + C * X + 2 * BT * 4 + 2 * BT * C * X;
    double partial = 2 * BT * C * X + 2 * BT * 4 + 2 * chunks * C * 4;
    double final = 2 * chunks * C * 4 + 2 * 2 * C * 4;
    cost_add(l, COST_BWD, block, per_layer, name, 0, 14 * BT * C, input + partial + final, 3);
    cost_covers(l, "layernorm_backward_input_kernel,layernorm_backward_params_partial_kernel,"
                "layernorm_backward_params_final_kernel", 0);
}

// Builds the kernel list of one training step. Returns the number of rows.
static inline int cost_model_kernels(const CostSetup* s, CostList* l) {
    memset(l, 0, sizeof(*l));
    const GPT2Config* c = &s->cfg;
    double X = s->act_bytes, F = 4;
    double B = s->B, T = s->T, BT = B * T, C = c->channels, NH = c->num_heads, hs = C / NH;
    double V = c->vocab_size, Vp = c->padded_vocab_size, BTC = BT * C;
    double H = B * NH;  // attention heads in the batch
    int naive_att = s->kernels.attention == ATTENTION_NAIVE;
    int fused = s->kernels.fused, recompute = s->kernels.recompute_gelu;
    int Lb = c->num_layers;  // the block of lnf + classifier
    int att_class = s->kernels.attention == ATTENTION_CUDNN ? COST_EFF_CUDNN : COST_EFF_FLASH;

    // ---------------------------------------------------------------- forward
    // encoder: token ids, the gathered wte rows, wpe (T rows, shared by the B sequences), out
    cost_add(l, COST_FWD, -1, 0, "encoder", 0, BTC, BT * 4 + BTC * X + T * C * X + BTC * X, 1);
    cost_covers(l, "encoder_forward_kernel", 0);
    if (fused) cost_layernorm_forward(l, 0, 0, "layernorm ln1 (block 0)", BT, C, X);
    else cost_layernorm_forward(l, 0, 1, "layernorm ln1", BT, C, X);
    cost_linear_forward(l, 0, 1, "qkv", BT, C, 3 * C, 1, 0, X);
    if (naive_att) {
        // permute (B,T,3C) -> q, k, v (B,NH,T,hs); the full T x T square of scores is computed
        cost_add(l, COST_FWD, 0, 1, "attention permute qkv", 0, 0, 3 * BTC * X + 3 * BTC * X, 1);
        cost_covers(l, "attention_permute_kernel", 0);
        cost_add(l, COST_FWD, 0, 1, "attention gemm q k^T -> fp32 scores", 2 * H * T * T * hs, 0,
                 2 * BTC * X + H * T * T * F, 1);
        // reads the causal part of each fp32 row (<= 4 KB: once), writes every floatX prob
        cost_add(l, COST_FWD, 0, 1, "attention softmax", 0, 5 * H * T * (T + 1) / 2,
                 H * T * (T + 1) / 2 * F + H * T * T * X, 1);
        cost_covers(l, "attention_softmax_kernel", 0);
        cost_add(l, COST_FWD, 0, 1, "attention gemm att v", 2 * H * T * T * hs, 0, H * T * T * X + BTC * X + BTC * X,
                 1);
        cost_add(l, COST_FWD, 0, 1, "attention unpermute", 0, 0, 2 * BTC * X, 1);
        cost_covers(l, "attention_unpermute_kernel", 0);
    } else {
        double area = H * cost_flash_tile_area(s->T, COST_FLASH_FWD_ROWS, COST_FLASH_FWD_COLS);
        cost_add(l, COST_FWD, 0, 1, s->kernels.attention == ATTENTION_CUDNN ? "attention cudnn fwd (as flash)"
                                                                            : "attention flash fwd",
                 4 * area * hs, 5 * area, 3 * BTC * X + BTC * X + H * T * F, 1);
        l->k[l->n - 1].eff_class = att_class;
        if (att_class == COST_EFF_FLASH) {
            cost_covers(l, "flash_attention_forward_kernel", H * cost_ceil_div(T, COST_FLASH_FWD_ROWS));
        }
    }
    cost_linear_forward(l, 0, 1, "attproj", BT, C, C, 1, 0, X);
    if (fused) {
        // residual2 = residual + attproj out, and ln2 of it, in one pass
        cost_add(l, COST_FWD, 0, 1, "residual + layernorm ln2 (fused)", 0, 9 * BTC,
                 2 * BTC * X + 2 * C * X + 2 * BTC * X + 2 * BT * F, 1);
        cost_covers(l, "layernorm_fused_residual_forward_kernel", 0);
        // GELU_AUX_BIAS: the GELU output and the pre-activation aux, both (BT,4C)
        cost_linear_forward(l, 0, 1, "fc +GELU_AUX_BIAS", BT, C, 4 * C, 1, BT * 4 * C * X, X);
    } else {
        cost_add(l, COST_FWD, 0, 1, "residual add (attn)", 0, BTC, 3 * BTC * X, 1);
        cost_covers(l, "residual_forward_kernel", 0);
        cost_layernorm_forward(l, 0, 1, "layernorm ln2", BT, C, X);
        cost_linear_forward(l, 0, 1, "fc", BT, C, 4 * C, 1, 0, X);
        cost_add(l, COST_FWD, 0, 1, "gelu", 0, 15 * BT * 4 * C, 2 * BT * 4 * C * X, 1);
        cost_covers(l, "gelu_forward_kernel", 0);
    }
    cost_linear_forward(l, 0, 1, "fcproj", BT, 4 * C, C, 1, 0, X);
    if (fused) {
        // residual3 = residual2 + fcproj out, and the next block's ln1 (the last: lnf)
        cost_add(l, COST_FWD, 0, 1, "residual + next layernorm (fused)", 0, 9 * BTC,
                 2 * BTC * X + 2 * C * X + 2 * BTC * X + 2 * BT * F, 1);
        cost_covers(l, "layernorm_fused_residual_forward_kernel", 0);
    } else {
        cost_add(l, COST_FWD, 0, 1, "residual add (mlp)", 0, BTC, 3 * BTC * X, 1);
        cost_covers(l, "residual_forward_kernel", 0);
        cost_layernorm_forward(l, Lb, 0, "layernorm lnf", BT, C, X);
    }
    cost_linear_forward(l, Lb, 0, "classifier (wte^T)", BT, C, Vp, 0, 0, X);
    if (fused) {
        // one read of the V real logits per row, dlogits (Vp wide, pad zeroed) written in place
        cost_add(l, COST_FWD, Lb, 0, "classifier softmax+CE+dlogits (fused)", 0, 7 * BT * V,
                 BT * V * X + BT * 4 + BT * Vp * X + 2 * BT * F, 1);
        cost_covers(l, "crossentropy_fused_kernel", 0);
    } else {
        // two passes (max, sum of exp) over a V-wide row (> COST_ONCHIP_ROW_BYTES): two reads
        cost_add(l, COST_FWD, Lb, 0, "crossentropy forward", 0, 4 * BT * V, 2 * BT * V * X + BT * 4 + 2 * BT * F, 1);
        cost_covers(l, "crossentropy_forward_kernel", 0);
    }
    cost_add(l, COST_FWD, Lb, 0, "mean loss", 0, BT, BT * F, 1);
    cost_covers(l, "mean_loss_kernel", 0);

    // ---------------------------------------------------------------- backward
    if (!fused) {
        // reads the V real logits, lse and the target; writes all Vp dlogits in place
        cost_add(l, COST_BWD, Lb, 0, "crossentropy backward", 0, 4 * BT * V, BT * V * X + BT * F + BT * 4 + BT * Vp * X,
                 1);
        cost_covers(l, "crossentropy_backward_kernel", 0);
    }
    cost_linear_backward(l, Lb, 0, "classifier", BT, C, Vp, 0, fused, 0, X);
    cost_add(l, COST_BWD, Lb, 0, "memset dresidual", 0, 0, BTC * X, 1);
    cost_layernorm_backward(l, Lb, 0, "layernorm lnf backward", BT, C, X);
    // fcproj: with fused kernels the dinp matmul's DGELU epilogue reads the aux and writes
    // dgelu * (dout W): no GELU backward pass. -r 1 first recomputes the GELU output (the
    // dweight matmul's input) from the pre-activation.
    if (recompute) {
        cost_add(l, COST_BWD, 0, 1, "gelu recompute (-r 1)", 0, 15 * BT * 4 * C, 2 * BT * 4 * C * X, 1);
        cost_covers(l, "gelu_forward_kernel", 0);
    }
    double dgelu_aux = fused ? BT * 4 * C * X : 0;  // the DGELU epilogue reads the pre-activation
    cost_linear_backward(l, 0, 1, fused ? "fcproj +DGELU" : "fcproj", BT, 4 * C, C, 1, fused, dgelu_aux, X);
    if (!fused) {
        cost_add(l, COST_BWD, 0, 1, "gelu backward", 0, 20 * BT * 4 * C, 3 * BT * 4 * C * X, 1);
        cost_covers(l, "gelu_backward_kernel", 0);
    }
    cost_linear_backward(l, 0, 1, "fc", BT, C, 4 * C, 1, fused, 0, X);
    cost_layernorm_backward(l, 0, 1, "layernorm ln2 backward", BT, C, X);
    cost_linear_backward(l, 0, 1, "attproj", BT, C, C, 1, fused, 0, X);
    if (naive_att) {
        cost_add(l, COST_BWD, 0, 1, "attention permute qkv", 0, 0, 6 * BTC * X, 1);
        cost_covers(l, "attention_permute_kernel", 0);
        cost_add(l, COST_BWD, 0, 1, "attention permute dout", 0, 0, 2 * BTC * X, 1);
        cost_covers(l, "attention_permute_grad_kernel", 0);
        cost_add(l, COST_BWD, 0, 1, "attention gemm datt = dout v^T (fp32)", 2 * H * T * T * hs, 0,
                 2 * BTC * X + H * T * T * F, 1);
        cost_add(l, COST_BWD, 0, 1, "attention gemm dv = att^T dout", 2 * H * T * T * hs, 0,
                 H * T * T * X + BTC * X + BTC * X, 1);
        // reads the causal part of att and datt, writes every dpreatt
        cost_add(l, COST_BWD, 0, 1, "attention softmax backward", 0, 4 * H * T * (T + 1) / 2,
                 H * T * (T + 1) / 2 * (X + F) + H * T * T * X, 1);
        cost_covers(l, "attention_softmax_backward_kernel", 0);
        cost_add(l, COST_BWD, 0, 1, "attention gemm dq = dpreatt k", 2 * H * T * T * hs, 0,
                 H * T * T * X + BTC * X + BTC * X, 1);
        cost_add(l, COST_BWD, 0, 1, "attention gemm dk = dpreatt^T q", 2 * H * T * T * hs, 0,
                 H * T * T * X + BTC * X + BTC * X, 1);
        cost_add(l, COST_BWD, 0, 1, "attention unpermute dqkv", 0, 0, 6 * BTC * X, 1);
        cost_covers(l, "attention_unpermute_qkv_kernel", 0);
    } else {
        double area = H * cost_flash_tile_area(s->T, COST_FLASH_BWD_TILE, COST_FLASH_BWD_TILE);
        const char* cu = s->kernels.attention == ATTENTION_CUDNN ? " (cudnn, as flash)" : "";
        char name[64];
        snprintf(name, sizeof(name), "attention flash bwd D = rowsum%s", cu);
        cost_add(l, COST_BWD, 0, 1, name, 0, 2 * BTC, 2 * BTC * X + H * T * F, 1);
        if (att_class == COST_EFF_FLASH) cost_covers(l, "flash_attention_rowdot_kernel", 0);
        double bwd_grid = H * cost_ceil_div(T, COST_FLASH_BWD_TILE);
        // each pass reads q, k, v, dout, lse and D
        double reads = 3 * BTC * X + BTC * X + 2 * H * T * F;
        snprintf(name, sizeof(name), "attention flash bwd dK,dV%s", cu);
        cost_add(l, COST_BWD, 0, 1, name, 8 * area * hs, 8 * area, reads + 2 * BTC * X, 1);
        l->k[l->n - 1].eff_class = att_class;
        if (att_class == COST_EFF_FLASH) cost_covers(l, "flash_attention_backward_kv_kernel", bwd_grid);
        snprintf(name, sizeof(name), "attention flash bwd dQ%s", cu);
        cost_add(l, COST_BWD, 0, 1, name, 6 * area * hs, 6 * area, reads + BTC * X, 1);
        l->k[l->n - 1].eff_class = att_class;
        if (att_class == COST_EFF_FLASH) cost_covers(l, "flash_attention_backward_q_kernel", bwd_grid);
    }
    cost_linear_backward(l, 0, 1, "qkv", BT, C, 3 * C, 1, fused, 0, X);
    cost_layernorm_backward(l, 0, 1, "layernorm ln1 backward", BT, C, X);
    // wpe: dout read, dwpe (T,C) fp32 +=; wte: dout read once, the plan's three int arrays,
    // the distinct tokens' dwte rows fp32 +=
    double U = BT < V ? BT : V;
    cost_add(l, COST_BWD, -1, 0, "encoder backward (wpe, wte)", 0, 2 * BTC,
             BTC * X + 2 * T * C * F + BTC * X + 3 * BT * 4 + 2 * U * C * F, 2);
    cost_covers(l, "encoder_backward_wpe_kernel,encoder_backward_wte_kernel", 0);

    // ---------------------------------------------------------------- optimizer
    double n = s->opt_numel, owned = s->zero_stage == 1 ? n / s->dp : n;
    int tensors = gpt2_num_tensors(c);
    cost_add(l, COST_OPT, Lb + 1, 0, "memset grads", 0, 0, n * F, 1);
    cost_add(l, COST_OPT, Lb + 1, 0, "global norm (sum of squares)", 0, 2 * owned, owned * F, 2);
    if (s->zero_stage == 0) cost_covers(l, "global_norm_partial_kernel,global_norm_final_kernel", 0);
    // per element: reads master, grad, m, v (fp32); writes master, m, v and the floatX param
    cost_add(l, COST_OPT, Lb + 1, 0, "adamw", 0, 20 * owned, owned * (4 * F + 3 * F + X), tensors);
    if (s->zero_stage == 0) cost_covers(l, "adamw_kernel", 0);  // ZeRO-1's are zero1/device_cuda.cu's
    if (s->measured) cost_apply_measurements(l, s->measured);
    return l->n;
}

// Totals of a list, times per GPU; achievable_s at the efficiencies e.
typedef struct {
    double tc_flops, cc_flops, bytes, launches;
    double roofline_s, achievable_s;
} CostTotals;

static inline double cost_kernel_count(const CostSetup* s, const CostKernel* k) {
    return k->per_layer ? s->cfg.num_layers : 1;
}

// Blocks of a grid run in waves of per_wave (SMs x blocks per SM): the last, partial one
// takes as long as a full one.
static inline double cost_wave_factor(double grid, double per_wave) {
    double waves = grid / per_wave;
    return ceil(waves) / waves;
}

static inline double cost_kernel_time(const CostKernel* k, const CostGPU* g, const CostEfficiency* e) {
    double compute = k->tc_flops / (g->tensor_core_tflops * 1e12 * e->tensor[k->eff_class]) +
                     k->cc_flops / (g->fp32_tflops * 1e12);
    double bytes = e->measured ? k->bytes * k->sector_factor : k->bytes;
    double t = bytes / (g->hbm_tbs * 1e12 * e->bandwidth);
    if (compute > t) t = compute;
    if (e->measured) {
        double shared = k->shared_wavefronts / (g->sms * cost_sm_clock_hz(g));
        if (shared > t) t = shared;
        if (k->blocks_per_sm > 0 && k->grid > 0) t *= cost_wave_factor(k->grid, (double)k->blocks_per_sm * g->sms);
    }
    return t + k->launches * e->launch_us * 1e-6;
}

static inline double cost_kernel_roofline(const CostKernel* k, const CostGPU* g) {
    return cost_kernel_time(k, g, &COST_ROOFLINE);
}

// Sums the rows of one phase (-1: all) into *t; block >= -1 restricts to that block (per
// layer rows count for each block 0..L-1, once).
static inline void cost_totals(const CostSetup* s, const CostList* l, int phase, const CostGPU* g,
                               const CostEfficiency* e, CostTotals* t) {
    memset(t, 0, sizeof(*t));
    for (int i = 0; i < l->n; i++) {
        const CostKernel* k = &l->k[i];
        if (phase >= 0 && k->phase != phase) continue;
        double m = cost_kernel_count(s, k);
        t->tc_flops += m * k->tc_flops;
        t->cc_flops += m * k->cc_flops;
        t->bytes += m * k->bytes;
        t->launches += m * k->launches;
        t->roofline_s += m * cost_kernel_roofline(k, g);
        t->achievable_s += m * cost_kernel_time(k, g, e);
    }
}

// Compute time of one block's rows in one phase (for the communication overlap).
static inline double cost_block_time(const CostSetup* s, const CostList* l, int phase, int block, const CostGPU* g,
                                     const CostEfficiency* e) {
    double t = 0;
    for (int i = 0; i < l->n; i++) {
        const CostKernel* k = &l->k[i];
        if (k->phase != phase) continue;
        int in_block = k->per_layer ? (block >= 0 && block < s->cfg.num_layers) : k->block == block;
        if (in_block) t += cost_kernel_time(k, g, e);
    }
    return t;
}

// Model FLOPs per token: llmc/gpt2_spec.h's, the trainers' MFU counts the same.
static inline double cost_model_flops_per_token(const GPT2Config* c, int T) { return gpt2_flops_per_token(c, T); }

#endif
