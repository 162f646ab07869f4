/*
 * Softmax + cross-entropy over the padded vocabulary, split so that no fp32
 * probability tensor is ever materialised:
 *   forward:  one block per row: max and sum of exp over the V real columns (fp32),
 *             lse = max + log(sum); losses[i] = lse - logit[target]; lse kept (BT floats).
 *   backward: elementwise, in place over the logits buffer:
 *             dlogit[v] = (exp(logit[v] - lse) - [v == target]) * dloss   for v < V
 *             dlogit[v] = 0                                              for V <= v < Vp
 * The forward leaves the logits intact (the test and sampling read them); the backward,
 * which only needs lse, overwrites them with their gradient.
 * mean_loss: one block sums the BT losses in double, in a fixed tree, and adds the mean
 * into a device scalar, so the host reads one number per optimizer step.
 */
#ifndef LLMC_CLASSIFIER_CUH
#define LLMC_CLASSIFIER_CUH

#include "llmc/cuda_common.cuh"

__global__ void crossentropy_forward_kernel(float* losses, float* lse, const floatX* logits, const int* targets, int V,
                                            int Vp) {
    int row = blockIdx.x;
    const floatX* x = logits + (size_t)row * Vp;
    float maxv = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) maxv = fmaxf(maxv, to_float(x[v]));
    maxv = block_reduce_max(maxv);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(to_float(x[v]) - maxv);
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) {
        float l = maxv + logf(sum);
        lse[row] = l;
        losses[row] = l - to_float(x[targets[row]]);
    }
}

__global__ void crossentropy_backward_kernel(floatX* dlogits, const float* lse, const int* targets, float dloss, int BT,
                                             int V, int Vp) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * Vp) return;
    int row = (int)(idx / Vp), v = (int)(idx % Vp);
    float g = 0.0f;
    if (v < V) {
        float p = expf(to_float(dlogits[idx]) - lse[row]);
        g = (p - (v == targets[row] ? 1.0f : 0.0f)) * dloss;
    }
    dlogits[idx] = from_float<floatX>(g);
}

// out[0] (+)= mean of losses[0..n)
__global__ void mean_loss_kernel(float* out, const float* losses, int n, int accumulate) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += (double)losses[i];
    sum = block_reduce_sum_double(sum);
    if (threadIdx.x == 0) {
        float mean = (float)(sum / n);
        out[0] = accumulate ? out[0] + mean : mean;
    }
}

// targets must lie in [0, V): the data loader checks every token of a shard on open.
static void crossentropy_forward(float* losses, float* lse, float* loss_out, int accumulate, const floatX* logits,
                                 const int* targets, int BT, int V, int Vp, cudaStream_t stream) {
    crossentropy_forward_kernel<<<BT, 1024, 0, stream>>>(losses, lse, logits, targets, V, Vp);
    cudaCheckLaunch();
    mean_loss_kernel<<<1, 1024, 0, stream>>>(loss_out, losses, BT, accumulate);
    cudaCheckLaunch();
}

// dloss: d(objective)/d(loss at one position), the same for every position.
static void crossentropy_backward(floatX* logits_to_dlogits, const float* lse, const int* targets, float dloss, int BT,
                                  int V, int Vp, cudaStream_t stream) {
    size_t n = (size_t)BT * Vp;
    crossentropy_backward_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(logits_to_dlogits, lse, targets, dloss,
                                                                                 BT, V, Vp);
    cudaCheckLaunch();
}

#endif
