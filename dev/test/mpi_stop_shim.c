// An LD_PRELOAD shim that stops one rank inside an MPI call, as a rank whose host froze or
// that a debugger or the scheduler stopped there would be (test_mpi_stops.sh):
//
//   LLMC_TEST_MPI_STOP=NAME[:RANK[:NTH]]   stop world rank RANK (default 1) with SIGSTOP at
//                                          its NTH (default 1) call of NAME, before the call
//
// The other ranks then wait inside the real call; the job must end within its deadline
// (--comm-timeout) naming the call, never hang. Built by the test: cc -shared -fPIC ... -ldl.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Stops this process if NAME is the call (and the rank and count) the variable names.
static void maybe_stop(const char* name) {
    static int calls;
    const char* spec = getenv("LLMC_TEST_MPI_STOP");
    const char* rank_text = getenv("OMPI_COMM_WORLD_RANK");
    if (!spec || !rank_text) return;
    char call[64];
    int rank = 1, nth = 1;
    if (sscanf(spec, "%63[^:]:%d:%d", call, &rank, &nth) < 1 || strcmp(call, name) != 0) return;
    if (atoi(rank_text) != rank || ++calls != nth) return;
    fprintf(stderr, "mpi_stop_shim: rank %d stopped in %s (call %d)\n", rank, name, nth);
    raise(SIGSTOP);
}

#define REAL(name, type) ((type)dlsym(RTLD_NEXT, name))

int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm* newcomm) {
    maybe_stop("MPI_Comm_split_type");
    return REAL("MPI_Comm_split_type", int (*)(MPI_Comm, int, int, MPI_Info, MPI_Comm*))(comm, split_type, key, info,
                                                                                        newcomm);
}

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* newcomm) {
    maybe_stop("MPI_Comm_split");
    return REAL("MPI_Comm_split", int (*)(MPI_Comm, int, int, MPI_Comm*))(comm, color, key, newcomm);
}

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* newcomm) {
    maybe_stop("MPI_Comm_dup");
    return REAL("MPI_Comm_dup", int (*)(MPI_Comm, MPI_Comm*))(comm, newcomm);
}

int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                  MPI_Datatype recv_type, MPI_Comm comm) {
    maybe_stop("MPI_Allgather");
    return REAL("MPI_Allgather", int (*)(const void*, int, MPI_Datatype, void*, int, MPI_Datatype, MPI_Comm))(
        send, send_count, send_type, recv, recv_count, recv_type, comm);
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
    maybe_stop("MPI_Bcast");
    return REAL("MPI_Bcast", int (*)(void*, int, MPI_Datatype, int, MPI_Comm))(buffer, count, type, root, comm);
}

int MPI_Init(int* argc, char*** argv) {
    maybe_stop("MPI_Init");
    return REAL("MPI_Init", int (*)(int*, char***))(argc, argv);
}

int MPI_Finalize(void) {
    maybe_stop("MPI_Finalize");
    return REAL("MPI_Finalize", int (*)(void))();
}
