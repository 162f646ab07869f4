#!/usr/bin/env bash
# test: timeout=1800 lane=layer tier=full
# The GPU suite (dev/test/run_gpu_tests.sh) on the CPU execution layer.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
CUDA_ON_CPU=1 exec bash dev/test/run_gpu_tests.sh
