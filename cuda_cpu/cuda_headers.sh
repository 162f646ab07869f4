#!/usr/bin/env bash
# cuda_cpu/cuda_headers.sh [DIR]: prints one line, a directory D whose D/include holds the
# CUDA headers that the CPU execution layer (make CUDA_ON_CPU=1) compiles against.
#
# Why: the layer links no NVIDIA library, but its sources and the rewritten .cu files take their
# types and prototypes from the toolkit's headers (cuda_runtime.h, cuda_bf16.h, cublasLt.h,
# cublas_v2.h, nccl.h, ...). A machine without the toolkit gets them from NVIDIA's PyPI wheels.
#   - $CUDA_HOME (default /usr/local/cuda) with those headers (nccl.h there or in
#     $NCCL_HOME/include): prints CUDA_HOME, downloads nothing.
#   - else D (DIR, default $HOME/.cache/llmc-cuda-headers): reused when complete and made from
#     the same wheel list; otherwise `pip download --no-deps` of the wheels, their include/
#     directories alone merged into D/include, the wheels deleted, D/wheels.stamp written.
# The wheels are pinned to the versions of CUDA 13.0 (the toolkit's own headers' versions);
# LLMC_CUDA_WHEELS="nvidia-cuda-runtime nvidia-cuda-crt ..." overrides the list (unpinned: newest).
# Messages go to stderr; on failure one "SKIPPED: ..." line and exit 2.
# The layer's Makefile (and a project's CUDA_ON_CPU=1 build) runs it: CUDA_HOME="$(bash cuda_headers.sh)".
set -euo pipefail

WHEELS=${LLMC_CUDA_WHEELS:-nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 \
nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.1.0.3 nvidia-nccl-cu13==2.28.9}
NEEDED="cuda_runtime.h cuda_runtime_api.h crt/host_defines.h driver_types.h vector_types.h \
library_types.h cuda_bf16.h cuda_bf16.hpp nv/target cublasLt.h cublas_v2.h cublas_api.h nccl.h"

skip() { echo "SKIPPED: cuda_headers.sh: $*" >&2; exit 2; }
has_all() { # has_all INCLUDE_DIR: every needed header is there
    local h
    for h in $NEEDED; do [ -e "$1/$h" ] || return 1; done
}

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
I=$CUDA_HOME/include
if [ -e "$I/cuda_runtime.h" ] && [ -e "$I/cublasLt.h" ] \
    && { [ -e "$I/nccl.h" ] || [ -e "${NCCL_HOME:-/nonexistent}/include/nccl.h" ]; }; then
    echo "$CUDA_HOME"
    exit 0
fi

D=${1:-${HOME:-/tmp}/.cache/llmc-cuda-headers}
STAMP=$D/wheels.stamp
read -r -d '' -a WL <<<"$WHEELS" || true
WANT="wheels: ${WL[*]}"
complete() { has_all "$D/include" && [ -f "$STAMP" ] && [ "$(head -n 1 "$STAMP")" = "$WANT" ]; }
complete && { echo "$D"; exit 0; }

command -v unzip >/dev/null || skip "unzip is not installed (apt-get install unzip)"
python3 -m pip --version >/dev/null 2>&1 || skip "python3 -m pip is not available"
{ mkdir -p "$D" && [ -w "$D" ]; } 2>/dev/null || skip "cannot write in $D"
exec 9>"$D/.lock"
if command -v flock >/dev/null; then flock 9; fi   # one download at a time; then look again
complete && { echo "$D"; exit 0; }
TMP=$(mktemp -d "$D/tmp.XXXXXX") || skip "cannot write in $D"
trap 'rm -rf "$TMP"' EXIT
trap 'exit 2' INT TERM HUP
echo "cuda_headers.sh: no CUDA headers in $CUDA_HOME/include; fetching them into $D from PyPI:" \
    "${WL[*]} (about 600 MB of wheels, deleted afterwards)" >&2
python3 -m pip download --no-deps --no-cache-dir --quiet --timeout 60 --retries 1 \
    -d "$TMP/whl" "${WL[@]}" >&2 || skip "pip download failed (no network, or no such wheel): ${WL[*]}"
echo "cuda_headers.sh: downloaded $(du -sm "$TMP/whl" | cut -f1) MB in ${SECONDS}s" >&2
mkdir -p "$TMP/x" "$TMP/include"
echo "$WANT" >"$TMP/stamp"
for w in "$TMP"/whl/*.whl; do
    f=$(basename "$w")
    unzip -q -o "$w" 'nvidia/*/include/*' -d "$TMP/x" || skip "no include/ in $f"
    rm -f "$w"
    echo "$f" | cut -d- -f1,2 | tr - ' ' >>"$TMP/stamp"   # "nvidia_cublas 13.1.0.3"
done
for inc in "$TMP"/x/nvidia/*/include; do cp -R "$inc/." "$TMP/include/"; done
has_all "$TMP/include" || skip "the wheels lack some of: $NEEDED"
rm -rf "$D/include"
mv "$TMP/include" "$D/include"
mv "$TMP/stamp" "$STAMP"
echo "$D"
