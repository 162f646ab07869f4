/*
 * zero1/comm.h: the communicator the ZeRO-1 runtime talks through.
 *
 * The runtime never names MPI or NCCL: a backend fills this table. Every collective is
 * asynchronous and returns a handle; wait() blocks until it is complete, test() asks
 * without blocking, progress() gives a backend that needs it (Open MPI does not
 * progress non-blocking collectives in the background) a chance to move them on.
 *
 * In-place conventions, identical for every backend:
 *  - reduce_scatter(buf, n): buf holds a whole bucket of n elements (n divisible by the
 *    size); on completion this rank's slot buf[rank*n/size, (rank+1)*n/size) holds the
 *    sum over ranks of that slot. The rest of buf is unspecified.
 *  - all_gather(buf, n): this rank's slot of buf is its contribution; on completion all
 *    of buf holds every rank's slot.
 *  - all_reduce(buf, n): element-wise sum, in place.
 */
#ifndef ZERO1_COMM_H
#define ZERO1_COMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ZERO1_FP32 = 0, ZERO1_BF16 = 1, ZERO1_FP64 = 2 } Zero1Dtype;

static inline size_t zero1_dtype_size(Zero1Dtype t) { return t == ZERO1_FP64 ? 8 : t == ZERO1_FP32 ? 4 : 2; }

typedef int Zero1Handle;  // -1: none

typedef struct Zero1Comm Zero1Comm;
struct Zero1Comm {
    int rank, size;
    const char* name;  // "mpi", "single", "nccl"
    void* impl;
    Zero1Handle (*reduce_scatter)(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t);
    Zero1Handle (*all_gather)(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t);
    Zero1Handle (*all_reduce)(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t);
    void (*wait)(Zero1Comm* c, Zero1Handle h);
    int (*test)(Zero1Comm* c, Zero1Handle h);  // 1 when complete (the handle is then released)
    void (*progress)(Zero1Comm* c);
    void (*destroy)(Zero1Comm* c);
};

// Backends. The MPI one uses MPI_COMM_WORLD (MPI must be initialised).
Zero1Comm* zero1_comm_single_create(void);
Zero1Comm* zero1_comm_mpi_create(void);

#ifdef __cplusplus
}
#endif
#endif
