/*
 * A batch's tokens (inputs and targets, B*T ints each) reach the GPU from pinned host
 * memory, on an upload stream of their own, through two slots, so that the next batch's
 * upload runs while the current one's forward and backward compute:
 *   batch_upload   copies the host batch into the next slot's pinned buffers and queues
 *                  their copies to the slot's device buffers on the upload stream;
 *   batch_take     makes the compute stream wait for the oldest queued slot's copies
 *                  (its `uploaded` event) before the encoder reads them;
 *   batch_release  records the slot's `consumed` event on the compute stream after the
 *                  last kernel that reads its device buffers.
 * The hazards and what orders them:
 *   - compute reads a device buffer before its copy ran: batch_take's wait on `uploaded`;
 *   - a copy overwrites a device buffer a forward (or backward) still reads: the upload
 *     stream waits on the slot's `consumed` before the copies;
 *   - the host refills a pinned buffer whose copy has not run (a pinned copy reads its
 *     source when it runs, not when it is queued): batch_upload waits on the slot's
 *     previous `uploaded` on the host first (it is normally long complete: it was the
 *     upload before the last one).
 * A slot is refilled by the upload after next, so the forward of a batch and its backward
 * must come before two more uploads; generation numbers make that checkable
 * (batch_still_holds). The host copy of the inputs (a slot's pinned h_inputs) stays valid
 * for as long, which the encoder backward's plan (llmc/encoder.cuh) reads.
 * A pinned copy may run as late as the first wait on it: dev/test/test_kernels_cuda.cu's
 * test_batch_upload runs the copies that late, so that a missing wait shows as wrong tokens,
 * and checks that the waits here are what prevents it.
 */
#ifndef LLMC_BATCH_UPLOAD_CUH
#define LLMC_BATCH_UPLOAD_CUH

#include <string.h>

#include "llmc/cuda_common.cuh"

#define BATCH_SLOTS 2

typedef struct {
    int *h_inputs, *h_targets;  // pinned, max_BT each
    int *d_inputs, *d_targets;  // device, max_BT each
    int BT, has_targets;
    long long generation;       // which upload filled it (1, 2, ...)
    cudaEvent_t uploaded;       // upload stream, after the copies
    cudaEvent_t consumed;       // compute stream, after the last reader
} BatchSlot;

typedef struct {
    BatchSlot slot[BATCH_SLOTS];
    int max_BT;
    int next;                   // the slot the next upload fills
    int queued;                 // uploaded, not yet taken (0..BATCH_SLOTS)
    long long uploads;
    int test_skip_waits;        // test only, bits: 1 the host's, 2 the upload stream's, 4 compute's wait
    cudaStream_t stream;        // the upload stream
} BatchUploader;

static void batch_uploader_init(BatchUploader* u, int max_BT) {
    memset(u, 0, sizeof(*u));
    u->max_BT = max_BT;
    cudaCheck(cudaStreamCreateWithFlags(&u->stream, cudaStreamNonBlocking));
    for (int i = 0; i < BATCH_SLOTS; i++) {
        BatchSlot* s = &u->slot[i];
        cudaCheck(cudaMallocHost((void**)&s->h_inputs, (size_t)max_BT * sizeof(int)));
        cudaCheck(cudaMallocHost((void**)&s->h_targets, (size_t)max_BT * sizeof(int)));
        s->d_inputs = (int*)cudaMallocCheck((size_t)max_BT * sizeof(int));
        s->d_targets = (int*)cudaMallocCheck((size_t)max_BT * sizeof(int));
        cudaCheck(cudaEventCreateWithFlags(&s->uploaded, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&s->consumed, cudaEventDisableTiming));
    }
}

static void batch_uploader_free(BatchUploader* u) {
    cudaCheck(cudaStreamSynchronize(u->stream));
    for (int i = 0; i < BATCH_SLOTS; i++) {
        BatchSlot* s = &u->slot[i];
        cudaCheck(cudaFreeHost(s->h_inputs));
        cudaCheck(cudaFreeHost(s->h_targets));
        cudaCheck(cudaFree(s->d_inputs));
        cudaCheck(cudaFree(s->d_targets));
        cudaCheck(cudaEventDestroy(s->uploaded));
        cudaCheck(cudaEventDestroy(s->consumed));
    }
    cudaCheck(cudaStreamDestroy(u->stream));
}

// Queues the upload of a batch (targets may be NULL); the host arrays may be reused as
// soon as this returns.
static void batch_upload(BatchUploader* u, const int* inputs, const int* targets, int BT) {
    if (BT > u->max_BT) fatal("batch upload: B*T %d exceeds %d", BT, u->max_BT);
    if (u->queued == BATCH_SLOTS) fatal("batch upload: %d batches uploaded and none taken", BATCH_SLOTS);
    BatchSlot* s = &u->slot[u->next];
    if (!(u->test_skip_waits & 1)) cudaCheck(cudaEventSynchronize(s->uploaded));  // its pinned buffers are free
    memcpy(s->h_inputs, inputs, (size_t)BT * sizeof(int));
    if (targets) memcpy(s->h_targets, targets, (size_t)BT * sizeof(int));
    s->BT = BT;
    s->has_targets = targets != NULL;
    s->generation = ++u->uploads;
    if (!(u->test_skip_waits & 2)) cudaCheck(cudaStreamWaitEvent(u->stream, s->consumed, 0));  // its device buffers are free
    cudaCheck(cudaMemcpyAsync(s->d_inputs, s->h_inputs, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, u->stream));
    if (targets) {
        cudaCheck(cudaMemcpyAsync(s->d_targets, s->h_targets, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice,
                                  u->stream));
    }
    cudaCheck(cudaEventRecord(s->uploaded, u->stream));
    u->next = (u->next + 1) % BATCH_SLOTS;
    u->queued++;
}

// The oldest uploaded batch; `compute` waits for its copies.
static BatchSlot* batch_take(BatchUploader* u, cudaStream_t compute) {
    if (u->queued == 0) fatal("batch take: no batch uploaded");
    BatchSlot* s = &u->slot[(u->next + BATCH_SLOTS - u->queued) % BATCH_SLOTS];
    u->queued--;
    if (!(u->test_skip_waits & 4)) cudaCheck(cudaStreamWaitEvent(compute, s->uploaded, 0));
    return s;
}

// After the last kernel queued on `compute` that reads the slot's device buffers.
static void batch_release(BatchSlot* s, cudaStream_t compute) { cudaCheck(cudaEventRecord(s->consumed, compute)); }

// Whether the slot still holds the batch of that generation (not refilled since).
static int batch_still_holds(const BatchSlot* s, long long generation) { return s->generation == generation; }

#endif
