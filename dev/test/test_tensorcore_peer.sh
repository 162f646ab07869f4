#!/usr/bin/env bash
# test: timeout=300 lane=layer tier=full
# The CPU layer's tensor-core model (GPU numerics: cuda_cpu/tensorcore.cpp, docs/cuda_cpu.md)
# against its peer, MMA-Sim (PyPI `mmasim` 2.1.1, Microsoft's bit-accurate simulator of
# NVIDIA's matrix units; dev/test/mmasim.sh fetches it once, cached), through
# dev/test/tensorcore_peer.py: bf16 dot products with an fp32 accumulator (k 16 to 64, one
# group and chains; normal, wide-exponent, cancelling, one-signed, tiny values, large and zero
# accumulators) must be equal bit for bit
#   - under the layer's defaults against MMA-Sim's Hopper mma.sync (the H100's);
#   - under CUDA_CPU_TC_GROUP=8 CUDA_CPU_TC_EXTRA_BITS=1 against its Ampere (the A100's);
#   - planted: the former exact model (CUDA_CPU_TC_GROUP=0) must differ from Hopper's.
# Without PyPI the rows say SKIPPED, except under CI (CI=true), where they fail (test_lib.sh's PYPI).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
require LAYER

pypi_peer mmasim mmasim.sh "$(bash dev/test/mmasim.sh --pinned)"
[ -n "$PEER_DIR" ] || { [ $TEST_COUNT = 0 ] && skip_all "MMA-Sim could not be fetched"; done_testing; }
make -s build/cuda_cpu/tests/test_tensorcore CUDA_ON_CPU=1 >"$TMP/build.log" 2>&1 || fatal "build test_tensorcore" "$TMP/build.log"
peer=($PY dev/test/tensorcore_peer.py --site "$PEER_DIR/site" --bin build/cuda_cpu/tests/test_tensorcore)
for arch in Hopper Ampere; do
    check "the layer's tensor-core model == MMA-Sim $(bash dev/test/mmasim.sh --pinned) $arch, bit for bit (56,000 dot products)" \
        "${peer[@]}" --arch $arch
done
# Planted: the check must fail by finding differences, not by an error.
"${peer[@]}" --arch Hopper --n 200 --layer-env CUDA_CPU_TC_GROUP=0 >"$TMP/planted.log" 2>&1
rc=$? differing=$(grep -cE ' [1-9][0-9]* of 200 differ in a bit' "$TMP/planted.log")
if [ $rc = 1 ] && [ "$differing" -gt 0 ]; then
    ok "planted: the former exact model (CUDA_CPU_TC_GROUP=0) differs from MMA-Sim's Hopper in $differing of 28 kinds ($(grep -m1 'normal k=16' "$TMP/planted.log" | sed 's/^ *//'))"
else
    not_ok "planted: the former exact model (CUDA_CPU_TC_GROUP=0) differs from MMA-Sim's Hopper (exit $rc, $differing kinds differ)" "$TMP/planted.log"
fi
done_testing
