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
# Messages go to stderr. Without PyPI: one "SKIPPED: ..." line and exit 2 (the test then says
# SKIPPED, or fails under CI: dev/test/test_lib.sh's PYPI); PyPI answering but the download
# failing: exit 1.
set -euo pipefail

PINNED="0.19.2 0.13.1"   # the reference (docs/zero1.md), and an older release checked the same way
[ "${1:-}" = --pinned ] && { echo "$PINNED"; exit 0; }
VERSION=${1:?usage: dev/test/megatron_core.sh VERSION | --pinned}
PACKAGING=packaging==24.2   # megatron-core's one pure-Python dependency on its layout path
D=${LLMC_CACHE:-${HOME:-/tmp}/.cache}/llmc-megatron-core/$VERSION
WANT="megatron-core==$VERSION $PACKAGING"

fail() { echo "error: megatron_core.sh: $*" >&2; exit 1; }
skip() {
    echo "SKIPPED: megatron_core.sh: $*" >&2
    exit 2
}
complete() { [ -f "$D/site/megatron/core/distributed/param_and_grad_buffer.py" ] && [ -f "$D/site/packaging/version.py" ] &&
             [ "$(cat "$D/stamp" 2>/dev/null)" = "$WANT" ]; }
complete && { echo "$D"; exit 0; }

PIP=(python3 -m pip)
"${PIP[@]}" --version >/dev/null 2>&1 || skip "python3 -m pip is not available"
{ mkdir -p "$D" && [ -w "$D" ]; } 2>/dev/null || fail "cannot write in $D"
exec 9>"$D/.lock"
if command -v flock >/dev/null; then flock 9; fi   # one download at a time; then look again
complete && { echo "$D"; exit 0; }
TMP=$(mktemp -d "$D/tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "megatron_core.sh: fetching $WANT from PyPI into $D" >&2
# Any interpreter's pip fetches the same files: wheels for CPython 3.12 (or 3.11, the older
# releases) on x86-64 Linux, of which only the Python sources are used.
fetched=0
for py in 3.12 3.11; do
    if "${PIP[@]}" download --no-deps --no-cache-dir --quiet --timeout 30 --retries 1 --only-binary=:all: \
            --python-version $py --implementation cp --abi "cp${py/./}" --platform manylinux_2_28_x86_64 \
            -d "$TMP/whl" "megatron-core==$VERSION" "$PACKAGING" 2>"$TMP/pip.log"; then
        fetched=1
        break
    fi
done
if [ $fetched = 0 ]; then
    tail -n 2 "$TMP/pip.log" | cut -c 1-300 >&2
    if "${PIP[@]}" index versions megatron-core --timeout 30 --retries 1 >/dev/null 2>&1; then
        fail "PyPI answers, but the download of $WANT failed"
    fi
    skip "PyPI cannot be reached (pip download of $WANT failed)"
fi
mkdir -p "$TMP/site"
for w in "$TMP"/whl/*.whl; do python3 -m zipfile -e "$w" "$TMP/site" || fail "cannot unpack $(basename "$w")"; done
echo "$WANT" >"$TMP/stamp"
rm -rf "$D/site"
mv "$TMP/site" "$D/site"
mv "$TMP/stamp" "$D/stamp"
echo "megatron_core.sh: $(du -sm "$D/site" | cut -f1) MB unpacked in ${SECONDS}s" >&2
echo "$D"
