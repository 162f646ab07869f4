// run/chip_peaks.c: what run/chip_peaks.h declares.
#include "run/chip_peaks.h"

#include <stddef.h>
#include <string.h>

// NVIDIA's data sheets, dense rates (the sheets' headline BF16 figures are with 2:4
// sparsity, twice these): H100 and H200 Tensor Core GPU data sheets (SXM, PCIe, NVL
// columns), GH200 Grace Hopper Superchip and A100 Tensor Core GPU data sheets (A100's SXM
// and PCIe alike). The longer names come before the bare chip's, which the SXM parts carry
// ("NVIDIA H100 80GB HBM3"; "NVIDIA GH200 480GB" holds "H200" too).
static const ChipPeak CHIP_PEAKS[] = {
    {"H100 NVL", "H100 NVL", 835.0, 60.0},
    {"H100 PCIe", "H100 PCIe", 756.0, 51.0},
    {"H100", "H100 SXM", 989.0, 67.0},
    {"GH200", "GH200", 989.0, 67.0},
    {"H200 NVL", "H200 NVL", 835.0, 60.0},
    {"H200", "H200 SXM", 989.0, 67.0},
    {"A100", "A100", 312.0, 19.5},
};

const ChipPeak* chip_peak_find(const char* device_name) {
    for (size_t i = 0; i < sizeof(CHIP_PEAKS) / sizeof(CHIP_PEAKS[0]); i++) {
        if (strstr(device_name, CHIP_PEAKS[i].match)) return &CHIP_PEAKS[i];
    }
    return NULL;
}
