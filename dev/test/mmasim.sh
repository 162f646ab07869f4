#!/usr/bin/env bash
# dev/test/mmasim.sh VERSION: prints one line, a directory D whose D/site holds MMA-Sim
# (PyPI `mmasim`, Microsoft's bit-accurate simulator of NVIDIA's and AMD's matrix units; Xie
# et al., arXiv:2511.10909) unpacked from its PyPI wheel: the peer of the CPU layer's
# tensor-core model (dev/test/tensorcore_peer.py, which imports it).
# dev/test/mmasim.sh --pinned: prints the version the test runs.
#
# Why unpacked and not pip-installed: the wheel declares torch >= 2.9, while the peer runs on
# Debian's python3 with python3-torch (1.13). Its dot-product model (mmasim/arithmetic/fdpa.py)
# runs there with the shims dev/test/tensorcore_peer.py names.
# D is ${LLMC_CACHE:-$HOME/.cache}/llmc-mmasim/VERSION, reused when complete, so reruns need
# no network. The fetch, the messages and the exit statuses are dev/test/pypi_site.sh's:
# without PyPI one "SKIPPED: ..." line and exit 2 (the test then says SKIPPED, or fails under
# CI: dev/test/test_lib.sh's PYPI); PyPI answering but the download failing: exit 1.
set -euo pipefail

PINNED="2.1.1"
[ "${1:-}" = --pinned ] && { echo "$PINNED"; exit 0; }
VERSION=${1:?usage: dev/test/mmasim.sh VERSION | --pinned}
D=${LLMC_CACHE:-${HOME:-/tmp}/.cache}/llmc-mmasim/$VERSION
WANT="mmasim==$VERSION"

source "$(dirname "${BASH_SOURCE[0]}")/pypi_site.sh"
pypi_site mmasim.sh "$D" "$WANT" mmasim/arithmetic/fdpa.py mmasim/nv_ptx/sim.py
