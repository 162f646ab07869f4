/*
 * Muon, as NVIDIA emerging-optimizers 0.3.0's `Muon` computes it with Megatron-core 0.19.2's
 * defaults (the reference: dev/test/muon_reference.py, whose header cites every line). One
 * matrix W (rows x cols, row-major as torch stores a Linear's weight) with its gradient G
 * (after clipping) and momentum M, at learning rate lr and weight decay wd:
 *   1. W <- W - (lr*wd) * W                                    decoupled, first
 *   2. M <- lerp(M, G, 1 - momentum);  U = nesterov ? lerp(G, M, momentum) : M
 *   3. X = U, transposed when rows > cols; X /= max(||X||_F, 1e-7)
 *   4. ns_steps times, with coefficients (a, b, c) of the set for that step:
 *        A = X X^T;  B = b*A + c*(A A);  X = a*X + B X
 *   5. X transposed back; O = (X * scale) * extra_scale, scale from the shape orthogonalized
 *   6. W <- W - lr * O
 * With split_qkv a qkvw of 3C x C is orthogonalized as three C x C matrices (Q, K, V: thirds of
 * its rows), each with its own scale, as Megatron splits its fused QKV weight (for GPT-2's
 * multi-head attention the split is by thirds). The elementwise steps (1, 2, 5, 6) are here as
 * the one formula every path runs, like llmc/adamw.h; step 4's products are each device's GEMMs
 * (llmc/muon_cpu.h for the CPU).
 */
#ifndef LLMC_MUON_H
#define LLMC_MUON_H

#include <math.h>
#include <stddef.h>

#include "llmc/adamw.h"  // LLMC_HOST_DEVICE

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MUON_COEFFICIENTS_SIMPLE = 0, MUON_COEFFICIENTS_QUINTIC = 1 } MuonCoefficients;
typedef enum { MUON_SCALE_SPECTRAL = 0, MUON_SCALE_SHAPE_SCALING = 1, MUON_SCALE_UNIT_RMS_NORM = 2 } MuonScale;

// The --muon-* flags (run/config.h), Megatron-core 0.19.2's OptimizerConfig.muon_* defaults.
typedef struct {
    float momentum;            // 0.95
    int nesterov;              // 0
    int ns_steps;              // 5
    MuonCoefficients coefficients;  // quintic
    MuonScale scale;           // spectral
    float extra_scale;         // 1.0
    int split_qkv;             // 1
} MuonConfig;

#define MUON_NORM_EPS 1e-7f  // the Frobenius normalisation's floor (F.normalize's eps)
#define MUON_QUINTIC_SETS 5

// Floats of scratch a device's Newton-Schulz needs (llmc/muon_cpu.h) for a rows x cols matrix.
static inline size_t muon_work_floats(int rows, int cols) {
    size_t small = (size_t)(rows < cols ? rows : cols), n = (size_t)rows * cols;
    return 2 * n + 2 * small * small;
}

// Floats of scratch for any matrix up to rows x cols, plus the orthogonalized copy.
static inline size_t muon_matrix_work_floats(int rows, int cols) {
    return (size_t)rows * cols + muon_work_floats(rows, cols);
}

// FLOPs of Newton-Schulz on one rows x cols matrix (a third of qkvw under the split): X is
// r x c with r <= c, and each step multiplies X X^T (2r^2c), A A (2r^3) and B X (2r^2c).
static inline double muon_ns_flops(int rows, int cols, int ns_steps) {
    double r = rows < cols ? rows : cols, c = rows < cols ? cols : rows;
    return ns_steps * (4.0 * r * r * c + 2.0 * r * r * r);
}

// The (a, b, c) of Newton-Schulz step `step` (0-based): "simple" one set every step, "quintic"
// its five sets cycled.
static inline void muon_ns_coefficients(MuonCoefficients kind, int step, float abc[3]) {
    static const float simple[3] = {3.4445f, -4.7750f, 2.0315f};
    static const float quintic[MUON_QUINTIC_SETS][3] = {
        {4.0848f, -6.8946f, 2.9270f}, {3.9505f, -6.3029f, 2.6377f}, {3.7418f, -5.5913f, 2.3037f},
        {2.8769f, -3.1427f, 1.2046f}, {2.8366f, -3.0525f, 1.2012f},
    };
    const float* set = kind == MUON_COEFFICIENTS_SIMPLE ? simple : quintic[step % MUON_QUINTIC_SETS];
    for (int i = 0; i < 3; i++) abc[i] = set[i];
}

// The scale of an orthogonalized rows x cols matrix (its shape as stored, not transposed).
static inline float muon_scale_factor(MuonScale mode, int rows, int cols) {
    double r = rows, c = cols;
    double s = mode == MUON_SCALE_SPECTRAL        ? sqrt(r > c ? r : c)
               : mode == MUON_SCALE_SHAPE_SCALING ? sqrt(r / c > 1.0 ? r / c : 1.0)
                                                  : sqrt(r / c);
    return (float)s;
}

// torch's lerp(a, b, w) as its CPU kernel computes it in fp32 (a fused multiply-add either side
// of w = 0.5), so that the momentum repeats the reference's bits.
LLMC_HOST_DEVICE static inline float muon_lerp(float a, float b, float w) {
    return fabsf(w) < 0.5f ? fmaf(w, b - a, a) : fmaf(-(b - a), 1.0f - w, b);
}

// Step 2 for one element: updates the momentum m with the clipped gradient g, returns what
// Newton-Schulz orthogonalizes.
LLMC_HOST_DEVICE static inline float muon_momentum_element(float g, float* m, float momentum, int nesterov) {
    *m = muon_lerp(*m, g, 1.0f - momentum);
    return nesterov ? muon_lerp(g, *m, momentum) : *m;
}

// Steps 1, 5 and 6 for one element: the weight p decayed, then moved by the orthogonalized
// value o (before its scales). decay_factor = -(lr * wd), step_factor = -lr.
LLMC_HOST_DEVICE static inline float muon_update_element(float p, float o, float scale, float extra_scale,
                                                         float decay_factor, float step_factor) {
    p = p + decay_factor * p;
    return p + step_factor * ((o * scale) * extra_scale);
}

#ifdef __cplusplus
}
#endif
#endif
