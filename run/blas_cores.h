/*
 * The right OpenBLAS kernels on CPUs that OpenBLAS does not recognize.
 *
 * OpenBLAS's dynamic-arch builds (Debian's libopenblas0-pthread among them) choose their
 * kernels at load time from the CPU's family and model numbers. On cloud VMs that report
 * an unknown model, 0.3.21 falls back to "Prescott" (SSE3) kernels even on CPUs with
 * AVX-512: sgemm then runs about 4x slower and a CPU training step about 3x slower.
 * OpenBLAS reads its kernel choice from OPENBLAS_CORETYPE once, when the library loads,
 * so the only fix from inside the program is to set the variable and exec the program
 * again. Call blas_pick_kernels(argv) first thing in main(), before MPI_Init (an MPI
 * library must not see a process replace itself after it was set up):
 *
 *   - reads the CPU's own features with cpuid (and with xgetbv whether the OS saves the
 *     ymm/zmm registers) and picks the best kernels OpenBLAS has for them;
 *   - if OpenBLAS chose a less capable family and the user did not set OPENBLAS_CORETYPE,
 *     prints one line (rank 0) and re-executes /proc/self/exe with OPENBLAS_CORETYPE set;
 *   - the restarted process (marked by LLMC_BLAS_REEXEC=1) never restarts again: if
 *     OpenBLAS still runs lesser kernels it prints one warning and goes on. It takes back
 *     its name (exec of /proc/self/exe names a process "exe"), so that ps, top, pgrep and
 *     cluster tools find it as before.
 *
 * A user's OPENBLAS_CORETYPE is always respected, silently. Nothing happens off x86 or
 * when the program is not linked with OpenBLAS (openblas_get_corename is a weak symbol).
 *
 * A test build may pretend OpenBLAS reported other kernels (run/seams.h), so that the restart
 * is tested on a machine OpenBLAS detects right; the restarted process looks at the real name.
 */
#ifndef RUN_BLAS_CORES_H
#define RUN_BLAS_CORES_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "run/files.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDA_ARCH__)
#include <cpuid.h>
#define BLAS_CORES_X86 1
#endif
#ifdef __linux__
#include <sys/prctl.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Exported by libopenblas (and declared by its cblas.h); weak, so that a program linked
// with another BLAS still links and just skips the check.
char* openblas_get_corename(void) __attribute__((weak));


void blas_pick_kernels(char** argv);

#ifdef __cplusplus
}
#endif

#endif  // RUN_BLAS_CORES_H
