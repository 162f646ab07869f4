#!/usr/bin/env bash
# dev/test/tensorboard_peer.sh VERSION: prints one line, a directory D whose D/site holds the
# `tensorboard` VERSION package from PyPI and what its event reader imports (protobuf,
# numpy, absl-py), unpacked from their wheels: the real reader of the trainers' event files
# (dev/test/tensorboard_check.py, which imports it; run/tensorboard.h writes them).
# dev/test/tensorboard_peer.sh --pinned: prints the version the tests run.
#
# numpy's wheel is compiled, so the wheels are those of the interpreter that loads them
# (Debian's python3, 3.11: PYPI_SITE_PYTHONS); tensorboard, protobuf and absl-py are pure
# Python. D is ${LLMC_CACHE:-$HOME/.cache}/llmc-tensorboard/VERSION, reused when complete,
# so reruns need no network. The fetch, the messages and the exit statuses are
# dev/test/pypi_site.sh's: without PyPI one "SKIPPED: ..." line and exit 2 (the test then
# says SKIPPED, or fails under CI: dev/test/test_lib.sh's PYPI); PyPI answering but the
# download failing: exit 1.
set -euo pipefail

PINNED="2.18.0"
[ "${1:-}" = --pinned ] && { echo "$PINNED"; exit 0; }
VERSION=${1:?usage: dev/test/tensorboard_peer.sh VERSION | --pinned}
D=${LLMC_CACHE:-${HOME:-/tmp}/.cache}/llmc-tensorboard/$VERSION
WANT="tensorboard==$VERSION protobuf==5.29.3 numpy==2.3.5 absl-py==2.3.1"
PYPI_SITE_PYTHONS=$(${LLMC_PYTHON:-/usr/bin/python3} -c 'import sys; print("%d.%d" % sys.version_info[:2])')

source "$(dirname "${BASH_SOURCE[0]}")/pypi_site.sh"
pypi_site tensorboard_peer.sh "$D" "$WANT" \
    tensorboard/backend/event_processing/event_accumulator.py google/protobuf/__init__.py numpy/__init__.py \
    absl/logging/__init__.py
