#!/usr/bin/env bash
# dev/test/megatron_core.sh VERSION: prints one line, a directory D whose D/site holds
# megatron-core VERSION and its `packaging` dependency, unpacked from their PyPI wheels: the
# layout oracle of dev/test/test_megatron_layout.sh.
# dev/test/megatron_core.sh --pinned: prints the versions that step runs, the reference first.
#
# Why unpacked and not pip-installed: the wheels declare Python >= 3.12 and torch >= 2.6,
# while the oracle runs on Debian's python3 (3.11) with python3-torch (1.13); the layout
# modules import there with the placeholders dev/test/megatron_layout.py names.
# D is ${LLMC_CACHE:-$HOME/.cache}/llmc-megatron-core/VERSION, reused when complete, so
# reruns need no network. scripts/install_deps.sh runs this once as part of the set-up.
# The fetch, the messages and the exit statuses are dev/test/pypi_site.sh's: without PyPI one
# "SKIPPED: ..." line and exit 2 (the test then says SKIPPED, or fails under CI:
# dev/test/test_lib.sh's PYPI); PyPI answering but the download failing: exit 1.
set -euo pipefail

PINNED="0.19.2 0.13.1"   # the reference (docs/zero1.md), and an older release checked the same way
[ "${1:-}" = --pinned ] && { echo "$PINNED"; exit 0; }
VERSION=${1:?usage: dev/test/megatron_core.sh VERSION | --pinned}
PACKAGING=packaging==24.2   # megatron-core's one pure-Python dependency on its layout path
D=${LLMC_CACHE:-${HOME:-/tmp}/.cache}/llmc-megatron-core/$VERSION
WANT="megatron-core==$VERSION $PACKAGING"

source "$(dirname "${BASH_SOURCE[0]}")/pypi_site.sh"
pypi_site megatron_core.sh "$D" "$WANT" megatron/core/distributed/param_and_grad_buffer.py packaging/version.py
