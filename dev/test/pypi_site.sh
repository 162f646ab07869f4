# shellcheck shell=bash
# dev/test/pypi_site.sh: sourced by the scripts that fetch a peer's wheels from PyPI
# (dev/test/megatron_core.sh, dev/test/emerging_optimizers.sh). One function:
#
#   pypi_site NAME DIR "REQ..." FILE...
#
# makes DIR/site hold the wheels REQ (pip requirement strings, pinned: "pkg==1.2") unpacked,
# not installed, and prints DIR. DIR is complete when every FILE (relative to DIR/site) is
# there and DIR/stamp holds REQ; a complete DIR is reused, so reruns need no network. The
# wheels are fetched for CPython 3.12 (or 3.11) on x86-64 Linux, whatever this interpreter is:
# only their Python sources are used, under Debian's python3 (3.11) and torch 1.13, with the
# import shims the script that loads them names. PYPI_SITE_PYTHONS (default "3.12 3.11")
# changes the versions tried: a peer with compiled wheels (numpy) needs the interpreter's own.
# Messages go to stderr, prefixed NAME. Exit status: 0, DIR printed; 2 with one "SKIPPED: ..."
# line when PyPI cannot be reached (the test then says SKIPPED, or fails under CI:
# dev/test/test_lib.sh's PYPI); 1 when PyPI answers but the download or unpacking fails.
# Call it last: it exits.
pypi_site() {
    local name=$1 dir=$2 want=$3
    shift 3
    local files=("$@")
    _pypi_complete() {
        local f
        for f in "${files[@]}"; do [ -f "$dir/site/$f" ] || return 1; done
        [ "$(cat "$dir/stamp" 2>/dev/null)" = "$want" ]
    }
    _pypi_complete && { echo "$dir"; exit 0; }

    local pip=(python3 -m pip)
    if ! "${pip[@]}" --version >/dev/null 2>&1; then
        echo "SKIPPED: $name: python3 -m pip is not available" >&2
        exit 2
    fi
    { mkdir -p "$dir" && [ -w "$dir" ]; } 2>/dev/null || { echo "error: $name: cannot write in $dir" >&2; exit 1; }
    exec 9>"$dir/.lock"
    if command -v flock >/dev/null; then flock 9; fi   # one download at a time; then look again
    _pypi_complete && { echo "$dir"; exit 0; }
    local tmp
    tmp=$(mktemp -d "$dir/tmp.XXXXXX")
    # shellcheck disable=SC2064  # expand $tmp now
    trap "rm -rf '$tmp'" EXIT
    echo "$name: fetching $want from PyPI into $dir" >&2
    local fetched=0 py
    # shellcheck disable=SC2086  # $want: one word per requirement
    for py in ${PYPI_SITE_PYTHONS:-3.12 3.11}; do
        if "${pip[@]}" download --no-deps --no-cache-dir --quiet --timeout 30 --retries 1 --only-binary=:all: \
                --python-version $py --implementation cp --abi "cp${py/./}" --platform manylinux_2_28_x86_64 \
                -d "$tmp/whl" $want 2>"$tmp/pip.log"; then
            fetched=1
            break
        fi
    done
    if [ $fetched = 0 ]; then
        tail -n 2 "$tmp/pip.log" | cut -c 1-300 >&2
        local first=${want%% *}
        # --python-version: a package that declares Python >= 3.12 has no version for this pip otherwise
        if "${pip[@]}" index versions "${first%%=*}" --python-version 3.12 --timeout 30 --retries 1 >/dev/null 2>&1; then
            echo "error: $name: PyPI answers, but the download of $want failed" >&2
            exit 1
        fi
        echo "SKIPPED: $name: PyPI cannot be reached (pip download of $want failed)" >&2
        exit 2
    fi
    mkdir -p "$tmp/site"
    local w
    for w in "$tmp"/whl/*.whl; do
        python3 -m zipfile -e "$w" "$tmp/site" || { echo "error: $name: cannot unpack $(basename "$w")" >&2; exit 1; }
    done
    echo "$want" >"$tmp/stamp"
    rm -rf "$dir/site"
    mv "$tmp/site" "$dir/site"
    mv "$tmp/stamp" "$dir/stamp"
    _pypi_complete || { echo "error: $name: $want unpacked, but ${files[*]} are not all there" >&2; exit 1; }
    echo "$name: $(du -sm "$dir/site" | cut -f1) MB unpacked in ${SECONDS}s" >&2
    echo "$dir"
    exit 0
}
