#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian/Ubuntu machine (run as root, or with
# sudo available). Idempotent and quick: packages already installed are skipped, and
# apt-get update runs only when something is missing.
#
#   build: gcc/make (build-essential, make), Open MPI (openmpi-bin, libopenmpi-dev),
#          OpenBLAS (libopenblas-dev); for prepro_corpus: jansson (libjansson-dev, the JSON
#          parser), zstd (libzstd-dev), zlib (zlib1g-dev)
#   tests: the zstd command (zstd: test_corpus makes its .zst inputs with it)
#   tests: the PyTorch oracle (python3-torch, python3-numpy; Debian's python3, the default
#          of LLMC_PYTHON), pip (python3-pip: scripts/check_openmpi5_build.sh downloads
#          the Open MPI 5 wheel with it)
#   tests: python3-venv (scripts/install_hf_client.sh: transformers in a venv over Debian's python3)
#   tests: perl (prove, the TAP harness that can run the test scripts: docs/testing.md)
#   plots: gnuplot-nox (scripts/plot_loss.sh, the demo's loss.png)
# and then, with pip, the megatron-core wheels that dev/test/test_megatron_layout.sh compares
# zero1/'s layout with (dev/test/megatron_core.sh: unpacked into a cache, not installed), and
# the emerging-optimizers wheel of the Muon peer (dev/test/emerging_optimizers.sh, the same way)
# and MMA-Sim, the tensor-core model's peer (dev/test/mmasim.sh).
set -euo pipefail

# Not fatal here: without PyPI the test steps say SKIPPED (and fail under CI).
fetch_megatron_core() {
    local name script v
    for name in megatron_core emerging_optimizers mmasim; do
        script="$(dirname "${BASH_SOURCE[0]}")/../dev/test/$name.sh"
        for v in $(bash "$script" --pinned); do
            if d=$(bash "$script" "$v"); then echo "install_deps: ${name//_/-} $v in $d"; else
                echo "install_deps: ${name//_/-} $v not fetched (the tests that use it will say why)"; fi
        done
    done
}

PACKAGES=(build-essential make openmpi-bin libopenmpi-dev libopenblas-dev python3-torch python3-numpy python3-pip
          python3-venv gnuplot-nox libjansson-dev libzstd-dev zlib1g-dev zstd perl)

missing=()
for p in "${PACKAGES[@]}"; do
    if dpkg -s "$p" >/dev/null 2>&1 && dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed'; then
        echo "install_deps: $p is installed"
    else
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install_deps: all ${#PACKAGES[@]} packages present, nothing to install"
    fetch_megatron_core
    exit 0
fi

SUDO=()
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "install_deps: error: missing ${missing[*]}, and not root (no sudo) to install them" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "install_deps: missing: ${missing[*]}"
echo "install_deps: apt-get update"
"${SUDO[@]}" apt-get update
echo "install_deps: apt-get install -y --no-install-recommends ${missing[*]}"
"${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fetch_megatron_core
echo "install_deps: done"
