/*
 * zero1/plan.h: what zero1_plan's two files share: zero1_plan.c (the options, the element-wise
 * plan, the printing of one buffer) and plan_muon.c (--optimizer muon: two buffers).
 */
#ifndef ZERO1_PLAN_H
#define ZERO1_PLAN_H

#include <stdio.h>

#include "llmc/gpt2_spec.h"
#include "zero1/layout.h"
#include "zero1/ledger.h"

typedef struct {
    size_t* numels;  // owned
    int num_params;
    const char* model;
    int vocab, max_seq, heads;
    GPT2Config cfg;
    int dp;                 // data-parallel ranks in all
    int instances;          // groups that each shard the state; the layout's DP is dp / instances
    long long bucket_size;  // -1 default, 0 none: as given (the layout's: zero1_ddp_bucket_size)
    int overlap_grad_reduce;
    int pad_busbw;
    int shared_embedding;
    int split_embedding;
    int grad_bytes;         // --grad-dtype: 4 or 2
    int fp32_accumulation, average_in_collective;
    int tokens;             // --split-embedding: tokens per micro-step per rank
    int dp_invariant;
    int accumulation;       // --dp-invariant: micro-steps per step
    int muon;               // --optimizer muon
    int wpe_muon;           // --wpe muon: Megatron's routing of wpe
    int* is_muon;           // owned, num_params entries (muon only): the Muon matrices
    int json, shards, help;
    const char* batch_file;
} PlanOptions;

// One buffer as zero1_plan prints it: the layout, its params' model indices, and which
// optimizer owns it (NULL: the one buffer of --optimizer adamw, printed as before).
typedef struct {
    const Zero1Layout* layout;
    const int* model_index;  // buffer index -> model index; NULL: the same
    const char* optimizer;   // "adamw", "muon" or NULL
    int layerwise;           // 1: whole matrices per shard (layout_layerwise.h)
    int split_param;         // buffer index of the split embedding, -1 none
} PlanBuffer;

static inline int plan_model_index(const PlanBuffer* B, int p) { return B->model_index ? B->model_index[p] : p; }

const char* plan_param_name(const PlanOptions* o, int model_index, char* buf, size_t n);
// The first line of the text: the model, or the --numels list.
void plan_print_model(FILE* f, const PlanOptions* o);
// The ledger of one buffer for param_bytes (2: bf16 params, 4: fp32); Muon's state on the
// layer-wise buffer.
Zero1Ledger plan_ledger(const PlanOptions* o, const PlanBuffer* B, int param_bytes);
// One buffer's JSON object (no newline); -1 with a message if a shard could not be built.
int plan_print_buffer_json(FILE* f, const PlanOptions* o, const PlanBuffer* B, char* err, size_t n);
// The bucket table and its total line; when each bucket's collectives start (--model); the
// shards (--shards). -1 with a message if a shard could not be built.
void plan_print_bucket_table(FILE* f, const PlanOptions* o, const PlanBuffer* B);
void plan_print_timing(FILE* f, const PlanOptions* o, const PlanBuffer* B);
int plan_print_shards(FILE* f, const PlanOptions* o, const PlanBuffer* B, char* err, size_t n);
void plan_print_ledger_legend(FILE* f, const PlanOptions* o);

// --optimizer muon: builds both buffers and prints them. Returns the exit code.
int plan_muon_run(const PlanOptions* o, int json);

#endif
