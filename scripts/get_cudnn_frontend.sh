#!/usr/bin/env bash
# scripts/get_cudnn_frontend.sh [DIR]: puts the cuDNN C++ frontend headers (header-only, the
# graph API that `make train_gpt2cu USE_CUDNN=1` compiles against, llmc/cudnn_attention.cpp)
# into DIR/include (default build/cudnn_frontend/include, the Makefile's CUDNN_FRONTEND_PATH).
#
# Where from: PyPI's wheel nvidia-cudnn-frontend (CUDNN_FRONTEND_VERSION, default 1.32.0, the
# version the code was compiled against), or CUDNN_FRONTEND_WHEEL=path to a wheel already
# downloaded (a machine without network: copy the wheel, or DIR/include itself, over).
# The wheel also holds the Python bindings; only its include/ is kept. The headers are the
# same in every wheel of a version, so the cp311 manylinux x86_64 one is asked for whatever
# the local python or CPU is.
# Idempotent: a DIR made from the same version is reused at once (DIR/version.stamp).
# The cuDNN library itself is not fetched: the CUDA toolkit may carry it (libcudnn.so in
# $CUDA_HOME/lib64), else the nvidia-cudnn-cu13 wheel does (see docs/building.md, "cuDNN (optional)").
# Exit 0 with the include directory on stdout; 1 with one error line on stderr.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=${CUDNN_FRONTEND_VERSION:-1.32.0}
D=${1:-build/cudnn_frontend}
STAMP=$D/version.stamp
WANT="nvidia-cudnn-frontend==$VERSION${CUDNN_FRONTEND_WHEEL:+ from $CUDNN_FRONTEND_WHEEL}"
fail() { echo "get_cudnn_frontend: error: $*" >&2; exit 1; }

if [ -f "$D/include/cudnn_frontend.h" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    echo "$D/include"
    exit 0
fi
mkdir -p "$D" 2>/dev/null && [ -w "$D" ] || fail "cannot write in $D"
TMP=$(mktemp -d "$D/tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

if [ -n "${CUDNN_FRONTEND_WHEEL:-}" ]; then
    [ -f "$CUDNN_FRONTEND_WHEEL" ] || fail "CUDNN_FRONTEND_WHEEL=$CUDNN_FRONTEND_WHEEL does not exist"
    wheel=$CUDNN_FRONTEND_WHEEL
else
    python3 -m pip --version >/dev/null 2>&1 || fail "python3 -m pip is not available (apt-get install python3-pip)"
    echo "get_cudnn_frontend: pip download nvidia-cudnn-frontend==$VERSION (about 12 MB)" >&2
    if ! python3 -m pip download "nvidia-cudnn-frontend==$VERSION" --no-deps --only-binary=:all: \
        --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$TMP" \
        --quiet --disable-pip-version-check --timeout 30 --retries 1 >"$TMP/pip.log" 2>&1; then
        fail "pip could not download nvidia-cudnn-frontend==$VERSION (no network? last line: $(tail -n 1 "$TMP/pip.log")); on a machine without network copy the wheel over and set CUDNN_FRONTEND_WHEEL=path, or copy $D/include and pass CUDNN_FRONTEND_PATH=... to make"
    fi
    wheel=$(ls "$TMP"/nvidia_cudnn_frontend-*.whl)
fi

# A wheel is a zip; its include/ sits at the top.
python3 - "$wheel" "$TMP/x" <<'EOF' || fail "could not unpack include/ from $wheel"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    if "include/cudnn_frontend.h" not in names:
        sys.exit("no include/cudnn_frontend.h in the wheel")
    z.extractall(sys.argv[2], names)
EOF
rm -rf "$D/include"
mv "$TMP/x/include" "$D/include"
echo "$WANT" >"$STAMP"
echo "get_cudnn_frontend: $(grep -hE 'define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION' "$D/include/cudnn_frontend_version.h" |
    awk '{printf "%s%s", (NR > 1 ? "." : "frontend "), $3}') headers in $D/include" >&2
echo "$D/include"
