#!/usr/bin/env bash
# dev/test/emerging_optimizers.sh VERSION: prints one line, a directory D whose D/site holds
# NVIDIA's emerging-optimizers VERSION and its one pure-Python dependency absl-py, unpacked
# from their PyPI wheels: the Muon peer (dev/test/muon_reference.py, which imports it).
# dev/test/emerging_optimizers.sh --pinned: prints the versions the tests run (the one the
# issue names: 0.3.0, the release megatron-core 0.19.2's emerging_optimizers.py is built on).
#
# Why unpacked and not pip-installed: the wheel declares Python >= 3.12 (and torch), while the
# peer runs on Debian's python3 (3.11) with python3-torch (1.13). Its Muon imports and runs
# there with three shims, each named and justified in dev/test/muon_reference.py's SHIMS
# (typing.override, torch.optim.optimizer.ParamsT, a stand-in for its Triton kernels, which
# Muon does not call: use_syrk=False). Its other dependency, torch, is Debian's.
# D is ${LLMC_CACHE:-$HOME/.cache}/llmc-emerging-optimizers/VERSION, reused when complete, so
# reruns need no network. The fetch, the messages and the exit statuses are
# dev/test/pypi_site.sh's: without PyPI one "SKIPPED: ..." line and exit 2 (the test then says
# SKIPPED, or fails under CI: dev/test/test_lib.sh's PYPI); PyPI answering but the download
# failing: exit 1.
set -euo pipefail

PINNED="0.3.0"
[ "${1:-}" = --pinned ] && { echo "$PINNED"; exit 0; }
VERSION=${1:?usage: dev/test/emerging_optimizers.sh VERSION | --pinned}
ABSL=absl-py==2.3.1   # emerging-optimizers' declared dependency besides torch: its logging
D=${LLMC_CACHE:-${HOME:-/tmp}/.cache}/llmc-emerging-optimizers/$VERSION
WANT="emerging-optimizers==$VERSION $ABSL"

source "$(dirname "${BASH_SOURCE[0]}")/pypi_site.sh"
pypi_site emerging_optimizers.sh "$D" "$WANT" \
    emerging_optimizers/orthogonalized_optimizers/muon.py emerging_optimizers/orthogonalized_optimizers/muon_utils.py \
    absl/logging/__init__.py
