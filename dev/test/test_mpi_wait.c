/*
 * run/mpi_wait.h under mpirun (dev/test/test_faults.sh runs it):
 *   test_mpi_wait values          every helper's result against the sums and the gathered
 *                                 values computed here, the all-reduce also over several
 *                                 pieces (exit 0 and an ok line)
 *   test_mpi_wait stall SECONDS   the last rank never joins (it sleeps); the others wait in
 *                                 a multi-piece all-reduce with a deadline of SECONDS, so
 *                                 they must print the timeout line ("gradient all-reduce
 *                                 at step 7") and end the job; getting past it is a failure
 *   test_mpi_wait loop SECONDS N  N small all-reduces under a deadline of SECONDS, rank 0
 *                                 10 ms late to each (so the others are mostly waiting in
 *                                 one), then an ok line: the test stops every rank for
 *                                 longer than SECONDS and continues them one by one, which
 *                                 must not count as waiting (the test stops them also
 *                                 at known places: LLMC_TEST_STOP's step and wait points)
 * Prints TAP (dev/test/check.h) from rank 0.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dev/test/check.h"
#include "run/mpi_wait.h"
#include "run/seams.h"
#include "run/step.h"

static int check_values(int rank, int world) {
    int failures = 0;
    const size_t n = 3 * (size_t)MPI_WAIT_ALLREDUCE_PIECE + 7;  // four pieces, the last a short one
    float* sum = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) sum[i] = (float)(rank + 1) * (float)(i % 1000);
    mpi_allreduce_sum_deadline(sum, n, MPI_FLOAT, "test all-reduce", 1);
    float ranks_sum = (float)(world * (world + 1) / 2);
    for (size_t i = 0; i < n; i++) failures += sum[i] != ranks_sum * (float)(i % 1000);  // exact: small integers
    free(sum);
    double mine = 1.5 * rank, all[64];
    if (world > 64) fatal("test_mpi_wait: at most 64 ranks");
    mpi_allgather_deadline(&mine, all, 1, MPI_DOUBLE, "test all-gather", -1);
    for (int r = 0; r < world; r++) failures += all[r] != 1.5 * r;
    mpi_barrier_deadline("test barrier", 2);
    failures += all_ranks_equal(42, world) != 1;
    failures += all_ranks_equal((uint64_t)(rank == world - 1), world) != (world == 1);
    int total = failures;
    mpi_allreduce_sum_deadline(&total, 1, MPI_INT, "test failure count", -1);
    tap_ok(total == 0, "test_mpi_wait values: %d mismatches over %d ranks", total, world);
    return done_testing();
}

int main(int argc, char** argv) {
    int rank, world;
    mpi_start(&argc, &argv, &rank, &world);
    tap_rank = rank;
    const char* mode = argc >= 2 ? argv[1] : "";
    if (strcmp(mode, "values") == 0) {
        int rc = check_values(rank, world);
        MPI_Finalize();
        return rc;
    }
    if (!((strcmp(mode, "stall") == 0 && argc == 3) || (strcmp(mode, "loop") == 0 && argc == 4))) {
        fatal("usage: %s values | stall SECONDS | loop SECONDS N", argv[0]);
    }
    mpi_wait_set_timeout(atof(argv[2]));
    if (strcmp(mode, "loop") == 0) {
        int n = atoi(argv[3]);
        for (int i = 0; i < n; i++) {
            seam_stop_at("step", i + 1, "before step");  // LLMC_TEST_STOP (run/seams.h), as the trainers
            float x = 1.0f;
            mpi_allreduce_sum_deadline(&x, 1, MPI_FLOAT, "loop all-reduce", i + 1);
            if (x != (float)world) fatal("loop all-reduce %d: %g, want %d", i + 1, x, world);
            if (rank == 0) watchdog_sleep_us(10000);  // the others are mostly waiting in the all-reduce
        }
        tap_ok(1, "test_mpi_wait loop: %d all-reduces", n);
        int rc = done_testing();
        MPI_Finalize();
        return rc;
    }
    const size_t n = 2 * (size_t)MPI_WAIT_ALLREDUCE_PIECE + 3;
    float* x = (float*)callocCheck(n, sizeof(float));
    if (rank == world - 1) {
        sleep(60);  // never joins: the job must end before this
    } else {
        mpi_allreduce_sum_deadline(x, n, MPI_FLOAT, "gradient all-reduce", 7);
    }
    fprintf(stderr, "test_mpi_wait: rank %d got past the stalled all-reduce\n", rank);
    return 3;
}
