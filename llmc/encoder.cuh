/*
 * Token + position embedding, forward and a deterministic backward.
 *   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
 * Backward: dwpe[t] += sum_b dout[b,t]; dwte[v] += sum over positions holding token v.
 * Why not atomics: the same token appears many times in a batch, and float atomics
 * would add in a run-dependent order. Instead the host (which has the tokens anyway)
 * groups the positions by token in a stable order (EncoderBackwardPlan), and one
 * block per distinct token sums its positions in that order: bitwise reproducible.
 */
#ifndef LLMC_ENCODER_CUH
#define LLMC_ENCODER_CUH

#include <stdlib.h>
#include "llmc/cuda_common.cuh"

__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                       int BT, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * C) return;
    int bt = (int)(idx / C), c = (int)(idx % C), t = bt % T;
    out[idx] = from_float<floatX>(to_float(wte[(size_t)inp[bt] * C + c]) + to_float(wpe[(size_t)t * C + c]));
}

static void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C,
                            cudaStream_t stream) {
    size_t n = (size_t)B * T * C;
    encoder_forward_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(out, inp, wte, wpe, B * T, T, C);
    cudaCheckLaunch();
}

// dwpe[t,c] += sum over b (in order) of dout[b,t,c].
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += to_float(dout[(size_t)b * T * C + idx]);
    dwpe[idx] += sum;
}

// Block u handles distinct token tokens[u]: positions order[starts[u] .. starts[u+1]),
// into row tokens[u] of dwte, or (compact) into row u: the distinct tokens in ascending order.
__global__ void encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* tokens, const int* starts,
                                            const int* order, int C, int compact) {
    int u = blockIdx.x;
    int begin = starts[u], end = starts[u + 1];
    float* row = dwte + (size_t)(compact ? u : tokens[u]) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        for (int j = begin; j < end; j++) sum += to_float(dout[(size_t)order[j] * C + c]);
        row[c] += sum;
    }
}

// Host-side grouping of the positions of one batch by token id.
typedef struct {
    int max_BT;
    int num_unique;
    int *h_tokens, *h_starts, *h_order;  // host (pageable)
    int *d_tokens, *d_starts, *d_order;  // device
    int2* scratch;                       // (token, position) pairs for sorting
} EncoderBackwardPlan;

static void encoder_plan_init(EncoderBackwardPlan* p, int max_BT) {
    p->max_BT = max_BT;
    p->num_unique = 0;
    p->h_tokens = (int*)mallocCheck((size_t)max_BT * sizeof(int));
    p->h_starts = (int*)mallocCheck((size_t)(max_BT + 1) * sizeof(int));
    p->h_order = (int*)mallocCheck((size_t)max_BT * sizeof(int));
    p->scratch = (int2*)mallocCheck((size_t)max_BT * sizeof(int2));
    p->d_tokens = (int*)cudaMallocCheck((size_t)max_BT * sizeof(int));
    p->d_starts = (int*)cudaMallocCheck((size_t)(max_BT + 1) * sizeof(int));
    p->d_order = (int*)cudaMallocCheck((size_t)max_BT * sizeof(int));
}

static void encoder_plan_free(EncoderBackwardPlan* p) {
    free(p->h_tokens);
    free(p->h_starts);
    free(p->h_order);
    free(p->scratch);
    cudaCheck(cudaFree(p->d_tokens));
    cudaCheck(cudaFree(p->d_starts));
    cudaCheck(cudaFree(p->d_order));
}

static int compare_token_position(const void* a, const void* b) {
    const int2* x = (const int2*)a;
    const int2* y = (const int2*)b;
    if (x->x != y->x) return x->x < y->x ? -1 : 1;
    return (x->y > y->y) - (x->y < y->y);
}

// Builds the grouping for host inputs inp (BT) and queues its upload on stream.
// cudaMemcpyAsync from pageable memory returns once the source has been staged, so the
// host arrays may be rebuilt for the next micro-step right away.
static void encoder_plan_build(EncoderBackwardPlan* p, const int* inp, int BT, cudaStream_t stream) {
    if (BT > p->max_BT) fatal("encoder plan: BT %d exceeds %d", BT, p->max_BT);
    for (int i = 0; i < BT; i++) p->scratch[i] = make_int2(inp[i], i);
    qsort(p->scratch, (size_t)BT, sizeof(int2), compare_token_position);
    int u = -1;
    for (int i = 0; i < BT; i++) {
        if (i == 0 || p->scratch[i].x != p->scratch[i - 1].x) {
            u++;
            p->h_tokens[u] = p->scratch[i].x;
            p->h_starts[u] = i;
        }
        p->h_order[i] = p->scratch[i].y;
    }
    p->num_unique = u + 1;
    p->h_starts[p->num_unique] = BT;
    cudaCheck(cudaMemcpyAsync(p->d_tokens, p->h_tokens, (size_t)p->num_unique * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(p->d_starts, p->h_starts, (size_t)(p->num_unique + 1) * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(p->d_order, p->h_order, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, stream));
}

// dwte and dwpe are fp32 grad-buffer views; both accumulate (+=). compact: dwte holds
// one row per distinct token of the plan, ascending (llmc/model_hooks.h's embedding_grad_rows).
static void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const EncoderBackwardPlan* plan, int B, int T,
                             int C, int compact, cudaStream_t stream) {
    size_t n = (size_t)T * C;
    encoder_backward_wpe_kernel<<<(unsigned)CEIL_DIV(n, 256), 256, 0, stream>>>(dwpe, dout, B, T, C);
    cudaCheckLaunch();
    if (plan->num_unique > 0) {
        encoder_backward_wte_kernel<<<plan->num_unique, 256, 0, stream>>>(dwte, dout, plan->d_tokens, plan->d_starts,
                                                                         plan->d_order, C, compact);
        cudaCheckLaunch();
    }
}

#endif
