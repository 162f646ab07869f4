/*
 * cuda_cpu/mpi_check.c: memcheck at the MPI boundary (CUDA_CPU_CHECK=memcheck). MPI is not
 * instrumented, so a device pointer handed to it (a GPU program's staged path passing the
 * device buffer instead of its host copy) would run on the layer, where device memory is
 * host memory, and crash a GPU's process (an MPI that is not CUDA-aware reads and writes
 * its buffers on the host). This file is an MPI profiling layer (the MPI standard's PMPI
 * interface, "Profiling Interface"): it defines the MPI calls that take buffers, each of
 * which checks its buffers and calls the PMPI_ one; the layer refuses a device buffer as
 * memcheck refuses host code touching device memory (one error line naming the call, the
 * argument, the allocation and the caller's line, then abort()).
 *
 * Compiled against the program's own mpi.h (MPI's handle types differ between
 * implementations), so not part of libcuda_cpu.a: a CUDA_CPU_TOOLS=1 build that links MPI
 * links this object too (the project's Makefile; cuda_cpu.mk's test_boundary). Without
 * memcheck each call only adds the check's test.
 */
#include <mpi.h>
#include <stddef.h>

// tools_memcheck.cpp: returns unless memcheck is on and buf is device memory.
void cudacpu_memcheck_mpi_buffer(const char* call, const char* arg, const void* buf, long long bytes,
                                 const void* caller);

static long long bytes_of(int count, MPI_Datatype type) {
    int size = 0;
    if (type != MPI_DATATYPE_NULL) PMPI_Type_size(type, &size);
    return (long long)count * size;
}

// In each wrapper: checks one buffer argument (named as the MPI standard names it).
#define CHECK(arg, count, type) \
    cudacpu_memcheck_mpi_buffer(__func__, #arg, arg, bytes_of(count, type), __builtin_return_address(0))

int MPI_Send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
    CHECK(buf, count, type);
    return PMPI_Send(buf, count, type, dest, tag, comm);
}
int MPI_Recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status) {
    CHECK(buf, count, type);
    return PMPI_Recv(buf, count, type, source, tag, comm, status);
}
int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request* req) {
    CHECK(buf, count, type);
    return PMPI_Isend(buf, count, type, dest, tag, comm, req);
}
int MPI_Irecv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Request* req) {
    CHECK(buf, count, type);
    return PMPI_Irecv(buf, count, type, source, tag, comm, req);
}
int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
    CHECK(buffer, count, type);
    return PMPI_Bcast(buffer, count, type, root, comm);
}
int MPI_Ibcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request* req) {
    CHECK(buffer, count, type);
    return PMPI_Ibcast(buffer, count, type, root, comm, req);
}
int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    CHECK(sendbuf, count, type);
    CHECK(recvbuf, count, type);
    return PMPI_Allreduce(sendbuf, recvbuf, count, type, op, comm);
}
int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* req) {
    CHECK(sendbuf, count, type);
    CHECK(recvbuf, count, type);
    return PMPI_Iallreduce(sendbuf, recvbuf, count, type, op, comm, req);
}
int MPI_Reduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, int root, MPI_Comm comm) {
    CHECK(sendbuf, count, type);
    CHECK(recvbuf, count, type);
    return PMPI_Reduce(sendbuf, recvbuf, count, type, op, root, comm);
}
// sendbuf holds recvcount elements per rank: its size below is one rank's block.
int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype type, MPI_Op op,
                             MPI_Comm comm) {
    CHECK(sendbuf, recvcount, type);
    CHECK(recvbuf, recvcount, type);
    return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, type, op, comm);
}
int MPI_Ireduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype type, MPI_Op op,
                              MPI_Comm comm, MPI_Request* req) {
    CHECK(sendbuf, recvcount, type);
    CHECK(recvbuf, recvcount, type);
    return PMPI_Ireduce_scatter_block(sendbuf, recvbuf, recvcount, type, op, comm, req);
}
// The gathers' recvbuf: one rank's block (recvcount), or its start (the v-forms' counts vary).
int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm) {
    CHECK(sendbuf, sendcount, sendtype);
    CHECK(recvbuf, recvcount, recvtype);
    return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}
int MPI_Iallgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                   MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* req) {
    CHECK(sendbuf, sendcount, sendtype);
    CHECK(recvbuf, recvcount, recvtype);
    return PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, req);
}
int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
               MPI_Datatype recvtype, int root, MPI_Comm comm) {
    CHECK(sendbuf, sendcount, sendtype);
    CHECK(recvbuf, recvcount, recvtype);
    return PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
}
int MPI_Igather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                MPI_Datatype recvtype, int root, MPI_Comm comm, MPI_Request* req) {
    CHECK(sendbuf, sendcount, sendtype);
    CHECK(recvbuf, recvcount, recvtype);
    return PMPI_Igather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm, req);
}
int MPI_Gatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                const int displs[], MPI_Datatype recvtype, int root, MPI_Comm comm) {
    CHECK(sendbuf, sendcount, sendtype);
    CHECK(recvbuf, 0, recvtype);
    return PMPI_Gatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root, comm);
}
int MPI_Igatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                 const int displs[], MPI_Datatype recvtype, int root, MPI_Comm comm, MPI_Request* req) {
    CHECK(sendbuf, sendcount, sendtype);
    CHECK(recvbuf, 0, recvtype);
    return PMPI_Igatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root, comm, req);
}
int MPI_Alltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                  void* recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm) {
    CHECK(sendbuf, 0, sendtype);
    CHECK(recvbuf, 0, recvtype);
    return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm);
}
int MPI_Ialltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                   void* recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm,
                   MPI_Request* req) {
    CHECK(sendbuf, 0, sendtype);
    CHECK(recvbuf, 0, recvtype);
    return PMPI_Ialltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm, req);
}
int MPI_File_write_at_all(MPI_File fh, MPI_Offset offset, const void* buf, int count, MPI_Datatype type,
                          MPI_Status* status) {
    CHECK(buf, count, type);
    return PMPI_File_write_at_all(fh, offset, buf, count, type, status);
}
int MPI_File_read_at_all(MPI_File fh, MPI_Offset offset, void* buf, int count, MPI_Datatype type, MPI_Status* status) {
    CHECK(buf, count, type);
    return PMPI_File_read_at_all(fh, offset, buf, count, type, status);
}
