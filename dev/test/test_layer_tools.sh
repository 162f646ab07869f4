#!/usr/bin/env bash
# The kernels under the CPU execution layer's sanitizer and profiler (make test runs this;
# docs/cuda_cpu.md, "Sanitizer and profiler"). Builds with CUDA_CPU_TOOLS=1, in copies of the
# tree (FP32: test_kernels_cuda; BF16: test_kernels_cuda and test_gpt2cu), two at a time, then
#   1. test_kernels_cuda, FP32 and BF16, with CUDA_CPU_CHECK=race and CUDA_CPU_PROFILE: every
#      check passes and the sanitizer finds nothing (a finding is a fault: the run fails)
#   2. each profile against the kernels' budgets (dev/test/kernel_budgets_{fp32,bf16}.txt,
#      dev/test/check_kernel_budgets.py): no kernel over its bound, none without one
#   3. one training step of the BF16 trainer (test_gpt2cu --dump-params on a random d2 model:
#      forward, backward, AdamW) with CUDA_CPU_CHECK=race: no finding
# Prints "N passed, M failed"; the profiles' tables stay in the logs ($OUT).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
if ! bash dev/cuda_cpu/cuda_headers.sh >/dev/null; then
    echo "SKIPPED: no CUDA headers (no toolkit, and the PyPI wheels could not be had): the GPU code cannot be built"
    exit 0
fi
OUT=${TEST_LAYER_TOOLS_OUT:-$(mktemp -d /tmp/llmc_layer_tools.XXXXXX)}
mkdir -p "$OUT"
passed=0
failed=0
check() {  # check NAME COMMAND...: runs it, logs to $OUT/NAME.log, counts the result
    local name=$1 t0=$SECONDS
    shift
    if "$@" >"$OUT/$name.log" 2>&1; then
        passed=$((passed + 1))
        echo "PASS $name ($((SECONDS - t0)) s): $(grep -E '^(PASS|[0-9]+ passed)' "$OUT/$name.log" | tail -n 1)"
    else
        failed=$((failed + 1))
        echo "FAIL $name ($((SECONDS - t0)) s; log $OUT/$name.log)"
        grep -E '^(FAIL|error)' "$OUT/$name.log" | head -n 10 | sed 's/^/    /'
        tail -n 5 "$OUT/$name.log" | sed 's/^/    | /'
    fi
}

make -s cuda_cpu CUDA_ON_CPU=1 >"$OUT/cuda_cpu_build.log" 2>&1 || { cat "$OUT/cuda_cpu_build.log"; echo "FAIL: cannot build the CPU layer"; exit 1; }
build() {  # build PRECISION TARGETS...: a copy of the tree in $OUT/tree_PRECISION, built with the tools
    local p=$1 dir=$OUT/tree_$1
    shift
    mkdir -p "$dir/build" && bash scripts/copy_sources.sh "$dir" && cp -rp build/cuda_cpu "$dir/build/" &&
        rm -rf "$dir/build/cuda_cpu/src" &&
        (cd "$dir" && make -j2 "$@" CUDA_ON_CPU=1 CUDA_CPU_TOOLS=1 PRECISION="$p")
}
finished() {  # finished PID PRECISION: waits for that build, shows its log
    wait "$1"
    local rc=$?
    cat "$OUT/tree_$2.log"
    return $rc
}
build FP32 test_kernels_cuda >"$OUT/tree_FP32.log" 2>&1 &
fp32=$!
build BF16 test_kernels_cuda test_gpt2cu >"$OUT/tree_BF16.log" 2>&1 &
bf16=$!
check build_FP32 finished $fp32 FP32
check build_BF16 finished $bf16 BF16

for P in FP32 BF16; do
    p=$(echo "$P" | tr A-Z a-z) dir=$OUT/tree_$P
    check "kernels_${p}_race_profile" env CUDA_CPU_CHECK=race CUDA_CPU_PROFILE="$OUT/profile_$p.jsonl" \
        "$dir/test_kernels_cuda"
    check "kernels_${p}_budgets" $PY dev/test/check_kernel_budgets.py "$OUT/profile_$p.jsonl" \
        "dev/test/kernel_budgets_$p.txt"
done
check gpt2cu_bf16_step_race env CUDA_CPU_CHECK=race "$OUT/tree_BF16/test_gpt2cu" --dump-params "$OUT/params.bin" d2 1

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
