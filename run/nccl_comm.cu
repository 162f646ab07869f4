// run/nccl_comm.cu: what run/nccl_comm.h declares.
#include "run/nccl_comm.h"

#include "run/seams.h"

#include <string.h>

void nccl_check(ncclResult_t r, ncclComm_t comm, const char* what, const char* file, int line) {
    if (r == ncclSuccess) return;
    const char* detail = ncclGetLastError(comm);
    fatal("NCCL error%s%s at %s:%d: %s%s%s", what ? " in " : "", what ? what : "", file, line, ncclGetErrorString(r),
          detail && *detail ? ": " : "", detail ? detail : "");
}

int mpi_local_rank(int* local_world) {
    MPI_Comm node;
    int local_rank;
    mpiDeadline("the local rank's MPI_Comm_split_type",
                MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_rank(node, &local_rank));
    mpiCheck(MPI_Comm_size(node, local_world));
    mpiDeadline("the local rank's MPI_Comm_free", MPI_Comm_free(&node));
    return local_rank;
}

int gpus_distinct_on_node(void) {
    MPI_Comm node;
    int n;
    mpiDeadline("the GPU check's MPI_Comm_split_type",
                MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_size(node, &n));
    int device;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    char* all = (char*)mallocCheck((size_t)n * sizeof(prop.uuid));
    mpiDeadline("the GPU check's MPI_Allgather of GPU UUIDs",
                MPI_Allgather(&prop.uuid, (int)sizeof(prop.uuid), MPI_BYTE, all, (int)sizeof(prop.uuid), MPI_BYTE, node));
    int distinct = 1;
    for (int i = 0; i < n && distinct; i++) {
        for (int j = i + 1; j < n; j++) {
            if (memcmp(all + i * sizeof(prop.uuid), all + j * sizeof(prop.uuid), sizeof(prop.uuid)) == 0) distinct = 0;
        }
    }
    free(all);
    mpiDeadline("the GPU check's MPI_Comm_free", MPI_Comm_free(&node));
    return distinct;
}

void nccl_comm_init(NcclComm* c, int rank, int world, int local_rank, int local_world) {
    c->rank = rank;
    c->world = world;
    c->local_rank = local_rank;
    c->local_world = local_world;
    c->comm = NULL;
    if (world == 1) return;
    if (!gpus_distinct_on_node()) {
        fatal("%d ranks on this node share GPUs, and the replicated optimizer's NCCL all-reduce needs one GPU per "
              "rank: start at most one rank per GPU, or use the zero1/ build (`make train_gpt2cu USE_ZERO1=1`), "
              "whose --comm mpi (or auto) runs ranks that share a GPU", local_world);
    }
    ncclUniqueId id;
    if (rank == 0) ncclCheck(ncclGetUniqueId(&id));
    mpiDeadline("the NCCL bootstrap's MPI_Bcast of its unique id", MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    ncclCheck(ncclCommInitRank(&c->comm, world, id, rank));
}

void nccl_comm_destroy_deadline(ncclComm_t comm, const char* what) {
    seam_stop_at("teardown", 1, "before its ncclCommDestroy number");
    mpi_blocking_begin(what);
    ncclCheck(ncclCommDestroy(comm));
    mpi_blocking_end();
}

void nccl_comm_free(NcclComm* c) {
    if (c->comm) nccl_comm_destroy_deadline(c->comm, "ncclCommDestroy of the gradient all-reduce's communicator");
    c->comm = NULL;
}

void nccl_all_reduce_sum(float* buf, size_t n, const NcclComm* c, cudaStream_t stream) {
    if (c->world == 1 || n == 0) return;
    ncclCheck(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, c->comm, stream));
}
