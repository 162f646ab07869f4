/*
 * llmc/mpi_wait.h under mpirun (dev/test/test_faults.sh runs it):
 *   test_mpi_wait values                 every helper's result against the sums and the
 *                                        gathered values computed here (exit 0, PASS line)
 *   test_mpi_wait stall-polled|stall-armed SECONDS
 *                                        the last rank never joins (it sleeps); the others
 *                                        wait in mpi_allreduce_sum_deadline (polled) or
 *                                        mpi_allreduce_sum_armed (blocking under a timer)
 *                                        with a deadline of SECONDS, so they must print the
 *                                        timeout line ("gradient all-reduce at step 7") and
 *                                        end the job; reaching the end is a failure (exit 3).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "llmc/mpi_wait.h"
#include "llmc/train_loop.h"

static int check_values(int rank, int world) {
    int failures = 0;
    enum { N = 1000 };
    float sum[N], big[N];
    for (int i = 0; i < N; i++) sum[i] = big[i] = (float)(rank + 1) * (float)i;
    mpi_allreduce_sum_deadline(sum, N, MPI_FLOAT, "test all-reduce", 1);
    mpi_allreduce_sum_armed(big, N, MPI_FLOAT, "test armed all-reduce", 1);
    float ranks_sum = (float)(world * (world + 1) / 2);
    for (int i = 0; i < N; i++) {
        failures += sum[i] != ranks_sum * (float)i;  // small integers: exact in any order
        failures += big[i] != ranks_sum * (float)i;
    }
    double mine = 1.5 * rank, all[64];
    if (world > 64) fatal("test_mpi_wait: at most 64 ranks");
    mpi_allgather_deadline(&mine, all, 1, MPI_DOUBLE, "test all-gather", -1);
    for (int r = 0; r < world; r++) failures += all[r] != 1.5 * r;
    mpi_barrier_deadline("test barrier", 2);
    failures += all_ranks_equal(42, world) != 1;
    failures += all_ranks_equal((uint64_t)(rank == world - 1), world) != (world == 1);
    int total = failures;
    mpi_allreduce_sum_deadline(&total, 1, MPI_INT, "test failure count", -1);
    if (rank == 0) printf("%s test_mpi_wait values: %d mismatches over %d ranks\n", total ? "FAIL" : "PASS", total, world);
    return total ? 1 : 0;
}

int main(int argc, char** argv) {
    int rank, world;
    mpi_start(&argc, &argv, &rank, &world);
    if (argc >= 2 && strcmp(argv[1], "values") == 0) {
        int rc = check_values(rank, world);
        MPI_Finalize();
        return rc;
    }
    if (argc != 3 || (strcmp(argv[1], "stall-polled") != 0 && strcmp(argv[1], "stall-armed") != 0)) {
        fatal("usage: %s values | stall-polled SECONDS | stall-armed SECONDS", argv[0]);
    }
    mpi_wait_set_timeout(atof(argv[2]));
    float x[4] = {1, 2, 3, 4};
    if (rank == world - 1) {
        sleep(60);  // never joins: the job must end before this
    } else if (strcmp(argv[1], "stall-armed") == 0) {
        mpi_allreduce_sum_armed(x, 4, MPI_FLOAT, "gradient all-reduce", 7);
    } else {
        mpi_allreduce_sum_deadline(x, 4, MPI_FLOAT, "gradient all-reduce", 7);
    }
    fprintf(stderr, "test_mpi_wait: rank %d got past the stalled all-reduce\n", rank);
    return 3;
}
