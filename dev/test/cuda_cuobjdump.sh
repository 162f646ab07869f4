#!/usr/bin/env bash
# dev/test/cuda_cuobjdump.sh: prints the path of a cuobjdump (the SASS of the compiler report,
# dev/test/check_compiler_report.py), fetching it when the toolkit has none.
#   - $CUDA_HOME/bin/cuobjdump, else one on PATH: downloads nothing;
#   - else $HOME/.cache/llmc-cuda-cuobjdump/cuobjdump from NVIDIA's PyPI wheels
#     nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (cuobjdump -sass runs the nvdisasm
#     beside it; about 5 MB; the oldest CUDA 13 ones on PyPI, 13.2: they read the cubins of
#     nvcc 13.0), kept for the next run.
# On failure one "SKIPPED: ..." line on stderr and exit 2 (the SASS checks are then skipped).
set -euo pipefail
WHEELS=${LLMC_CUOBJDUMP_WHEELS:-nvidia-cuda-cuobjdump==13.2.78 nvidia-cuda-nvdisasm==13.2.78}
skip() { echo "SKIPPED: cuda_cuobjdump.sh: $*" >&2; exit 2; }

for c in "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" "$(command -v cuobjdump || true)"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; exit 0; }
done
D=${HOME:-/tmp}/.cache/llmc-cuda-cuobjdump
[ -x "$D/cuobjdump" ] && [ "$(cat "$D/wheels" 2>/dev/null)" = "$WHEELS" ] && { echo "$D/cuobjdump"; exit 0; }
command -v unzip >/dev/null || skip "unzip is not installed (apt-get install unzip)"
python3 -m pip --version >/dev/null 2>&1 || skip "python3 -m pip is not available (apt-get install python3-pip)"
{ mkdir -p "$D" && [ -w "$D" ]; } 2>/dev/null || skip "cannot write in $D"
TMP=$(mktemp -d "$D/tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# shellcheck disable=SC2086
python3 -m pip download --no-deps --only-binary=:all: --quiet --disable-pip-version-check --timeout 30 \
    --retries 1 -d "$TMP" $WHEELS >&2 || skip "pip download $WHEELS failed (no network?)"
for w in "$TMP"/*.whl; do unzip -q -o "$w" 'nvidia/*/bin/*' -d "$TMP/x" || skip "no bin/ in $w"; done
for tool in cuobjdump nvdisasm; do
    [ -f "$TMP"/x/nvidia/*/bin/$tool ] || skip "no bin/$tool in the wheels $WHEELS"
    install -m 755 "$TMP"/x/nvidia/*/bin/$tool "$D/$tool"
done
"$D/nvdisasm" --version >/dev/null && "$D/cuobjdump" --version >/dev/null || skip "the wheels' tools do not run here"
echo "$WHEELS" >"$D/wheels"
echo "$D/cuobjdump"
