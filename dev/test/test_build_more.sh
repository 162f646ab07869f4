#!/usr/bin/env bash
# test: timeout=600 lane=alone tier=full
# The other binaries the CPU tests run: the plain trainer, the data and planning tools, the
# unit tests.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
targets=(train_gpt2_plain prepro_text prepro_corpus zero1_plan gpt2_cost test_zero1_layout test_kernels test_crc32c
         test_zero1_devices test_mpi_wait hf_convert)
check "make -j2 ${targets[*]}" make -j2 "${targets[@]}"
done_testing
