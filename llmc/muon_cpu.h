/*
 * Muon on the CPU (the formulas: llmc/muon.h): Newton-Schulz in fp32 through OpenBLAS's sgemm,
 * the whole update of one matrix, and of a list of them over the OpenMP threads, one matrix per
 * thread at a time (the trainer runs OpenBLAS single-threaded and splits work itself: run/threads.h).
 * A matrix's bits do not depend on the thread that updates it.
 */
#ifndef LLMC_MUON_CPU_H
#define LLMC_MUON_CPU_H

#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "llmc/muon.h"

#ifdef __cplusplus
extern "C" {
#endif

// dst (cols x rows) = src (rows x cols) transposed.
static inline void muon_transpose(float* dst, const float* src, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) dst[(size_t)j * rows + i] = src[(size_t)i * cols + j];
    }
}

// Steps 3 to 5 up to the scales: u (rows x cols) is replaced by its orthogonalization.
// work: muon_work_floats(rows, cols).
static inline void muon_orthogonalize_cpu(float* u, int rows, int cols, const MuonConfig* cfg, float* work) {
    int transposed = rows > cols;
    int r = transposed ? cols : rows, c = transposed ? rows : cols;  // X is r x c, r <= c
    size_t n = (size_t)rows * cols;
    float *x = work, *next = work + n, *a = next + n, *b = a + (size_t)r * r;
    if (transposed) muon_transpose(x, u, rows, cols);
    else memcpy(x, u, n * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    float norm = (float)sqrt(sum);
    float denom = norm > MUON_NORM_EPS ? norm : MUON_NORM_EPS;
    for (size_t i = 0; i < n; i++) x[i] = x[i] / denom;
    for (int step = 0; step < cfg->ns_steps; step++) {
        float abc[3];
        muon_ns_coefficients(cfg->coefficients, step, abc);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, r, c, 1.0f, x, c, x, c, 0.0f, a, r);      // A = X X^T
        memcpy(b, a, (size_t)r * r * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, r, r, abc[2], a, r, a, r, abc[1], b, r);  // bA + cAA
        memcpy(next, x, n * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, c, r, 1.0f, b, r, x, c, abc[0], next, c);  // aX + BX
        float* t = x;
        x = next;
        next = t;
    }
    if (transposed) muon_transpose(u, x, cols, rows);
    else memcpy(u, x, n * sizeof(float));
}

// One Muon step of a whole matrix: param, grad and momentum are rows x cols. grad_scale is
// the clipping factor; qkv: the matrix is a fused [Q; K; V] (split by thirds under split_qkv).
static inline void muon_update_matrix(float* param, const float* grad, float* momentum, int rows, int cols, int qkv,
                                      float lr, float weight_decay, float grad_scale, const MuonConfig* cfg,
                                      float* work) {
    size_t n = (size_t)rows * cols;
    float* u = work;  // the momentum's view to orthogonalize, then its result
    for (size_t i = 0; i < n; i++) u[i] = muon_momentum_element(grad[i] * grad_scale, &momentum[i], cfg->momentum,
                                                                cfg->nesterov);
    int parts = qkv && cfg->split_qkv ? 3 : 1, part_rows = rows / parts;
    size_t part_n = (size_t)part_rows * cols;
    float decay_factor = (float)(-(double)weight_decay * (double)lr), step_factor = -lr;
    for (int p = 0; p < parts; p++) {
        muon_orthogonalize_cpu(u + p * part_n, part_rows, cols, cfg, work + n);
        float scale = muon_scale_factor(cfg->scale, part_rows, cols);
        float* w = param + p * part_n;
        const float* o = u + p * part_n;
        for (size_t i = 0; i < part_n; i++) {
            w[i] = muon_update_element(w[i], o[i], scale, cfg->extra_scale, decay_factor, step_factor);
        }
    }
}

// One matrix of a Muon step: rows x cols at param, grad and momentum; qkv: a fused [Q; K; V].
typedef struct {
    float* param;
    const float* grad;
    float* momentum;
    int rows, cols, qkv;
} MuonMatrix;

// Floats of scratch muon_update_matrices needs: one matrix's worth per OpenMP thread.
static inline size_t muon_matrices_work_floats(int max_rows, int max_cols) {
    return (size_t)omp_get_max_threads() * muon_matrix_work_floats(max_rows, max_cols);
}

// The Muon step of n matrices, each no larger than max_rows x max_cols (the work's size).
static inline void muon_update_matrices(const MuonMatrix* m, int n, float lr, float weight_decay, float grad_scale,
                                        const MuonConfig* cfg, float* work, int max_rows, int max_cols) {
    size_t per_thread = muon_matrix_work_floats(max_rows, max_cols);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        muon_update_matrix(m[i].param, m[i].grad, m[i].momentum, m[i].rows, m[i].cols, m[i].qkv, lr, weight_decay,
                           grad_scale, cfg, work + (size_t)omp_get_thread_num() * per_thread);
    }
}

#ifdef __cplusplus
}
#endif
#endif
