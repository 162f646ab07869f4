/*
 * Host callbacks a model calls at layer boundaries, so that an optimizer can act there
 * without the model knowing about communication: wait for a bucket's all-gather before a
 * block reads it, launch a bucket's reduce-scatter once its last gradient is final, let a
 * network backend progress, trace. The CPU model (llmc/gpt2_cpu.h) and the GPU model
 * (llmc/gpt2_cuda.cuh) call the same hooks at the same points; on the GPU they run when the
 * kernels are queued, not when they execute, and an optimizer orders the device with events.
 *
 * Block numbering: -1 = embeddings (wte, wpe), 0..L-1 = transformer blocks, L = final
 * LayerNorm and classifier (which reads wte again). Every member may be NULL.
 */
#ifndef LLMC_MODEL_HOOKS_H
#define LLMC_MODEL_HOOKS_H

typedef struct {
    void* ctx;
    void (*forward_block_begin)(void* ctx, int block);
    void (*forward_block_end)(void* ctx, int block);
    void (*backward_block_begin)(void* ctx, int block);
    void (*backward_block_end)(void* ctx, int block);
    // One contribution to a tensor's gradient is queued (wte gets two per micro-step).
    void (*grad_contribution_done)(void* ctx, int tensor);
    // Called right before the encoder's backward with the host's token ids of the n
    // positions. NULL (or a NULL result): the encoder accumulates into the tensor's dense
    // gradient as usual. Otherwise the encoder accumulates into the returned zeroed rows
    // instead, one row of C floats per distinct token in ascending token order (the order
    // of the GPU encoder's plan), and *row_of_position (n ints) maps each position to its
    // row; both live where the model's kernels write (device memory on the GPU). The
    // grad_contribution_done for the tensor that follows then means "the rows are ready".
    float* (*embedding_grad_rows)(void* ctx, int tensor, const int* host_tokens, int n, const int** row_of_position);
} ModelHooks;

#define HOOK(m, name, ...) \
    do { if ((m)->hooks.name) (m)->hooks.name((m)->hooks.ctx, __VA_ARGS__); } while (0)

#endif
