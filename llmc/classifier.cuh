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
 * fused (--fused-kernels 1, a training forward whose backward follows with a known dloss):
 *   crossentropy_forward_backward does both in one kernel per row, in place: pass 1 an
 *   online softmax (each thread a running max and a sum rescaled when the max grows, then
 *   the block combines the (max, sum) pairs), lse and the loss (the target's logit read
 *   before anything is overwritten); pass 2 writes dlogits over the same row as above.
 *   Why not hold the row in registers or shared memory for a single touch: a row is Vp
 *   floatX (100 KiB in bf16, 200 KiB in fp32 at GPT-2's 50304), more than the 48 KiB of
 *   shared memory a block gets without opt-in and enough to leave one block per SM; in
 *   registers it spills. The second touch comes from L2 (this block read the row just
 *   before), so the DRAM traffic is one read and one write of the logits, against two
 *   reads and a write for the separate passes (whose backward reads them cold after the
 *   forward). 128-bit packs where Vp is a multiple of the pack and the logits aligned;
 *   otherwise element by element. The online sum rounds differently from the two-pass
 *   sum (within the tolerances of dev/test/test_kernels_cuda.cu); dlogits use the same
 *   formula as crossentropy_backward.
 * mean_loss: one block sums the BT losses in double, in a fixed tree, and adds the mean
 * into a device scalar, so the host reads one number per optimizer step.
 */
#ifndef LLMC_CLASSIFIER_CUH
#define LLMC_CLASSIFIER_CUH

#include "llmc/cuda_common.cuh"

// The block of the row kernels and of mean_loss: their __launch_bounds__ and launches.
#define CROSSENTROPY_THREADS 1024

__global__ void __launch_bounds__(CROSSENTROPY_THREADS)
    crossentropy_forward_kernel(float* losses, float* lse, const floatX* logits, const int* targets, int V,
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

// The fused forward and backward of row x (header comment) by the whole block. STEP:
// PACK_X (Vp a multiple of the pack, logits 16-byte aligned, so every row's packs are) or
// 1; a compile-time width keeps each pack in registers.
template <int STEP>
__device__ __forceinline__ void crossentropy_fused_row(floatX* x, float* loss, float* lse, int target, float dloss,
                                                       int V, int Vp) {
    float target_logit = threadIdx.x == 0 ? to_float(x[target]) : 0.0f;  // before pass 2 overwrites it
    float m = -INFINITY, sum = 0.0f;
    for (int v0 = threadIdx.x * STEP; v0 < V; v0 += blockDim.x * STEP) {
        Packed128<floatX> p = load_pack_or_one<STEP>(x, v0);
#pragma unroll
        for (int k = 0; k < STEP; k++) {
            if (v0 + k >= V) break;
            float xv = to_float(p.v[k]);
            if (xv > m) {
                sum = sum * expf(m - xv) + 1.0f;
                m = xv;
            } else {
                sum += expf(xv - m);
            }
        }
    }
    float block_max = block_reduce_max(m);
    float total = block_reduce_sum(m == -INFINITY ? 0.0f : sum * expf(m - block_max));
    float l = block_max + logf(total);
    if (threadIdx.x == 0) {
        *lse = l;
        *loss = l - target_logit;
    }
    for (int v0 = threadIdx.x * STEP; v0 < Vp; v0 += blockDim.x * STEP) {
        Packed128<floatX> p = load_pack_or_one<STEP>(x, v0);
#pragma unroll
        for (int k = 0; k < STEP; k++) {
            int v = v0 + k;
            float g = 0.0f;
            if (v < V) g = (expf(to_float(p.v[k]) - l) - (v == target ? 1.0f : 0.0f)) * dloss;
            p.v[k] = from_float<floatX>(g);
        }
        store_pack_or_one<STEP>(x, v0, p);
    }
}

__global__ void __launch_bounds__(CROSSENTROPY_THREADS)
    crossentropy_fused_kernel(floatX* logits, float* losses, float* lse, const int* targets, float dloss, int V, int Vp,
                              int vec) {
    int row = blockIdx.x;
    floatX* x = logits + (size_t)row * Vp;
    if (vec) crossentropy_fused_row<PACK_X>(x, losses + row, lse + row, targets[row], dloss, V, Vp);
    else crossentropy_fused_row<1>(x, losses + row, lse + row, targets[row], dloss, V, Vp);
}

// out[0] (+)= mean of losses[0..n)
__global__ void __launch_bounds__(CROSSENTROPY_THREADS)
    mean_loss_kernel(float* out, const float* losses, int n, int accumulate) {
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
    crossentropy_forward_kernel<<<BT, CROSSENTROPY_THREADS, 0, stream>>>(losses, lse, logits, targets, V, Vp);
    cudaCheckLaunch();
    mean_loss_kernel<<<1, CROSSENTROPY_THREADS, 0, stream>>>(loss_out, losses, BT, accumulate);
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

// Forward and backward in one pass (header comment): losses, lse and the mean as
// crossentropy_forward, then the logits become dlogits for d(objective)/d(loss) = dloss.
static void crossentropy_forward_backward(floatX* logits_to_dlogits, float* losses, float* lse, float* loss_out,
                                          int accumulate, const int* targets, float dloss, int BT, int V, int Vp,
                                          cudaStream_t stream) {
    int vec = Vp % PACK_X == 0 && aligned16(logits_to_dlogits);
    crossentropy_fused_kernel<<<BT, CROSSENTROPY_THREADS, 0, stream>>>(logits_to_dlogits, losses, lse, targets, dloss,
                                                                       V, Vp, vec);
    cudaCheckLaunch();
    mean_loss_kernel<<<1, CROSSENTROPY_THREADS, 0, stream>>>(loss_out, losses, BT, accumulate);
    cudaCheckLaunch();
}

#endif
