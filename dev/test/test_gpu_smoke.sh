#!/usr/bin/env bash
# test: timeout=900 lane=layer tier=fast
# The fast tier's look at the GPU trainer (make test-fast; the GPU suite, run_gpu_tests.sh,
# is the full check): test_gpt2cu (FP32, the zero1/ plugin built in) on the CPU execution
# layer for CUDA, against the PyTorch oracle for 2 AdamW steps, with ZeRO-1 over the layer's
# NCCL: the logits, loss and every gradient on one rank, then the step losses and norms.
# The build is incremental, in a copy of the sources outside the work tree (the layer's
# nvcc finds the sources to rewrite with git, which ignores build/) that keeps their times,
# so that make rebuilds only what changed, and shares no stamp with this tree:
# $LLMC_FAST_GPU_DIR, default /tmp/llmc_fast_gpu.UID.CKSUM (one per work tree).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
require LAYER
tree=${LLMC_FAST_GPU_DIR:-/tmp/llmc_fast_gpu.$(id -u).$(pwd | cksum | cut -d' ' -f1)}
t0=$SECONDS
make -s cuda_cpu CUDA_ON_CPU=1 >"$TMP/build.log" 2>&1 || fatal "the layer's build" "$TMP/build.log"
mkdir -p "$tree/build"
bash scripts/copy_sources.sh "$tree"
cp -rp build/cuda_cpu "$tree/build/"
(cd "$tree" && make -j2 test_gpt2cu PRECISION=FP32 USE_ZERO1=1 CUDA_ON_CPU=1) >"$TMP/build.log" 2>&1 ||
    fatal "the FP32 test_gpt2cu build" "$TMP/build.log"
ok "built test_gpt2cu in $tree in $((SECONDS - t0)) s"
$PY dev/test/gpt2_oracle.py make --out-model "$TMP/m.bin" --out-state "$TMP/s.bin" --steps 2 >/dev/null ||
    fatal "oracle"
timeout 600 "$tree/test_gpt2cu" "$TMP/m.bin" "$TMP/s.bin" -z 1 --bucket-size 65536 --comm nccl >"$TMP/log" 2>&1
rc=$?
sed 's/^/    /' "$TMP/log"
if [ $rc = 0 ] && [ "$(tap_verdict "$TMP/log")" = passed ] && tap_has "$TMP/log" ok gradients; then
    ok "test_gpt2cu (FP32, ZeRO-1 over the layer's NCCL) against the PyTorch oracle: every check, the gradients'"
else
    not_ok "test_gpt2cu against the PyTorch oracle (exit $rc)"
fi
done_testing
