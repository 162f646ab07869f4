/*
 * The CPU trainer's threads: how many per rank, and who runs the matmuls.
 *
 * One pool of threads does all the work. With Debian's default OpenBLAS (its pthread
 * build) OpenBLAS is set to one thread and the trainer's OpenMP threads share out the
 * tiles of every product (llmc/matmul.h): OpenBLAS's own pool next to OpenMP's made the
 * two spin and yield against each other on the same cores (two thirds of the samples of a
 * 2-core profile in libgomp's spin and the kernel's scheduling). OpenBLAS's OpenMP build
 * shares OpenMP's pool already, so there it threads the products itself.
 *
 * How many: the cores this rank may run on (sched_getaffinity: mpirun's or taskset's
 * binding) divided among the ranks of its host whose cores overlap them, at least 1, so
 * that N ranks on a host never run more threads than it has cores. A user's
 * OMP_NUM_THREADS or OPENBLAS_NUM_THREADS is kept as given, once checked (a whole number
 * from 1 to THREADS_MAX, else one error naming the variable), and the threads are started
 * once as a probe, so that a limit on threads is an error here; the line after the start line
 * says which numbers were chosen and which were the user's (docs/training.md#threads).
 */
#ifndef RUN_THREADS_H
#define RUN_THREADS_H

#include <mpi.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "llmc/matmul.h"
#include "run/mpi_wait.h"
#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

// The most threads per rank a user may ask for: beyond it a rank only oversubscribes its cores.
#define THREADS_MAX 1024

// Weak, as those of llmc/matmul.h.
void openblas_set_num_threads(int n) __attribute__((weak));

typedef struct {
    int threads;          // OpenMP threads per rank
    int cores;            // cores this rank may run on
    int sharing;          // ranks of this host whose cores overlap this rank's (itself included)
    int user_omp;         // OMP_NUM_THREADS was set: threads is the user's
    int blas_threads;     // OpenBLAS's threads (1: the products are split by the trainer)
    int user_blas;        // OPENBLAS_NUM_THREADS was set
    int blas_openmp;      // OpenBLAS is its OpenMP build
} CpuThreads;

// A set of cores as the kernel's sched_getaffinity gives it (1024 cores, glibc's
// cpu_set_t; the raw call, since glibc's CPU_* macros need _GNU_SOURCE before any header).
typedef struct {
    uint64_t bits[16];
} CoreSet;

// Chooses and sets the threads; every rank calls it (a collective), after MPI_Init and
// before the first parallel region.
CpuThreads cpu_threads_setup(void);

// The line after the start line (rank 0 prints it): the choice, and whose it was.
void cpu_threads_describe(const CpuThreads* t, char* buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
