/*
 * dev/test/gpu_compute_mode.cu: prints GPU 0's compute mode as nvidia-smi names it (Default,
 * Exclusive_Process, Prohibited, Exclusive_Thread), from cudaDevAttrComputeMode, for
 * run_gpu_tests.sh: rows whose ranks share one GPU need Default. Without a GPU: "none", exit 2.
 */
#include <cuda_runtime.h>
#include <stdio.h>

int main(void) {
    int count = 0, mode = -1;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 ||
        cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, 0) != cudaSuccess) {
        printf("none\n");
        return 2;
    }
    const char* name = mode == cudaComputeModeDefault            ? "Default"
                       : mode == cudaComputeModeExclusiveProcess ? "Exclusive_Process"
                       : mode == cudaComputeModeProhibited       ? "Prohibited"
                                                                 : "Exclusive_Thread";
    printf("%s\n", name);
    return 0;
}
