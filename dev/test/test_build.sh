#!/usr/bin/env bash
# test: timeout=600 lane=alone tier=fast,full
# The CPU trainer and the oracle tests, with the zero1/ plugin (USE_ZERO1=1). The fast tier
# builds its unit tests here too (with USE_ZERO1=1, as every make of the fast tier, so that
# no script's make rewrites the build stamp); the full tier builds them in build_more.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
targets=(train_gpt2 test_gpt2 test_zero1)
in_tier fast && targets+=(test_kernels test_zero1_layout test_zero1_runtime test_zero1_devices)
check "make -j2 ${targets[*]} USE_ZERO1=1" make -j2 "${targets[@]}" USE_ZERO1=1
done_testing
