/*
 * Causal multi-head self-attention through cuDNN's fused SDPA (scaled dot-product
 * attention), for `make train_gpt2cu USE_CUDNN=1` and --attention cudnn (BF16 builds only:
 * cuDNN's SDPA has no fp32 inputs). Implemented in llmc/cudnn_attention.cpp, an object of
 * its own (the cuDNN C++ frontend is a large header-only C++17 library), so the rest of the
 * trainer stays C-like and does not recompile it.
 *
 * Layouts as the naive path's (llmc/attention.cuh), read and written in place through
 * strides, with no permute:
 *   qkv  (B,T,3C) = [q | k | v], head h at channels h*hs..(h+1)*hs-1 of each; C = NH*hs
 *   out  (B,T,C)    out[b,t,h,:] = sum_{s<=t} softmax_s(scale * q[b,t,h,:].k[b,s,h,:]) v[b,s,h,:]
 *   stats (B,NH,T) fp32: the logsumexp of each row's scaled, masked scores (natural log),
 *                  which the backward needs instead of the (B,NH,T,T) probabilities
 *   dqkv (B,T,3C)  overwritten with [dq | dk | dv]
 * Precision: bf16 inputs and outputs, fp32 softmax and accumulation inside cuDNN.
 * The backward asks for cuDNN's deterministic algorithm, so repeated runs give the same bits.
 *
 * Graphs are built on the first call for each (B, T, NH, hs, forward|backward) and cached;
 * one workspace (grown when a graph needs more) and one cuDNN handle serve them all, made
 * on first use on the current device. cudnn_attention_free() releases everything (at the
 * model's exit); a later call starts afresh. Any cuDNN failure is one fatal() naming the
 * shape and cuDNN's message. Not yet run on a GPU: see docs/gpu.md, "cuDNN attention".
 */
#ifndef LLMC_CUDNN_ATTENTION_H
#define LLMC_CUDNN_ATTENTION_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

void attention_forward_cudnn(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv, int B, int T, int NH, int hs,
                             float scale, cudaStream_t stream);
void attention_backward_cudnn(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                              const __nv_bfloat16* out, const float* stats, int B, int T, int NH, int hs, float scale,
                              cudaStream_t stream);
void cudnn_attention_free(void);
// Whether this process prints what each graph cost to build (the trainer: rank 0 only).
void cudnn_attention_report(int on);

#endif
