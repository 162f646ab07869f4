/*
 * zero1/comm_nccl.cu: the NCCL communicator (see zero1/comm_nccl.h).
 *
 * Stream and event plan, per collective:
 *   compute: ... kernels that wrote buf ... [record compute_ready]
 *   comm:    [wait compute_ready] NCCL collective [record slot.done]
 *   wait(h): compute [wait slot.done]; later compute work runs after the collective.
 * cudaStreamWaitEvent binds the record in effect when it is queued, so one compute_ready
 * event serves every collective, and a slot's event can be recorded again once its
 * handle is finished.
 *
 * Inside an NCCL group the collectives are only queued on the comm stream at
 * ncclGroupEnd, so the completion events of a group's collectives are recorded after
 * it; until then their slots are GROUPED (not yet launched).
 *
 * In place, with count = n / size elements per rank:
 *   reduce-scatter  sendbuff = buf,                 recvbuff = buf + rank*count
 *   all-gather      sendbuff = buf + rank*count,    recvbuff = buf
 *   all-reduce      sendbuff = recvbuff = buf
 * which are exactly NCCL's in-place forms (recvbuff == sendbuff + rank*recvcount for
 * reduce-scatter, sendbuff == recvbuff + rank*sendcount for all-gather).
 * ZERO1_AVG is ncclAvg (for floating types NCCL pre-multiplies each input by 1/nranks:
 * see zero1/comm.h). all_to_all_v is one NCCL group of an ncclSend and an ncclRecv per
 * peer (itself included), ordered like the collectives.
 */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llmc/cuda_common.cuh"
#include "zero1/comm_nccl.h"
#include "zero1/device_cuda.h"

enum { SLOT_FREE = 0, SLOT_GROUPED, SLOT_LAUNCHED };

typedef enum { OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_ALL_REDUCE, OP_ALL_TO_ALL } CollectiveOp;
static const char* const OP_NAMES[] = {"reduce-scatter", "all-gather", "all-reduce", "all-to-all"};

typedef struct {
    int state;
    cudaEvent_t done;  // recorded on the comm stream after the collective; NULL until first used
    CollectiveOp op;   // for messages
    int bucket, step;
    Zero1Event trace_start;  // timed, on the comm stream, when tracing
} NcclSlot;

typedef struct {
    ncclComm_t comm;          // NULL after abort
    cudaStream_t stream;      // the communication stream
    cudaStream_t compute;     // the device's compute stream (borrowed)
    cudaEvent_t compute_ready;
    NcclSlot* slots;
    int num_slots;
    int in_group;
    // host_all_gather: over MPI where MPI bootstrapped the communicator (the host never
    // waits for the GPU then), else through NCCL and a device scratch buffer.
    int has_mpi;
    MPI_Comm host_comm;
    void* scratch;
    size_t scratch_cap;
} NcclImpl;

static NcclImpl* impl_of(Zero1Comm* c) { return (NcclImpl*)c->impl; }

// NCCL failures name the call and give NCCL's own account of what went wrong.
static void nccl_fail(ncclResult_t r, ncclComm_t comm, const char* what, const char* file, int line) {
    const char* detail = ncclGetLastError(comm);
    fatal("NCCL %s failed at %s:%d: %s%s%s", what, file, line, ncclGetErrorString(r), detail && *detail ? ": " : "",
          detail ? detail : "");
}
#define ncclCheckCall(call, comm, what)                                        \
    do {                                                                       \
        ncclResult_t nccl_status_ = (call);                                    \
        if (nccl_status_ != ncclSuccess) nccl_fail(nccl_status_, (comm), (what), __FILE__, __LINE__); \
    } while (0)

static ncclDataType_t nccl_type(Zero1Dtype t) {
    switch (t) {
        case ZERO1_FP32: return ncclFloat;
        case ZERO1_BF16: return ncclBfloat16;
        case ZERO1_FP64: return ncclDouble;
    }
    fatal("zero1 nccl: no NCCL type for dtype %d", (int)t);
}

// ----------------------------------------------------------------------------
// Handles

static int take_slot(NcclImpl* im) {
    int h = 0;
    while (h < im->num_slots && im->slots[h].state != SLOT_FREE) h++;
    if (h == im->num_slots) {
        int n = im->num_slots ? 2 * im->num_slots : 16;
        im->slots = (NcclSlot*)realloc(im->slots, (size_t)n * sizeof(NcclSlot));
        if (!im->slots) fatal("out of memory growing the NCCL handle table");
        memset(im->slots + im->num_slots, 0, (size_t)(n - im->num_slots) * sizeof(NcclSlot));
        im->num_slots = n;
    }
    if (im->slots[h].done == NULL) cudaCheck(cudaEventCreateWithFlags(&im->slots[h].done, cudaEventDisableTiming));
    return h;
}

static NcclSlot* slot_in_flight(Zero1Comm* c, Zero1Handle h, const char* caller) {
    NcclImpl* im = impl_of(c);
    if (h >= im->num_slots || im->slots[h].state == SLOT_FREE) {
        fatal("zero1 nccl: %s of handle %d, which is not in flight (finished twice?)", caller, h);
    }
    return &im->slots[h];
}

static void finish_slot(NcclImpl* im, NcclSlot* s) {
    // Complete or not, the compute stream now waits for it: what the caller queues next
    // runs after the collective (when complete, the wait costs nothing).
    cudaCheck(cudaStreamWaitEvent(im->compute, s->done, 0));
    s->state = SLOT_FREE;
}

static void nccl_wait(Zero1Comm* c, Zero1Handle h) {
    if (h < 0) return;
    NcclSlot* s = slot_in_flight(c, h, "wait");
    if (s->state == SLOT_GROUPED) {
        fatal("zero1 nccl: wait for the %s of bucket %d inside its group: call group_end first", OP_NAMES[s->op], s->bucket);
    }
    finish_slot(impl_of(c), s);
}

static int nccl_test(Zero1Comm* c, Zero1Handle h) {
    if (h < 0) return 1;
    NcclSlot* s = slot_in_flight(c, h, "test");
    if (s->state == SLOT_GROUPED) return 0;  // not even launched yet
    cudaError_t status = zero1_cuda_event_status(s->done);
    if (status == cudaErrorNotReady) return 0;
    if (status != cudaSuccess) {
        fatal("zero1 nccl: the %s of bucket %d (step %d) failed on the GPU: %s", OP_NAMES[s->op], s->bucket, s->step,
              cudaGetErrorString(status));
    }
    finish_slot(impl_of(c), s);
    return 1;
}

// ----------------------------------------------------------------------------
// Collectives

// The collective is queued on the comm stream: its completion event (and trace span) follow it.
static void mark_launched(Zero1Comm* c, NcclSlot* s) {
    NcclImpl* im = impl_of(c);
    zero1_trace_end(c->tracer, s->op == OP_ALL_GATHER ? TRACE_PARAM_COMM : TRACE_GRAD_COMM, s->trace_start,
                    (Zero1Stream)im->stream, "%s b%d", OP_NAMES[s->op], s->bucket);
    s->trace_start = NULL;
    cudaCheck(cudaEventRecord(s->done, im->stream));
    s->state = SLOT_LAUNCHED;
}

// A slot for a collective about to be queued on the comm stream, which is ordered after
// what the compute stream was given so far (ordering in).
static int begin_collective(Zero1Comm* c, CollectiveOp op, int bucket) {
    NcclImpl* im = impl_of(c);
    int h = take_slot(im);
    NcclSlot* s = &im->slots[h];
    s->op = op;
    s->bucket = bucket;
    s->step = c->step;
    cudaCheck(cudaEventRecord(im->compute_ready, im->compute));
    cudaCheck(cudaStreamWaitEvent(im->stream, im->compute_ready, 0));
    s->trace_start = bucket >= 0 ? zero1_trace_begin(c->tracer, (Zero1Stream)im->stream) : NULL;
    return h;
}

// The collective's NCCL calls returned r: name it on failure, else mark it queued (or
// grouped: recorded at group_end, after NCCL has queued the work).
static Zero1Handle end_collective(Zero1Comm* c, int h, ncclResult_t r) {
    NcclImpl* im = impl_of(c);
    NcclSlot* s = &im->slots[h];
    if (r != ncclSuccess) {
        char what[96];
        snprintf(what, sizeof(what), "%s of bucket %d (step %d)", OP_NAMES[s->op], s->bucket, c->step);
        nccl_fail(r, im->comm, what, __FILE__, __LINE__);
    }
    if (im->in_group) s->state = SLOT_GROUPED;
    else mark_launched(c, s);
    return h;
}

static Zero1Handle nccl_collective(Zero1Comm* c, CollectiveOp op, void* buf, size_t n, Zero1Dtype t,
                                   Zero1ReduceOp rop, int bucket) {
    NcclImpl* im = impl_of(c);
    if (im->comm == NULL) fatal("zero1 nccl: %s after the communicator was aborted", OP_NAMES[op]);
    if (n == 0) return -1;  // every rank has the same n: nothing to do anywhere
    if (op != OP_ALL_REDUCE && n % (size_t)c->size != 0) {
        fatal("zero1 nccl: %s of bucket %d: %zu elements do not split over %d ranks", OP_NAMES[op], bucket, n, c->size);
    }
    ncclDataType_t type = nccl_type(t);
    ncclRedOp_t red = rop == ZERO1_AVG ? ncclAvg : ncclSum;
    size_t count = n / (size_t)c->size;
    char* whole = (char*)buf;
    char* mine = whole + (size_t)c->rank * count * zero1_dtype_size(t);
    int h = begin_collective(c, op, bucket);
    ncclResult_t r = ncclSuccess;
    if (op == OP_REDUCE_SCATTER) r = ncclReduceScatter(whole, mine, count, type, red, im->comm, im->stream);
    else if (op == OP_ALL_GATHER) r = ncclAllGather(mine, whole, count, type, im->comm, im->stream);
    else r = ncclAllReduce(whole, whole, n, type, red, im->comm, im->stream);
    return end_collective(c, h, r);
}

// One NCCL group of point-to-point calls (to itself too), so that all pairs progress at once.
static Zero1Handle nccl_all_to_all_v(Zero1Comm* c, const void* send, const size_t* send_counts,
                                     const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                     const size_t* recv_offsets, Zero1Dtype t, int bucket) {
    NcclImpl* im = impl_of(c);
    if (im->comm == NULL) fatal("zero1 nccl: all-to-all after the communicator was aborted");
    ncclDataType_t type = nccl_type(t);
    size_t e = zero1_dtype_size(t);
    int h = begin_collective(c, OP_ALL_TO_ALL, bucket);
    ncclCheckCall(ncclGroupStart(), im->comm, "all-to-all group start");
    for (int r = 0; r < c->size; r++) {
        if (send_counts[r]) {
            ncclCheckCall(ncclSend((const char*)send + send_offsets[r] * e, send_counts[r], type, r, im->comm,
                                   im->stream), im->comm, "all-to-all send");
        }
        if (recv_counts[r]) {
            ncclCheckCall(ncclRecv((char*)recv + recv_offsets[r] * e, recv_counts[r], type, r, im->comm, im->stream),
                          im->comm, "all-to-all receive");
        }
    }
    ncclCheckCall(ncclGroupEnd(), im->comm, "all-to-all group end");
    return end_collective(c, h, ncclSuccess);
}

static void nccl_host_all_gather(Zero1Comm* c, const void* mine, void* all, size_t bytes) {
    NcclImpl* im = impl_of(c);
    if (im->has_mpi) {
        if (bytes > INT_MAX) fatal("zero1 nccl: a host all-gather of %zu bytes", bytes);
        mpiCheck(MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, im->host_comm));
        return;
    }
    if (im->in_group) fatal("zero1 nccl: host all-gather inside a group");
    size_t total = bytes * (size_t)c->size;
    if (total == 0) return;
    if (im->scratch_cap < total) {  // grows to the largest metadata once, in the first steps
        cudaCheck(cudaFree(im->scratch));
        im->scratch = cudaMallocCheck(total);
        im->scratch_cap = total;
    }
    char* scratch = (char*)im->scratch;
    cudaCheck(cudaMemcpyAsync(scratch + (size_t)c->rank * bytes, mine, bytes, cudaMemcpyHostToDevice, im->stream));
    ncclCheckCall(ncclAllGather(scratch + (size_t)c->rank * bytes, scratch, bytes, ncclUint8, im->comm, im->stream),
                  im->comm, "host all-gather");
    cudaCheck(cudaMemcpyAsync(all, scratch, total, cudaMemcpyDeviceToHost, im->stream));
    cudaCheck(cudaStreamSynchronize(im->stream));
}

static Zero1Handle nccl_reduce_scatter(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, Zero1ReduceOp op, int bucket) {
    return nccl_collective(c, OP_REDUCE_SCATTER, buf, n, t, op, bucket);
}
static Zero1Handle nccl_all_gather(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, int bucket) {
    return nccl_collective(c, OP_ALL_GATHER, buf, n, t, ZERO1_SUM, bucket);
}
static Zero1Handle nccl_all_reduce(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, Zero1ReduceOp op, int bucket) {
    return nccl_collective(c, OP_ALL_REDUCE, buf, n, t, op, bucket);
}

static void nccl_group_begin(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (im->in_group) fatal("zero1 nccl: group_begin inside a group (groups do not nest)");
    ncclCheckCall(ncclGroupStart(), im->comm, "group start");
    im->in_group = 1;
}

static void nccl_group_end(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (!im->in_group) fatal("zero1 nccl: group_end without group_begin");
    im->in_group = 0;
    ncclCheckCall(ncclGroupEnd(), im->comm, "group end");
    for (int i = 0; i < im->num_slots; i++) {
        NcclSlot* s = &im->slots[i];
        if (s->state != SLOT_GROUPED) continue;
        mark_launched(c, s);
    }
}

// NCCL moves its work on by itself. This is where a peer's failure can be noticed
// early (a network error, a rank that died): NCCL reports it through
// ncclCommGetAsyncError while the collective itself may never complete. A timeout
// watchdog (a deadline per in-flight handle, checked here or by a host thread) would
// poll the same call and, past the deadline, name the collective and call
// zero1_comm_nccl_abort so that no rank hangs forever.
static void nccl_progress(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (im->comm == NULL) return;
    ncclResult_t async_error = ncclSuccess;
    ncclCheckCall(ncclCommGetAsyncError(im->comm, &async_error), im->comm, "async error query");
    if (async_error != ncclSuccess && async_error != ncclInProgress) {
        nccl_fail(async_error, im->comm, "communication (reported asynchronously)", __FILE__, __LINE__);
    }
}

static void nccl_destroy(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (im->in_group) fatal("zero1 nccl: destroy inside an open group");
    cudaCheck(cudaStreamSynchronize(im->stream));  // every collective has finished
    if (im->comm) ncclCheckCall(ncclCommDestroy(im->comm), NULL, "communicator destroy");
    for (int i = 0; i < im->num_slots; i++) {
        if (im->slots[i].done) cudaCheck(cudaEventDestroy(im->slots[i].done));
    }
    free(im->slots);
    if (im->has_mpi) mpiCheck(MPI_Comm_free(&im->host_comm));
    if (im->scratch) cudaCheck(cudaFree(im->scratch));
    cudaCheck(cudaEventDestroy(im->compute_ready));
    cudaCheck(cudaStreamDestroy(im->stream));
    free(im);
    free(c);
}

int zero1_comm_nccl_abort(Zero1Comm* c) {
    NcclImpl* im = impl_of(c);
    if (im->comm == NULL) return 0;
    ncclResult_t r = ncclCommAbort(im->comm);
    im->comm = NULL;
    return r == ncclSuccess ? 0 : (int)r;
}

void* zero1_comm_nccl_stream(Zero1Comm* c) { return (void*)impl_of(c)->stream; }

int zero1_nccl_usable(int local_rank, int local_world) {
    if (local_world < 1 || local_rank < 0 || local_rank >= local_world) return 0;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();  // no GPU is an answer here, not an error for later checks
        return 0;
    }
    return count >= local_world;
}

// ----------------------------------------------------------------------------
// Bootstrap of the ncclUniqueId

static void bootstrap_mpi(int color, ncclUniqueId* id, int* rank, int* size, MPI_Comm* host_comm) {
    int initialized = 0;
    mpiCheck(MPI_Initialized(&initialized));
    if (!initialized) fatal("zero1 nccl: the MPI bootstrap needs MPI_Init first");
    MPI_Comm group = MPI_COMM_WORLD;
    if (color >= 0) {
        int world_rank;
        mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
        mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, color, world_rank, &group));
    }
    mpiCheck(MPI_Comm_rank(group, rank));
    mpiCheck(MPI_Comm_size(group, size));
    if (*rank == 0) ncclCheckCall(ncclGetUniqueId(id), NULL, "get unique id");
    mpiCheck(MPI_Bcast(id, (int)sizeof(*id), MPI_BYTE, 0, group));
    mpiCheck(MPI_Comm_dup(group, host_comm));  // the same ranks in the same order, for host metadata
    if (group != MPI_COMM_WORLD) mpiCheck(MPI_Comm_free(&group));
}

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define ID_FILE_MAGIC "zero1-nccl-id 1"
#define MAX_TOKEN 200

void zero1_nccl_id_file_publish(const char* path, const char* token, int size, const void* id, size_t id_bytes) {
    char tmp[PATH_MAX_LEN];
    path_format(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    FILE* f = fopenCheck(tmp, "w");
    fprintf(f, "%s\ntoken %s\nsize %d\nid ", ID_FILE_MAGIC, token, size);
    for (size_t i = 0; i < id_bytes; i++) fprintf(f, "%02x", ((const unsigned char*)id)[i]);
    fprintf(f, "\n");
    // On a network filesystem the data must be out before the name appears.
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) fatal("cannot write the NCCL id file '%s': %s", tmp, strerror(errno));
    fcloseCheck(f, tmp);
    // rename replaces a file left by an earlier run in one step: a reader sees the old
    // file or the new one, never a mix, and the token tells the old one apart.
    if (rename(tmp, path) != 0) fatal("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
}

// 1 and the id when path holds this run's id; 0 (with what was seen in `seen`) when it
// does not exist yet, is an earlier run's, or cannot be parsed.
static int read_id_file(const char* path, const char* token, int size, unsigned char* id, size_t id_bytes, char* seen,
                        size_t seen_len) {
    FILE* f = fopen(path, "r");
    if (!f) {
        snprintf(seen, seen_len, "no file: %s", strerror(errno));
        return 0;
    }
    char text[1024];
    size_t got = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[got] = '\0';
    char file_token[MAX_TOKEN + 1], hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
    int file_size = 0;
    if (strncmp(text, ID_FILE_MAGIC "\n", sizeof(ID_FILE_MAGIC)) != 0 ||
        sscanf(text + sizeof(ID_FILE_MAGIC), "token %200s size %d id %256s", file_token, &file_size, hex) != 3) {
        snprintf(seen, seen_len, "a file that is not an NCCL id file");
        return 0;
    }
    if (strcmp(file_token, token) != 0) {
        snprintf(seen, seen_len, "a file of run '%s'", file_token);
        return 0;
    }
    if (file_size != size) fatal("NCCL id file '%s' is for %d ranks, this run has %d", path, file_size, size);
    if (strlen(hex) != 2 * id_bytes) fatal("NCCL id file '%s' holds an id of the wrong length", path);
    for (size_t i = 0; i < id_bytes; i++) {
        unsigned byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) fatal("NCCL id file '%s' holds a malformed id", path);
        id[i] = (unsigned char)byte;
    }
    return 1;
}

void zero1_nccl_id_file_await(const char* path, const char* token, int size, void* id, size_t id_bytes,
                              double timeout_s) {
    if (id_bytes > NCCL_UNIQUE_ID_BYTES) fatal("zero1 nccl: id of %zu bytes", id_bytes);
    double start = monotonic_s();
    char seen[MAX_TOKEN + 64];
    while (!read_id_file(path, token, size, (unsigned char*)id, id_bytes, seen, sizeof(seen))) {
        if (monotonic_s() - start > timeout_s) {
            fatal("no NCCL id for run '%s' in '%s' after %.1f s (found %s); rank 0 writes it there: did it start, "
                  "and do all ranks share that filesystem?", token, path, timeout_s, seen);
        }
        usleep(100 * 1000);
    }
}

// A rank or size from the caller, else from the environment.
static int rank_or_env(int given, const char* env, const char* what) {
    if (given >= 0) return given;
    const char* v = getenv(env);
    if (!v || !*v) fatal("zero1 nccl: the file bootstrap needs the %s: pass it or set %s", what, env);
    char* end;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > INT_MAX) fatal("zero1 nccl: %s=%s is not a valid %s", env, v, what);
    return (int)x;
}

// The caller's token, else Slurm's job and step: unique to this launch, shared by its ranks.
static void run_token(const char* given, char* token, size_t len) {
    if (given) {
        snprintf(token, len, "%s", given);
    } else {
        const char* job = getenv("SLURM_JOB_ID");
        const char* step = getenv("SLURM_STEP_ID");
        if (!job || !*job) fatal("zero1 nccl: the file bootstrap needs a run token (or SLURM_JOB_ID) to tell runs apart");
        snprintf(token, len, "%s.%s", job, step && *step ? step : "0");
    }
    // len > MAX_TOKEN + 1, so a token cut short by snprintf is still too long here.
    if (!*token || strlen(token) > MAX_TOKEN) fatal("zero1 nccl: run token must have 1 to %d characters", MAX_TOKEN);
    for (const char* p = token; *p; p++) {
        if (*p <= ' ' || *p > '~') fatal("zero1 nccl: run token '%s' has a space or a non-printable character", token);
    }
}

// After ncclCommInitRank on every rank: each rank read the id before joining, and a
// one-int all-reduce completes only when all have joined, so rank 0 may remove the file.
static void nccl_barrier(NcclImpl* im) {
    int* one = (int*)cudaMallocCheck(sizeof(int));
    cudaCheck(cudaMemsetAsync(one, 0, sizeof(int), im->stream));
    ncclCheckCall(ncclAllReduce(one, one, 1, ncclInt, ncclSum, im->comm, im->stream), im->comm, "start-up barrier");
    cudaCheck(cudaStreamSynchronize(im->stream));
    cudaCheck(cudaFree(one));
}

Zero1Comm* zero1_comm_nccl_create(const Zero1Device* dev, const Zero1NcclBootstrap* boot) {
    if (!dev || !boot) fatal("zero1 nccl: the communicator needs a device and a bootstrap");
    if (dev->ops != &zero1_device_cuda_ops) {
        fatal("zero1 nccl: the NCCL communicator moves GPU buffers; the device is '%s'", dev->ops->name);
    }
    int rank = 0, size = 0;
    ncclUniqueId id;
    MPI_Comm host_comm = MPI_COMM_NULL;
    char token[MAX_TOKEN + 64];
    if (boot->mode == ZERO1_NCCL_BOOT_MPI) {
        bootstrap_mpi(boot->color, &id, &rank, &size, &host_comm);
    } else if (boot->mode == ZERO1_NCCL_BOOT_FILE) {
        if (!boot->id_file || !*boot->id_file) fatal("zero1 nccl: the file bootstrap needs a path for the id file");
        rank = rank_or_env(boot->rank, "SLURM_PROCID", "rank");
        size = rank_or_env(boot->size, "SLURM_NTASKS", "number of ranks");
        if (size < 1 || rank >= size) fatal("zero1 nccl: rank %d of %d ranks", rank, size);
        utils_set_rank(rank, size);  // this file's error messages name the rank (no MPI to ask)
        run_token(boot->run_token, token, sizeof(token));
        if (rank == 0) {
            ncclCheckCall(ncclGetUniqueId(&id), NULL, "get unique id");
            zero1_nccl_id_file_publish(boot->id_file, token, size, &id, sizeof(id));
        } else {
            zero1_nccl_id_file_await(boot->id_file, token, size, &id, sizeof(id), boot->timeout_s > 0 ? boot->timeout_s : 600);
        }
    } else {
        fatal("zero1 nccl: unknown bootstrap mode %d", (int)boot->mode);
    }

    NcclImpl* im = (NcclImpl*)callocCheck(1, sizeof(NcclImpl));
    im->compute = (cudaStream_t)dev->compute;
    im->has_mpi = host_comm != MPI_COMM_NULL;
    im->host_comm = host_comm;
    cudaCheck(cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&im->compute_ready, cudaEventDisableTiming));
    ncclCheckCall(ncclCommInitRank(&im->comm, size, id, rank), NULL, "communicator init");
    if (boot->mode == ZERO1_NCCL_BOOT_FILE) {
        nccl_barrier(im);
        if (rank == 0 && unlink(boot->id_file) != 0 && errno != ENOENT) {
            fprintf(stderr, "warning: could not remove the NCCL id file '%s': %s\n", boot->id_file, strerror(errno));
        }
    }

    Zero1Comm* c = (Zero1Comm*)callocCheck(1, sizeof(Zero1Comm));
    c->rank = rank;
    c->size = size;
    c->name = "nccl";
    c->traces_itself = 1;  // its collectives run on its own stream: device-time spans
    c->issue_order_matters = 1;  // NCCL kernels of all communicators queue on one GPU
    c->impl = im;
    c->reduce_scatter = nccl_reduce_scatter;
    c->all_gather = nccl_all_gather;
    c->all_reduce = nccl_all_reduce;
    c->all_to_all_v = nccl_all_to_all_v;
    c->host_all_gather = nccl_host_all_gather;
    c->wait = nccl_wait;
    c->test = nccl_test;
    c->progress = nccl_progress;
    c->group_begin = nccl_group_begin;
    c->group_end = nccl_group_end;
    c->destroy = nccl_destroy;
    return c;
}
