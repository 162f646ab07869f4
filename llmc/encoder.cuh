/*
 * Token + position embedding, forward and a deterministic backward.
 *   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]   (128-bit packs where C and the pointers allow)
 * Backward: dwpe[t] += sum_b dout[b,t]; dwte[v] += sum over positions holding token v.
 * Why not atomics: the same token appears many times in a batch, and float atomics
 * would add in a run-dependent order. Instead the host (which has the tokens anyway)
 * groups the positions by token in a stable order and cuts each token's run into
 * segments of at most ENCODER_WTE_SEGMENT positions (EncoderBackwardPlan); one block per
 * segment sums its positions in that order, and a token of several segments (end-of-text,
 * padding: a token that dominates a batch) gets its segments' partial sums added in a
 * fixed order by a second kernel. So no block's work grows with one token's count beyond
 * count / (8 ENCODER_WTE_SEGMENT) partials per thread, and the sums are bitwise
 * reproducible. The plan's host arrays are pinned (two sets in turn), so its upload never
 * blocks the host.
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

// dwpe[t,c] += sum over b (in order) of dout[b,t,c]. vec (T*C a multiple of 4, dout and
// dwpe 16-byte aligned): a thread per 4 positions of the (T,C) rows (a 128-bit fp32 pack
// of dwpe, 64 or 128 bits of dout per b); else a thread per position.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C, int vec) {
    const size_t n = (size_t)T * C, thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (!vec) {
        if (thread >= n) return;
        float sum = 0.0f;
        for (int b = 0; b < B; b++) sum += to_float(dout[(size_t)b * n + thread]);
        dwpe[thread] += sum;
        return;
    }
    const size_t i = thread * 4;
    if (i >= n) return;
    Packed4<float> sum = {};
    for (int b = 0; b < B; b++) {
        Packed4<floatX> g = *reinterpret_cast<const Packed4<floatX>*>(dout + (size_t)b * n + i);
#pragma unroll
        for (int k = 0; k < 4; k++) sum.v[k] += to_float(g.v[k]);
    }
    Packed4<float>* d = reinterpret_cast<Packed4<float>*>(dwpe + i);
    Packed4<float> w = *d;
#pragma unroll
    for (int k = 0; k < 4; k++) w.v[k] += sum.v[k];
    *d = w;
}

// dwte, pass 1. Block s sums segment s of the plan (at most ENCODER_WTE_SEGMENT positions of
// one token, in the plan's order) per column: into its token's row of dwte (+=) when the
// token has this one segment, else into its row `slot` of the partials (=). Row u of dwte:
// tokens[u], or u (compact). vec: C a multiple of the pack, dout and dwte 16-byte aligned.
__global__ void encoder_backward_wte_kernel(float* dwte, float* partials, const floatX* dout, const int* tokens,
                                            const int* order, const int* seg_start, const int* seg_token,
                                            const int* seg_slot, int C, int compact, int vec) {
    const int s = blockIdx.x, begin = seg_start[s], end = seg_start[s + 1], u = seg_token[s], slot = seg_slot[s];
    const bool add = slot < 0;
    float* dst = add ? dwte + (size_t)(compact ? u : tokens[u]) * C : partials + (size_t)slot * C;
    if (vec) {
        for (int c = threadIdx.x * PACK_X; c < C; c += blockDim.x * PACK_X) {
            float sum[PACK_X];
#pragma unroll
            for (int k = 0; k < PACK_X; k++) sum[k] = 0.0f;
            for (int j = begin; j < end; j++) {
                Packed128<floatX> g = load128(dout + (size_t)order[j] * C + c);
#pragma unroll
                for (int k = 0; k < PACK_X; k++) sum[k] += to_float(g.v[k]);
            }
#pragma unroll
            for (int k = 0; k < PACK_X; k += 4) {
                Packed128<float> d = add ? load128(dst + c + k) : Packed128<float>{};
#pragma unroll
                for (int i = 0; i < 4; i++) d.v[i] += sum[k + i];
                store128(dst + c + k, d);
            }
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float sum = 0.0f;
            for (int j = begin; j < end; j++) sum += to_float(dout[(size_t)order[j] * C + c]);
            dst[c] = add ? dst[c] + sum : sum;
        }
    }
}

// dwte, pass 2. Block (column chunk x, token y) adds the partials of multi-segment token
// multi_token[y] (rows multi_first[y].. of partials, multi_count[y] of them) into its dwte
// row: 8 row lanes each sum every 8th partial in order, then lane 0 adds the 8 in order.
__global__ void encoder_backward_wte_combine_kernel(float* dwte, const float* partials, const int* tokens,
                                                    const int* multi_token, const int* multi_first,
                                                    const int* multi_count, int C, int compact) {
    __shared__ float part[8][33];
    const int m = blockIdx.y, c = blockIdx.x * 32 + threadIdx.x, first = multi_first[m], count = multi_count[m];
    float sum = 0.0f;
    if (c < C) {
        for (int i = threadIdx.y; i < count; i += 8) sum += partials[(size_t)(first + i) * C + c];
    }
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
        for (int y = 0; y < 8; y++) total += part[y][threadIdx.x];
        int u = multi_token[m];
        dwte[(size_t)(compact ? u : tokens[u]) * C + c] += total;
    }
}

// Host-side grouping of the positions of one batch by token id, cut into segments of at
// most ENCODER_WTE_SEGMENT positions (the work of one block, whatever a token's count).
// Its int arrays lie back to back in one buffer (one upload):
//   tokens[U]        the distinct tokens, ascending (row u of a compact dwte)
//   order[BT]        the positions, grouped by token, ascending within a token
//   seg_start[S+1]   segment s is order[seg_start[s] .. seg_start[s+1])
//   seg_token[S]     its token's index u
//   seg_slot[S]      -1: the token's only segment; else its row of the partials
//   multi_token[M], multi_first[M], multi_count[M]: the tokens of several segments, their
//                    first partials row and segment count
// The host buffers are pinned, so their uploads are asynchronous (a pinned copy reads its
// source when it runs): two sets, used in turn, each refilled only once its previous upload
// has run (its event).
#define ENCODER_WTE_SEGMENT 64
typedef struct {
    int max_BT, C;
    int num_unique, num_segments, num_multi, num_ints;
    int* h_ints[2];            // host (pinned), two sets
    cudaEvent_t uploaded[2];   // after each set's copy
    int next;                  // the set the next build fills
    int* d_ints;               // device
    const int *d_tokens, *d_order, *d_seg_start, *d_seg_token, *d_seg_slot, *d_multi_token, *d_multi_first,
        *d_multi_count;        // views of d_ints for the last build
    float* d_partials;         // (encoder_plan_slots rows) x C
    int2* scratch;             // (token, position) pairs for sorting
} EncoderBackwardPlan;

// Bounds for BT positions: S <= U + BT / SEG segments, M <= BT / (SEG + 1) tokens of
// several segments, whose segments (the partials' rows) number at most M + BT / SEG.
static inline size_t encoder_plan_ints(int max_BT) {
    return 5 * (size_t)max_BT + 6 * (size_t)(max_BT / ENCODER_WTE_SEGMENT) + 8;
}
static inline size_t encoder_plan_slots(int max_BT) { return 2 * (size_t)(max_BT / ENCODER_WTE_SEGMENT) + 1; }

static void encoder_plan_init(EncoderBackwardPlan* p, int max_BT, int C) {
    memset(p, 0, sizeof(*p));
    p->max_BT = max_BT;
    p->C = C;
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMallocHost((void**)&p->h_ints[i], encoder_plan_ints(max_BT) * sizeof(int)));
        cudaCheck(cudaEventCreateWithFlags(&p->uploaded[i], cudaEventDisableTiming));
    }
    p->scratch = (int2*)mallocCheck((size_t)max_BT * sizeof(int2));
    p->d_ints = (int*)cudaMallocCheck(encoder_plan_ints(max_BT) * sizeof(int));
    p->d_partials = (float*)cudaMallocCheck(encoder_plan_slots(max_BT) * C * sizeof(float));
}

static void encoder_plan_free(EncoderBackwardPlan* p) {
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaEventSynchronize(p->uploaded[i]));
        cudaCheck(cudaFreeHost(p->h_ints[i]));
        cudaCheck(cudaEventDestroy(p->uploaded[i]));
    }
    free(p->scratch);
    cudaCheck(cudaFree(p->d_ints));
    cudaCheck(cudaFree(p->d_partials));
}

static int compare_token_position(const void* a, const void* b) {
    const int2* x = (const int2*)a;
    const int2* y = (const int2*)b;
    if (x->x != y->x) return x->x < y->x ? -1 : 1;
    return (x->y > y->y) - (x->y < y->y);
}

// The positions of sorted pairs v[i..] that hold v[i]'s token.
static int token_run(const int2* v, int i, int n) {
    int count = 1;
    while (i + count < n && v[i + count].x == v[i].x) count++;
    return count;
}

// Builds the plan for host inputs inp (BT) and queues its upload on stream (ordered before
// the encoder backward that reads it). The host waits only for the upload of the build
// before the last (normally long done).
static void encoder_plan_build(EncoderBackwardPlan* p, const int* inp, int BT, cudaStream_t stream) {
    if (BT > p->max_BT) fatal("encoder plan: BT %d exceeds %d", BT, p->max_BT);
    int set = p->next;
    p->next ^= 1;
    cudaCheck(cudaEventSynchronize(p->uploaded[set]));
    for (int i = 0; i < BT; i++) p->scratch[i] = make_int2(inp[i], i);
    qsort(p->scratch, (size_t)BT, sizeof(int2), compare_token_position);
    int U = 0, S = 0, M = 0;  // sizes first: the arrays lie back to back
    for (int i = 0, count; i < BT; i += count) {
        count = token_run(p->scratch, i, BT);
        U++;
        S += CEIL_DIV(count, ENCODER_WTE_SEGMENT);
        M += count > ENCODER_WTE_SEGMENT;
    }
    int* tokens = p->h_ints[set];
    int* order = tokens + U;
    int* seg_start = order + BT;
    int* seg_token = seg_start + S + 1;
    int* seg_slot = seg_token + S;
    int* multi_token = seg_slot + S;
    int* multi_first = multi_token + M;
    int* multi_count = multi_first + M;
    for (int i = 0; i < BT; i++) order[i] = p->scratch[i].y;
    int u = 0, s = 0, m = 0, slot = 0;
    for (int i = 0, count; i < BT; i += count, u++) {
        count = token_run(p->scratch, i, BT);
        tokens[u] = p->scratch[i].x;
        int segments = CEIL_DIV(count, ENCODER_WTE_SEGMENT);
        if (segments > 1) {
            multi_token[m] = u, multi_first[m] = slot, multi_count[m] = segments;
            m++;
        }
        for (int k = 0; k < segments; k++, s++) {
            seg_start[s] = i + k * ENCODER_WTE_SEGMENT;
            seg_token[s] = u;
            seg_slot[s] = segments > 1 ? slot++ : -1;
        }
    }
    seg_start[S] = BT;
    p->num_unique = U, p->num_segments = S, p->num_multi = M;
    p->num_ints = (int)(multi_count + M - tokens);
    if ((size_t)p->num_ints > encoder_plan_ints(p->max_BT) || (size_t)slot > encoder_plan_slots(p->max_BT)) {
        fatal("encoder plan: %d ints and %d partial rows exceed the bounds", p->num_ints, slot);
    }
    const int* d = p->d_ints;
    p->d_tokens = d, p->d_order = d + U, p->d_seg_start = p->d_order + BT, p->d_seg_token = p->d_seg_start + S + 1;
    p->d_seg_slot = p->d_seg_token + S, p->d_multi_token = p->d_seg_slot + S, p->d_multi_first = p->d_multi_token + M;
    p->d_multi_count = p->d_multi_first + M;
    cudaCheck(cudaMemcpyAsync(p->d_ints, tokens, (size_t)p->num_ints * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(p->uploaded[set], stream));
}

// dwte and dwpe are fp32 grad-buffer views; both accumulate (+=). compact: dwte holds
// one row per distinct token of the plan, ascending (llmc/model_hooks.h's embedding_grad_rows).
static void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const EncoderBackwardPlan* plan, int B, int T,
                             int C, int compact, cudaStream_t stream) {
    if (C != plan->C) fatal("encoder backward: C %d, the plan was made for %d", C, plan->C);
    size_t n = (size_t)T * C;
    int vec_wpe = n % 4 == 0 && aligned16(dout) && aligned16(dwpe);
    unsigned wpe_blocks = (unsigned)CEIL_DIV(vec_wpe ? n / 4 : n, 256);
    encoder_backward_wpe_kernel<<<wpe_blocks, 256, 0, stream>>>(dwpe, dout, B, T, C, vec_wpe);
    cudaCheckLaunch();
    if (plan->num_segments > 0) {
        int vec = C % PACK_X == 0 && aligned16(dout) && aligned16(dwte);
        encoder_backward_wte_kernel<<<plan->num_segments, 128, 0, stream>>>(
            dwte, plan->d_partials, dout, plan->d_tokens, plan->d_order, plan->d_seg_start, plan->d_seg_token,
            plan->d_seg_slot, C, compact, vec);
        cudaCheckLaunch();
    }
    if (plan->num_multi > 0) {
        dim3 grid(CEIL_DIV(C, 32), plan->num_multi), block(32, 8);
        encoder_backward_wte_combine_kernel<<<grid, block, 0, stream>>>(dwte, plan->d_partials, plan->d_tokens,
                                                                         plan->d_multi_token, plan->d_multi_first,
                                                                         plan->d_multi_count, C, compact);
        cudaCheckLaunch();
    }
}

#endif
