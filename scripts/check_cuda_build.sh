#!/usr/bin/env bash
# Compiles every CUDA target (CI calls this; no GPU needed), each source in every
# precision that changes what it compiles:
#   train_gpt2cu            FP32, BF16, and the plugin build (USE_ZERO1=1) in both: every
#                           llmc/*.cuh and zero1/*.cu in both precisions;
#   test_gpt2cu USE_ZERO1=1 FP32, BF16 (the test's own code; the plain trainer's paths are
#                           train_gpt2cu's);
#   test_zero1_cuda, test_watchdog_cuda, test_kernels_cuda, gpu_compute_mode   BF16 (their
#                           own code; what they include is compiled above in both precisions).
#   train_gpt2cu USE_CUDNN=1 BF16 (llmc/cudnn_attention.cpp and the cuDNN dispatch), when
#                           the frontend headers and libcudnn are there (`make cudnn_check
#                           USE_CUDNN=1`); else one SKIPPED line, and the last line says so.
#                           About 1.5 to 3 minutes more on 2 cores (the frontend's headers).
# The builds run in two scratch copies of the tree, one per precision, never in this one. In
# each, each binary is removed first and the Makefile's stamp (PRECISION, USE_ZERO1) rebuilds
# whatever depends on the switch, so no stale binary or object of the other precision can
# hide a compile error, and no object is compiled twice for the same settings. Each binary
# is moved to a scratch directory. Then, on what those builds left (no build of its own):
#   - the real compiler's report on every kernel, both precisions (nvcc -Xptxas -v, the PTX
#     and the SASS of cubins kept with --keep), against dev/test/compiler_budgets.txt
#     (dev/test/check_compiler_report.py; docs/gpu.md, "The compiler's report");
#     COMPILER_REPORT_JSON=FILE keeps its table as JSON Lines (gpt2_cost --occupancy);
#   - each binary's RUNPATH holds its libcublasLt, libcublas and libnccl (readelf).
# Exits non-zero if any build or check failed.
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
    rm -f "$target"
    if [ -z "${REPORT:-}" ]; then
        make "$target" PRECISION="$precision" "$@" && mv "$target" "$OUT/${target}_${precision}"
        return
    fi
    # For the compiler report: ptxas' resources per kernel in build.log (left out of the
    # printed log), the PTX (launch bounds) and the cubins (SASS) kept; nothing else changes.
    local keep rc=0
    keep=$REPORT/$precision/$target$(echo "${*:+_$*}" | tr -c 'A-Za-z0-9_\n' _)
    mkdir -p "$keep"
    NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} -Xptxas -v --keep --keep-dir $keep" \
        make "$target" PRECISION="$precision" "$@" >"$keep/build.log" 2>&1 || rc=$?
    grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' "$keep/build.log" || true
    find "$keep" -type f ! -name '*.ptx' ! -name '*.cubin' ! -name build.log -delete
    [ $rc -eq 0 ] && mv "$target" "$OUT/${target}_${precision}"
}
# precision_builds PRECISION: every target of that precision, in this directory; stops at
# the first failure (explicitly: set -e does not apply inside a function called with ||).
precision_builds() {
    build train_gpt2cu "$1" || return 1
    # The plugin build (`make train_gpt2cu USE_ZERO1=1`, docs/design.md "Architecture").
    build train_gpt2cu "$1" USE_ZERO1=1 || return 1
    build test_gpt2cu "$1" USE_ZERO1=1 || return 1
    # The BF16-only targets, split between the two sequences so that they end together.
    [ "$1" = FP32 ] && { build test_kernels_cuda BF16; return; }
    build test_zero1_cuda BF16 && build test_watchdog_cuda BF16 && build gpu_compute_mode BF16
}
# The two precisions build at once (nvcc is mostly one core; this halves CI's wait on two
# cores), each in its own copy of the working tree (what git tracks or would track), so the
# two never share an object or a stamp, and this tree's binaries are left alone (scripts/test.sh
# runs this beside make test). Each log is printed whole, FP32's first.
ROOT=$PWD
export CUDNN_FRONTEND_PATH=${CUDNN_FRONTEND_PATH:-$ROOT/build/cudnn_frontend/include}  # build/ is not copied
mkdir -p "$OUT/fp32_tree" "$OUT/bf16_tree" "$OUT/bin"
bash scripts/copy_sources.sh "$OUT/fp32_tree"
bash scripts/copy_sources.sh "$OUT/bf16_tree"
(cd "$OUT/fp32_tree" && REPORT=$OUT/report OUT=$OUT/bin precision_builds FP32) >"$OUT/fp32.log" 2>&1 &
fp32=$!
cd "$OUT/bf16_tree"
bf16_status=0
REPORT=$OUT/report OUT=$OUT/bin precision_builds BF16 >"$OUT/bf16.log" 2>&1 || bf16_status=$?
fp32_status=0
wait $fp32 || fp32_status=$?
cat "$OUT/fp32.log" "$OUT/bf16.log"
if [ $fp32_status -ne 0 ] || [ $bf16_status -ne 0 ]; then
    echo "check_cuda_build: FAILED (FP32 builds exit $fp32_status, BF16 builds exit $bf16_status)" >&2
    exit 1
fi
cd "$ROOT"
# The real compiler's report on every kernel of those builds, against the repository's budgets.
echo "== the compiler's report (dev/test/check_compiler_report.py, budgets dev/test/compiler_budgets.txt)"
cuobjdump=$(bash dev/test/cuda_cuobjdump.sh) || cuobjdump=""
report_dirs=()
for d in "$OUT"/report/FP32/* "$OUT"/report/BF16/*; do report_dirs+=("$(basename "$(dirname "$d")"):$d"); done
python3 dev/test/check_compiler_report.py --budgets dev/test/compiler_budgets.txt --cuobjdump "$cuobjdump" \
    --json "${COMPILER_REPORT_JSON:-$OUT/compiler_report.jsonl}" "${report_dirs[@]}" ||
    { echo "check_cuda_build: FAILED: the compiler's report is over its budgets (above)" >&2; exit 1; }
# Each binary finds libcublasLt, libcublas and libnccl through its own run path (a RUNPATH,
# which LD_LIBRARY_PATH overrides; not an RPATH, which it would not).
for bin in "$OUT"/bin/*; do
    runpath=$(readelf -d "$bin" | sed -n 's/.*(RUNPATH) *Library runpath: \[\(.*\)\]/\1/p')
    readelf -d "$bin" | grep -q '(RPATH)' && { echo "check_cuda_build: $bin has an RPATH (want RUNPATH)" >&2; exit 1; }
    for lib in libcublasLt libcublas libnccl; do
        soname=$(readelf -d "$bin" | sed -n "s/.*(NEEDED) *Shared library: \[\($lib\.so[.0-9]*\)\]/\1/p")
        if [ -z "$soname" ]; then  # linked as needed: only the trainer must need all three
            [[ $(basename "$bin") != train_gpt2cu_* ]] && continue
            echo "check_cuda_build: $(basename "$bin") does not need $lib (NEEDED: $(readelf -d "$bin" | grep -c NEEDED) libraries)" >&2
            exit 1
        fi
        found=""
        IFS=: read -r -a dirs <<<"$runpath"
        for d in "${dirs[@]}"; do [ -e "$d/$soname" ] && found=$d/$soname; done
        [ -n "$found" ] || { echo "check_cuda_build: $(basename "$bin") needs $soname but its run path ($runpath) does not hold it" >&2; exit 1; }
    done
done
echo "check_cuda_build: every binary finds libcublasLt, libcublas, libnccl through its RUNPATH ($runpath)"
# Last, so the switch of USE_CUDNN rebuilds nothing the loop above still needs.
cd "$OUT/bf16_tree"
if reason=$(make -s cudnn_check USE_CUDNN=1 2>&1); then
    start=$SECONDS
    OUT=$OUT/bin build train_gpt2cu BF16 USE_CUDNN=1 || exit 1
    # Linked to a libcudnn the loader finds through the run path alone.
    if env -u LD_LIBRARY_PATH ldd "$OUT/bin/train_gpt2cu_BF16" | grep -q 'libcudnn.*not found'; then
        echo "check_cuda_build: train_gpt2cu USE_CUDNN=1 does not find libcudnn:" >&2
        ldd "$OUT/bin/train_gpt2cu_BF16" | grep libcudnn >&2
        exit 1
    fi
    echo "check_cuda_build: train_gpt2cu USE_CUDNN=1 built in $((SECONDS - start)) s ($reason)"
    echo "check_cuda_build: every CUDA target compiles (each source in both precisions, and USE_CUDNN=1)"
else
    reason=${reason#*\*\*\* }  # make's "Makefile:N: *** MESSAGE.  Stop."
    reason=${reason%.  Stop.}
    if [[ $reason == *cudnn_frontend.h* ]]; then
        echo "SKIPPED: USE_CUDNN=1 build (no cuDNN frontend headers: scripts/get_cudnn_frontend.sh)"
    else
        echo "SKIPPED: USE_CUDNN=1 build ($reason)"
    fi
    echo "check_cuda_build: every CUDA target compiles (each source in both precisions); USE_CUDNN=1 NOT checked"
fi
