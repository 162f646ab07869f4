#!/usr/bin/env bash
# The real Hugging Face client for the checks that load an export with it (dev/test/test_hf.sh,
# test_recipe.sh, the docs test): transformers in a venv over Debian's python3, whose torch
# (python3-torch 1.13) the venv shares. transformers is pinned: 5.x refuses torch < 2.6, and
# 4.40.2 loads and runs this project's exports. Cached in ~/.cache/llmc-hf (LLMC_HF_VENV), so
# a rerun only checks it.
#
#   bash scripts/install_hf_client.sh           installs when needed; the venv's python last on stdout
#   bash scripts/install_hf_client.sh --print   the install line (docs/huggingface.md shows the same)
#
# Exit status: 0 ready; 3 (after a line "SKIPPED: ...") when the package index cannot be
# reached (a test then says SKIPPED, or fails under CI: dev/test/test_lib.sh's PYPI); 1
# ("error: ...") on any other failure.
set -u
PIN=transformers==4.40.2
SHOWN_VENV='~/.cache/llmc-hf'  # as the docs write it
VENV=${LLMC_HF_VENV:-$HOME/.cache/llmc-hf}
SYSTEM_PY=/usr/bin/python3
if [ "${1:-}" = --print ]; then
    echo "$SYSTEM_PY -m venv --system-site-packages $SHOWN_VENV && $SHOWN_VENV/bin/pip install $PIN"
    exit 0
fi

ready() { "$VENV/bin/python" -c "import torch, transformers; assert transformers.__version__ == '${PIN#*==}'" 2>/dev/null; }
if ready; then
    echo "$VENV/bin/python"
    exit 0
fi
echo "install_hf_client: $PIN into a venv over $SYSTEM_PY at $VENV" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if "$SYSTEM_PY" -m venv --system-site-packages "$VENV" >"$log" 2>&1 &&
    "$VENV/bin/pip" install "$PIN" >>"$log" 2>&1 && ready; then
    echo "$VENV/bin/python"
    exit 0
fi
tail -n 5 "$log" >&2
# Told apart by asking the index pip is configured with (pip.conf or PIP_INDEX_URL) itself.
if [ -x "$VENV/bin/pip" ] && ! timeout 60 "$VENV/bin/pip" index versions transformers >/dev/null 2>&1; then
    echo "SKIPPED: $PIN cannot be installed: the package index cannot be reached"
    exit 3
fi
echo "install_hf_client: error: $PIN could not be installed into $VENV over $SYSTEM_PY (the lines above say why)" >&2
exit 1
