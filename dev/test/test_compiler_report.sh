#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# The compiler report's check (dev/test/check_compiler_report.py) bites: small planted kernels
# (dev/test/compiler_report_planted.cu) compiled by the real nvcc for sm_90, compile only (a
# few seconds each), checked against dev/test/compiler_report_planted_budgets.txt:
#   clean                  every kernel passes, the blocks come from the budget and the bounds
#   PLANT_SPILL            a large register array under __launch_bounds__(1024): spills
#   PLANT_WIDE             1024 threads, no launch bounds, 80 registers: over the register file
#   PLANT_LOCAL_PACK       LayerNorm's 128-bit pack indexed at run time: local memory
#   PLANT_NO_TENSOR_CORES  the product on the CUDA cores: no HMMA (needs cuobjdump)
#   PLANT_SCALAR_COPY      the packed copy 2 bytes at a time: no 128-bit access (needs cuobjdump)
#   a budget row naming no kernel fails
# Each plant must fail on its kernel alone, for its reason (and maybe more: spills take local memory). SKIPPED without nvcc; the SASS
# cases SKIPPED without cuobjdump (dev/test/cuda_cuobjdump.sh). TAP (dev/test/test_lib.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
require NVCC
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc)
BUDGETS=dev/test/compiler_report_planted_budgets.txt
cuobjdump=$(bash dev/test/cuda_cuobjdump.sh 2>"$TMP/cuobjdump.err") || cuobjdump=""
[ -s "$TMP/cuobjdump.err" ] && note "$(cat "$TMP/cuobjdump.err")"

# report VARIANT [BUDGETS]: compiles the planted file with -DVARIANT into $TMP/VARIANT and runs
# the check on it; its output in $TMP/VARIANT.out, its exit status returned.
report() {
    local v=$1 budgets=${2:-$BUDGETS} d=$TMP/$1
    if [ ! -d "$d" ]; then
        mkdir -p "$d"
        "$NVCC" -O3 -std=c++17 -arch=sm_90 "-D$v" -Xptxas -v --keep --keep-dir "$d" -cubin \
            dev/test/compiler_report_planted.cu -o "$d/planted.sm_90.cubin" >"$d/build.log" 2>&1 ||
            { sed 's/^/    /' "$d/build.log"; return 99; }
    fi
    python3 dev/test/check_compiler_report.py --budgets "$budgets" --cuobjdump "$cuobjdump" "BF16:$d" >"$TMP/$v.out" 2>&1
}
row() { grep -E "^BF16 +$2 " "$TMP/$1.out"; }  # row VARIANT KERNEL: the kernel's table row

report CLEAN
rc=$?
if [ $rc -ne 0 ]; then
    not_ok "clean: exit $rc" "$TMP/CLEAN.out"
elif ! row CLEAN planted_wide_kernel | grep -qE ' 1024 budget ' ||
     ! row CLEAN planted_mma_kernel | grep -qE ' 32 bounds ' ||
     ! row CLEAN planted_spill_kernel | grep -qE ' 1024 bounds '; then
    not_ok "clean: blocks not from the budget and the launch bounds" "$TMP/CLEAN.out"
else
    ok "clean: every planted kernel within its budget"
fi

# plant VARIANT KERNEL REASON: the check fails, on that kernel alone, for REASON (a regex).
plant() {
    local v=$1 kernel=$2 reason=$3
    report "$v"
    local rc=$? others
    others=$(grep '^FAIL: ' "$TMP/$v.out" | grep -vc "^FAIL: BF16 $kernel: ")
    if [ $rc -ne 1 ]; then
        not_ok "$v: exit $rc, want 1" "$TMP/$v.out"
    elif [ "$others" -ne 0 ] || ! grep -qE "^FAIL: BF16 $kernel: $reason" "$TMP/$v.out"; then
        not_ok "$v: want one failure of $kernel ($reason)" "$TMP/$v.out"
    else
        ok "$v: $(grep -E "^FAIL: BF16 $kernel: $reason" "$TMP/$v.out" | cut -c7-)"
    fi
}
plant PLANT_SPILL planted_spill_kernel "spills \([1-9][0-9]* bytes stored"
plant PLANT_WIDE planted_wide_kernel "80 registers x 1024 threads \(the budget's block\) = 81920 registers"
plant PLANT_LOCAL_PACK planted_pack_kernel "[1-9][0-9]* bytes of local memory, budget 0"
if [ -n "$cuobjdump" ]; then
    plant PLANT_NO_TENSOR_CORES planted_mma_kernel "no tensor-core \(HMMA\) instruction"
    plant PLANT_SCALAR_COPY planted_copy_kernel "no 128-bit global load"
else
    skip "PLANT_NO_TENSOR_CORES, PLANT_SCALAR_COPY" "no cuobjdump for the SASS"
fi

# Without the budget's block, the wide kernel is held to 1024 threads all the same.
grep -v '^planted_wide_kernel' "$BUDGETS" >"$TMP/no_wide_row.txt"
report PLANT_WIDE "$TMP/no_wide_row.txt"
if [ $? -eq 1 ] && grep -q "^FAIL: BF16 planted_wide_kernel: 80 registers x 1024 threads (no launch bounds" "$TMP/PLANT_WIDE.out"; then
    ok "PLANT_WIDE without a budget row: held to 1024 threads"
else
    not_ok "PLANT_WIDE without a budget row" "$TMP/PLANT_WIDE.out"
fi

# A budget for a kernel that is not there (renamed, gone) fails.
{ cat "$BUDGETS"; echo "planted_gone_kernel any - 0 -"; } >"$TMP/stale.txt"
report CLEAN "$TMP/stale.txt"
if [ $? -eq 1 ] && grep -q "budget for planted_gone_kernel (any) names no compiled kernel" "$TMP/CLEAN.out"; then
    ok "a stale budget row fails"
else
    not_ok "stale budget row" "$TMP/CLEAN.out"
fi
done_testing
