#!/usr/bin/env bash
# test: timeout=600 lane=layer tier=full
# The CPU execution layer's own tests (cuda_cpu/tests/run_layer_tests.sh).
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
exec bash cuda_cpu/tests/run_layer_tests.sh
