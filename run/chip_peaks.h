/*
 * The dense (no sparsity) peak FLOP rates of the GPUs MFU is counted against, by the name
 * cudaGetDeviceProperties gives. The GPU trainer's step line reports its model FLOPs
 * (llmc/gpt2_spec.h) as a share of the peak of its precision: BF16 on the tensor cores,
 * or FP32 on the CUDA cores (PRECISION=FP32 runs no TF32: llmc/matmul.cuh). A chip not in
 * the table gets no MFU, and the run's header says so.
 */
#ifndef RUN_CHIP_PEAKS_H
#define RUN_CHIP_PEAKS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char* match;  // a substring of the device name; the first row that matches is the chip
    const char* chip;   // how the header names it
    double bf16_tflops, fp32_tflops;
} ChipPeak;

// The row for device_name, or NULL when the chip is not in the table.
const ChipPeak* chip_peak_find(const char* device_name);

#ifdef __cplusplus
}
#endif
#endif
