/*
 * cuda_cpu/tensorcore.h: the tensor cores' accumulation (tensorcore.cpp), for mma.h's
 * mma_sync and blas.cpp's BF16 matmuls in a build with GPU numerics. The model and its
 * sources: tensorcore.cpp's header comment.
 */
#ifndef CUDA_CPU_TENSORCORE_H
#define CUDA_CPU_TENSORCORE_H

#include <cstddef>
#include <cstdint>

namespace cudacpu {

// c + sum a[i] b[i] (i < k) as tensor cores add it: groups of CUDA_CPU_TC_GROUP products
// fused with the running sum (the header of tensorcore.cpp). a and b hold bf16 or fp16
// values (exact in float); min_exp is their format's smallest exponent (-126 bf16, -14 fp16).
float tc_dot(float c, const float* a, const float* b, int k, int min_exp);

// Whether blas.cpp's BF16 matmuls take the model: a GPU-numerics build (runtime.cpp) and
// CUDA_CPU_TC_GROUP > 0.
bool tc_gemm_modelled();

// The split-K slices of an m x n x k matmul (1: none): a hash of the shape and CUDA_CPU_SEED
// picks 1 to 8, at most one per group of k and as many as fit their fp32 partial results
// (m n batch floats each) into workspace_bytes.
int tc_splits(int64_t m, int64_t n, int64_t k, int batch, size_t workspace_bytes);

// out[i + j m] = alpha * sum_kk A(i, kk) B(kk, j), A(i, kk) at a[i * a_i + kk * a_k] and
// B(kk, j) at b[j * b_j + kk * b_k] (bf16 values in float): each slice's chain of groups
// from a zero accumulator, the slices' partial sums added in fp32 in slice order.
void tc_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_i, int64_t a_k, const float* b,
             int64_t b_j, int64_t b_k, int splits, float* out);

bool numerics_gpu();  // runtime.cpp: the program was built with GPU numerics

}  // namespace cudacpu

#endif
