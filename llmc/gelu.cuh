/*
 * GELU, tanh approximation (GPT-2's), elementwise; math in fp32.
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * With --fused-kernels 1 the model runs GELU and its backward inside cuBLASLt's epilogues
 * (llmc/matmul.cuh: GELU_AUX_BIAS, DGELU, the same formula); these kernels are the
 * reference path, the fallback where an epilogue is refused, and -r 1's recomputation of
 * the GELU output in the backward.
 * 128-bit loads and stores where the pointers allow (llmc/cuda_common.cuh's Packed128).
 */
#ifndef LLMC_GELU_CUH
#define LLMC_GELU_CUH

#include "llmc/cuda_common.cuh"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)

__device__ __forceinline__ floatX gelu_value(floatX in) {
    float x = to_float(in);
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return from_float<floatX>(0.5f * x * (1.0f + tanhf(u)));
}

__device__ __forceinline__ floatX gelu_grad_times(floatX in, floatX dout) {
    float x = to_float(in);
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    return from_float<floatX>(grad * to_float(dout));
}

// One 128-bit pack per thread; vec: every pointer 16-byte aligned (else, and for the
// tail of n, element by element: llmc/cuda_common.cuh).
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t n, int vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK_X;
    if (i >= n) return;
    if (vec && i + PACK_X <= n) {
        Packed128<floatX> x = load128(inp + i), y;
        for (int k = 0; k < PACK_X; k++) y.v[k] = gelu_value(x.v[k]);
        store128(out + i, y);
    } else {
        for (size_t j = i; j < n && j < i + PACK_X; j++) out[j] = gelu_value(inp[j]);
    }
}

// dinp = gelu'(inp) * dout; dinp may alias dout (each pack is read before written).
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t n, int vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK_X;
    if (i >= n) return;
    if (vec && i + PACK_X <= n) {
        Packed128<floatX> x = load128(inp + i), d = load128(dout + i), g;
        for (int k = 0; k < PACK_X; k++) g.v[k] = gelu_grad_times(x.v[k], d.v[k]);
        store128(dinp + i, g);
    } else {
        for (size_t j = i; j < n && j < i + PACK_X; j++) dinp[j] = gelu_grad_times(inp[j], dout[j]);
    }
}

static void gelu_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
    gelu_forward_kernel<<<packed_blocks(n, 256), 256, 0, stream>>>(out, inp, n, aligned16(out) && aligned16(inp));
    cudaCheckLaunch();
}

static void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t n, cudaStream_t stream) {
    int vec = aligned16(dinp) && aligned16(inp) && aligned16(dout);
    gelu_backward_kernel<<<packed_blocks(n, 256), 256, 0, stream>>>(dinp, inp, dout, n, vec);
    cudaCheckLaunch();
}

#endif
