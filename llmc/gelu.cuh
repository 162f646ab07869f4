/*
 * GELU, tanh approximation (GPT-2's), elementwise; math in fp32.
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * With --fused-kernels 1 the model runs GELU and its backward inside cuBLASLt's epilogues
 * (llmc/matmul.cuh: GELU_AUX_BIAS, DGELU, the same formula); these kernels are the
 * reference path, the fallback where an epilogue is refused, and -r 1's recomputation of
 * the GELU output in the backward.
 */
#ifndef LLMC_GELU_CUH
#define LLMC_GELU_CUH

#include "llmc/cuda_common.cuh"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)

__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = to_float(inp[i]);
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    out[i] = from_float<floatX>(0.5f * x * (1.0f + tanhf(u)));
}

// dinp = gelu'(inp) * dout; dinp may alias dout (each element is read before written).
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = to_float(inp[i]);
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = from_float<floatX>(grad * to_float(dout[i]));
}

static void gelu_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
    gelu_forward_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(out, inp, n);
    cudaCheckLaunch();
}

static void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t n, cudaStream_t stream) {
    gelu_backward_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(dinp, inp, dout, n);
    cudaCheckLaunch();
}

#endif
