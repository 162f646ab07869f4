#!/usr/bin/env bash
# test: timeout=900 lane=layer tier=full
# The GPU code under the CPU execution layer's checking modes (make test runs this;
# docs/cuda_cpu.md, "Sanitizer and profiler" and "The hardware's freedoms"). Builds with
# CUDA_CPU_TOOLS=1 and CUDA_CPU_NUMERICS=gpu (fused multiply-adds, every math function at its
# documented worst, BF16's fast math and flushed denormals), in copies of the tree (FP32:
# test_kernels_cuda; BF16 with USE_ZERO1=1: test_kernels_cuda, test_gpt2cu, test_zero1_cuda),
# two at a time, then, every run but the last with CUDA_CPU_CHECK=race,memcheck (a finding is
# a fault: the run fails):
#   1. test_kernels_cuda, FP32 and BF16, with CUDA_CPU_PROFILE: every kernel, every check
#      passes under GPU numerics, and neither sanitizer finds anything
#   2. each profile against the kernels' budgets (dev/test/kernel_budgets_{fp32,bf16}.txt,
#      dev/test/check_kernel_budgets.py): no kernel over its bound, none without one
#   3. one training step of the BF16 trainer (test_gpt2cu --dump-params on a random d2 model:
#      forward, backward, AdamW), replicated at np 1 and ZeRO-1 at np 2 over NCCL and over
#      staged MPI on a shared GPU (zero1/'s C runtime and MPI communicator, instrumented too,
#      every MPI call's buffers checked by cuda_cpu/mpi_check.c, its CUDA ops and NCCL
#      communicator); replicated with --optimizer muon, Newton-Schulz in
#      fp32 and with --muon-ns-bf16: no finding
#   4. test_zero1_cuda (every zero1/ CUDA kernel, bitwise against the CPU device, and the NCCL
#      communicator at one rank): no finding
#   5. test_gpt2cu BF16 against the PyTorch oracle (4 AdamW steps): its tolerances hold under
#      GPU numerics (the sanitizers' share of it ran in 3)
# Prints TAP (dev/test/test_lib.sh); the profiles' tables stay in the logs ($OUT).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
require LAYER
OUT=${TEST_LAYER_TOOLS_OUT:-$TMP}
mkdir -p "$OUT"
logged() {  # logged NAME COMMAND...: runs it, its output in $OUT/NAME.log, one check
    local name=$1 t0=$SECONDS
    shift
    if "$@" >"$OUT/$name.log" 2>&1; then
        ok "$name ($((SECONDS - t0)) s): $(grep -E '^(PASS|ok [0-9]+ - )' "$OUT/$name.log" | tail -n 1)"
    else
        not_ok "$name ($((SECONDS - t0)) s; log $OUT/$name.log)" "$OUT/$name.log"
        diag "$(grep -E '^(FAIL|not ok|# rank [0-9]+: not ok|error)' "$OUT/$name.log" | head -n 10)"
    fi
}

make -s cuda_cpu CUDA_ON_CPU=1 >"$OUT/cuda_cpu_build.log" 2>&1 || fatal "build the CPU layer" "$OUT/cuda_cpu_build.log"
build() {  # build PRECISION TARGETS...: a copy of the tree in $OUT/tree_PRECISION, built with the tools
    local p=$1 dir=$OUT/tree_$1
    shift
    mkdir -p "$dir/build" && bash scripts/copy_sources.sh "$dir" && cp -rp build/cuda_cpu "$dir/build/" &&
        rm -rf "$dir/build/cuda_cpu/"{src,tests} &&
        (cd "$dir" && make -j2 "$@" CUDA_ON_CPU=1 CUDA_CPU_TOOLS=1 CUDA_CPU_NUMERICS=gpu PRECISION="$p")
}
finished() {  # finished PID PRECISION: waits for that build, shows its log
    wait "$1"
    local rc=$?
    cat "$OUT/tree_$2.log"
    return $rc
}
build FP32 test_kernels_cuda >"$OUT/tree_FP32.log" 2>&1 &
fp32=$!
build BF16 test_kernels_cuda test_gpt2cu test_zero1_cuda USE_ZERO1=1 >"$OUT/tree_BF16.log" 2>&1 &
bf16=$!
logged build_FP32 finished $fp32 FP32
logged build_BF16 finished $bf16 BF16

CHECKS=(CUDA_CPU_CHECK=race,memcheck)
for P in FP32 BF16; do
    p=$(echo "$P" | tr A-Z a-z) dir=$OUT/tree_$P
    logged "kernels_${p}_checks_profile" env "${CHECKS[@]}" CUDA_CPU_PROFILE="$OUT/profile_$p.jsonl" \
        "$dir/test_kernels_cuda"
    logged "kernels_${p}_budgets" $PY dev/test/check_kernel_budgets.py "$OUT/profile_$p.jsonl" \
        "dev/test/kernel_budgets_$p.txt"
done
T=$OUT/tree_BF16/test_gpt2cu
logged gpt2cu_bf16_step_checks env "${CHECKS[@]}" "$T" --dump-params "$OUT/params.bin" d2 1
for ns in fp32 bf16; do  # Muon's kernels and batched Newton-Schulz GEMMs, each precision's
    flags=(--optimizer muon)
    [ $ns = bf16 ] && flags+=(--muon-ns-bf16)
    logged "gpt2cu_bf16_muon_ns_${ns}_step_checks" env "${CHECKS[@]}" "$T" --dump-params "$OUT/params_muon.bin" d2 1 \
        "${flags[@]}"
done
for comm in nccl mpi; do
    shared=()
    [ $comm = mpi ] && shared=(CUDA_CPU_SHARED_GPU=1)  # ranks sharing a GPU: the staged copies
    logged "gpt2cu_bf16_zero1_np2_${comm}_step_checks" env "${CHECKS[@]}" "${shared[@]}" "${MPIRUN[@]}" -np 2 "$T" \
        --dump-params "$OUT/params_z.bin" d2 1 -z 1 --bucket-size 65536 --comm $comm
done
logged zero1_cuda_checks env "${CHECKS[@]}" "$OUT/tree_BF16/test_zero1_cuda"
logged oracle_bf16 $PY dev/test/gpt2_oracle.py make --out-model "$OUT/model_bf16.bin" --out-state "$OUT/state_bf16.bin" \
    --dtype bf16 --steps 4
logged gpt2cu_bf16_oracle_numerics "$T" "$OUT/model_bf16.bin" "$OUT/state_bf16.bin"

done_testing
