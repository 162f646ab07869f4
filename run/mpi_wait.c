// run/mpi_wait.c: what run/mpi_wait.h declares.
#include "run/mpi_wait.h"

#include "run/config.h"  // CLI_MIN_COMM_TIMEOUT_S

static double mpi_wait_timeout_s_ = WATCHDOG_DEFAULT_TIMEOUT_S;

void mpi_wait_set_timeout(double seconds) { mpi_wait_timeout_s_ = seconds; }

void mpi_abort_world(void) { MPI_Abort(MPI_COMM_WORLD, 1); }

void mpi_blocking_begin(const char* what) { watchdog_arm(what, mpi_wait_timeout_s_, mpi_abort_world); }

void mpi_blocking_end(void) { watchdog_disarm(); }

static int mpi_pending_done(void* ctx) {
    MpiPending* p = (MpiPending*)ctx;
    int done = 0;
    mpiCheck(MPI_Testall(p->count, p->requests, &done, MPI_STATUSES_IGNORE));
    return done;
}

static const char* mpi_pending_describe(void* ctx, char* buf, size_t n) {
    const MpiPending* p = (const MpiPending*)ctx;
    if (p->step >= 0) snprintf(buf, n, "%s at step %d", p->what, p->step);
    else snprintf(buf, n, "%s", p->what);
    return buf;
}

// Waits for all `count` requests; past the deadline ends the job naming `what` (and
// `step`, 1-based as the step lines count; < 0: none).
static void mpi_wait_all_deadline(int count, MPI_Request* requests, const char* what, int step) {
    MpiPending p = {requests, count, what, step};
    watchdog_poll_until(mpi_pending_done, &p, mpi_wait_timeout_s_, mpi_pending_describe, mpi_abort_world);
}

void mpi_wait_deadline(MPI_Request* request, const char* what, int step) {
    mpi_wait_all_deadline(1, request, what, step);
}

void mpi_allreduce_sum_deadline(void* buf, size_t count, MPI_Datatype type, const char* what, int step) {
    int type_bytes;
    mpiCheck(MPI_Type_size(type, &type_bytes));
    int pieces = (int)((count + MPI_WAIT_ALLREDUCE_PIECE - 1) / MPI_WAIT_ALLREDUCE_PIECE);
    MPI_Request* requests = (MPI_Request*)mallocCheck((size_t)(pieces > 0 ? pieces : 1) * sizeof(MPI_Request));
    for (int i = 0; i < pieces; i++) {
        size_t at = (size_t)i * MPI_WAIT_ALLREDUCE_PIECE, n = count - at;
        if (n > MPI_WAIT_ALLREDUCE_PIECE) n = MPI_WAIT_ALLREDUCE_PIECE;
        mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, (char*)buf + at * (size_t)type_bytes, (int)n, type, MPI_SUM,
                                MPI_COMM_WORLD, &requests[i]));
    }
    mpi_wait_all_deadline(pieces, requests, what, step);
    free(requests);
}

void mpi_allgather_deadline(const void* mine, void* all, int count, MPI_Datatype type, const char* what,
                            int step) {
    MPI_Request request;
    mpiCheck(MPI_Iallgather(mine, count, type, all, count, type, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, what, step);
}

void mpi_barrier_deadline(const char* what, int step) {
    MPI_Request request;
    mpiCheck(MPI_Ibarrier(MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, what, step);
}

// --comm-timeout as the command line gives it, before the flags are parsed (they are checked
// later): MPI_Init waits for every rank's start, under the job's deadline too.
static void mpi_wait_timeout_from_args(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; i++) {
        char* end;
        double s = strcmp(argv[i], "--comm-timeout") == 0 ? strtod(argv[i + 1], &end) : -1;
        // below CLI_MIN_COMM_TIMEOUT_S (the flags' check refuses it) MPI_Init keeps the default
        if ((s == 0 || s >= CLI_MIN_COMM_TIMEOUT_S) && *end == '\0') mpi_wait_timeout_s_ = s;
    }
}

void mpi_start(int* argc, char*** argv, int* rank, int* world) {
    mpi_wait_timeout_from_args(*argc, *argv);
    mpiDeadline("MPI_Init (the launcher's start-up exchange)", MPI_Init(argc, argv));
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    utils_set_rank(*rank, *world);
}
