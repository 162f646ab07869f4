#!/usr/bin/env bash
# Compiles every CUDA target in both precisions (CI calls this; no GPU needed):
#   train_gpt2cu, test_gpt2cu, test_zero1_cuda, test_watchdog_cuda  x  FP32, BF16, test_kernels_cuda (BF16),
#   and the plugin builds (USE_ZERO1=1) of train_gpt2cu and test_gpt2cu in both precisions
# Each build is forced (make -B: the Makefile's output names do not encode the
# precision) and its binary moved to a scratch directory, so no stale binary of the
# other precision can hide a compile error. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v "${NVCC:-nvcc}" >/dev/null 2>&1 && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
    echo "check_cuda_build: nvcc not found (install the CUDA toolkit, put nvcc on PATH or set CUDA_HOME)" >&2
    exit 1
fi
export PATH=$PATH:${CUDA_HOME:-/usr/local/cuda}/bin
OUT=$(mktemp -d /tmp/llmc_cuda_build.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
build() {  # build TARGET PRECISION [extra make args]
    local target=$1 precision=$2
    shift 2
    echo "== make $target PRECISION=$precision $*"
    make -B "$target" PRECISION="$precision" "$@"
    mv "$target" "$OUT/${target}_${precision}"
}
for precision in FP32 BF16; do
    build train_gpt2cu "$precision"
    build test_gpt2cu "$precision"
    build test_zero1_cuda "$precision"
    build test_watchdog_cuda "$precision"
done
# The kernel tests include every llmc/*.cuh, which the trainers above compile in both
# precisions already: one precision is enough to keep the test itself compiling (CI time).
build test_kernels_cuda BF16
# The plugin build (`make train_gpt2cu USE_ZERO1=1`, docs/design.md "Architecture"); CHECK_CUDA_ZERO1=0 skips it.
if [ "${CHECK_CUDA_ZERO1:-1}" != 0 ]; then
    for precision in FP32 BF16; do
        build train_gpt2cu "$precision" USE_ZERO1=1
        build test_gpt2cu "$precision" USE_ZERO1=1
    done
fi
echo "check_cuda_build: every CUDA target compiles in FP32 and BF16"
