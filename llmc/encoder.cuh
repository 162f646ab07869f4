/*
 * Token + position embedding, forward and a deterministic backward.
 *   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]   (128-bit packs where C and the pointers allow)
 * Backward: dwpe[t] += sum_b dout[b,t]; dwte[v] += sum over positions holding token v.
 * Why not atomics: the same token appears many times in a batch, and float atomics
 * would add in a run-dependent order. Instead the host (which has the tokens anyway)
 * groups the positions by token in a stable order (EncoderBackwardPlan), and one
 * block per distinct token sums its positions in that order: bitwise reproducible.
 * The plan's host arrays are pinned (two sets in turn), so its upload never blocks the host.
 */
#ifndef LLMC_ENCODER_CUH
#define LLMC_ENCODER_CUH

#include <stdlib.h>
#include <string.h>
#include "llmc/cuda_common.cuh"

__device__ __forceinline__ floatX embed_add(floatX e, floatX p) { return from_float<floatX>(to_float(e) + to_float(p)); }

// A thread per pack of PACK_X channels of one position (llmc/cuda_common.cuh); vec: C is a
// multiple of the pack and out, wte, wpe are 16-byte aligned, so every row's packs are.
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                       int BT, int T, int C, int vec) {
    int packs_per_row = CEIL_DIV(C, PACK_X);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * packs_per_row) return;
    int bt = (int)(idx / packs_per_row), c0 = (int)(idx % packs_per_row) * PACK_X, t = bt % T;
    floatX* o = out + (size_t)bt * C;
    const floatX* e = wte + (size_t)inp[bt] * C;
    const floatX* p = wpe + (size_t)t * C;
    if (vec) {
        Packed128<floatX> x = load128(e + c0), y = load128(p + c0), r;
        for (int k = 0; k < PACK_X; k++) r.v[k] = embed_add(x.v[k], y.v[k]);
        store128(o + c0, r);
    } else {
        for (int c = c0; c < C && c < c0 + PACK_X; c++) o[c] = embed_add(e[c], p[c]);
    }
}

static void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C,
                            cudaStream_t stream) {
    int vec = C % PACK_X == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
    size_t threads = (size_t)B * T * CEIL_DIV(C, PACK_X);
    encoder_forward_kernel<<<(unsigned)CEIL_DIV(threads, 256), 256, 0, stream>>>(out, inp, wte, wpe, B * T, T, C, vec);
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

// Host-side grouping of the positions of one batch by token id. The host arrays are
// pinned, so their uploads are asynchronous (a pinned copy reads its source when it runs):
// two sets, used in turn, each refilled only once its previous upload has run (its event).
typedef struct {
    int max_BT;
    int num_unique;
    int *h_tokens[2], *h_starts[2], *h_order[2];  // host (pinned), two sets
    cudaEvent_t uploaded[2];                      // after each set's copies
    int next;                                     // the set the next build fills
    int *d_tokens, *d_starts, *d_order;           // device
    int2* scratch;                                // (token, position) pairs for sorting
} EncoderBackwardPlan;

static void encoder_plan_init(EncoderBackwardPlan* p, int max_BT) {
    memset(p, 0, sizeof(*p));
    p->max_BT = max_BT;
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMallocHost((void**)&p->h_tokens[i], (size_t)max_BT * sizeof(int)));
        cudaCheck(cudaMallocHost((void**)&p->h_starts[i], (size_t)(max_BT + 1) * sizeof(int)));
        cudaCheck(cudaMallocHost((void**)&p->h_order[i], (size_t)max_BT * sizeof(int)));
        cudaCheck(cudaEventCreateWithFlags(&p->uploaded[i], cudaEventDisableTiming));
    }
    p->scratch = (int2*)mallocCheck((size_t)max_BT * sizeof(int2));
    p->d_tokens = (int*)cudaMallocCheck((size_t)max_BT * sizeof(int));
    p->d_starts = (int*)cudaMallocCheck((size_t)(max_BT + 1) * sizeof(int));
    p->d_order = (int*)cudaMallocCheck((size_t)max_BT * sizeof(int));
}

static void encoder_plan_free(EncoderBackwardPlan* p) {
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaEventSynchronize(p->uploaded[i]));
        cudaCheck(cudaFreeHost(p->h_tokens[i]));
        cudaCheck(cudaFreeHost(p->h_starts[i]));
        cudaCheck(cudaFreeHost(p->h_order[i]));
        cudaCheck(cudaEventDestroy(p->uploaded[i]));
    }
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

// Builds the grouping for host inputs inp (BT) and queues its upload on stream (ordered
// before the encoder backward that reads it). The host waits only for the upload of the
// build before the last (normally long done).
static void encoder_plan_build(EncoderBackwardPlan* p, const int* inp, int BT, cudaStream_t stream) {
    if (BT > p->max_BT) fatal("encoder plan: BT %d exceeds %d", BT, p->max_BT);
    int set = p->next;
    p->next ^= 1;
    cudaCheck(cudaEventSynchronize(p->uploaded[set]));
    int *tokens = p->h_tokens[set], *starts = p->h_starts[set], *order = p->h_order[set];
    for (int i = 0; i < BT; i++) p->scratch[i] = make_int2(inp[i], i);
    qsort(p->scratch, (size_t)BT, sizeof(int2), compare_token_position);
    int u = -1;
    for (int i = 0; i < BT; i++) {
        if (i == 0 || p->scratch[i].x != p->scratch[i - 1].x) {
            u++;
            tokens[u] = p->scratch[i].x;
            starts[u] = i;
        }
        order[i] = p->scratch[i].y;
    }
    p->num_unique = u + 1;
    starts[p->num_unique] = BT;
    cudaCheck(cudaMemcpyAsync(p->d_tokens, tokens, (size_t)p->num_unique * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(p->d_starts, starts, (size_t)(p->num_unique + 1) * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(p->d_order, order, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(p->uploaded[set], stream));
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
