# shellcheck shell=bash
# Sourced by the bad-input tests (test_errors.sh, test_files.sh), after env.sh: a scratch
# directory $TMP (removed on exit), fixtures, and the runner that checks one case of bad
# input to $BIN. The caller sets BIN and BASE (the arguments of a good run; each case
# appends what it breaks, later flags win).
#
#   check NAME NP KEYWORD... -- EXTRA_ARGS...
#   check NAME mpmd KEYWORD... -- -np 1 BIN ARGS : -np 1 BIN ARGS   (ranks given different jobs)
#
# passes when `$BIN "${BASE[@]}" EXTRA_ARGS` (under mpirun -np NP when NP > 1) exits != 0
# by itself (no timeout within 60 s, no signal, no crash text) with exactly one `error:`
# line that contains every KEYWORD, and under mpirun without a message from a non-zero
# rank (rank 0 speaks for an error every rank sees). Counts failures in $failed. With
# FAST=1 and FAST_CASES set ("NAME/NP ..."), runs only those cases and counts the others
# in $left_out.
TMP=$(mktemp -d "/tmp/$(basename "$0" .sh).XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# The old names, for the scripts not yet on test_lib.sh (its expect_error is this check).
if ! declare -F done_testing >/dev/null; then
failed=${failed:-0} left_out=0
ok() { echo "  ok   $*"; }
bad() { echo "  FAIL $*"; failed=$((failed + 1)); }

check() {
    local name=$1 np=$2
    shift 2
    if [ "${FAST:-0}" = 1 ] && [ -n "${FAST_CASES:-}" ] && [[ " ${FAST_CASES//$'\n'/ } " != *" $name/$np "* ]]; then
        left_out=$((left_out + 1))
        return 0
    fi
    local keywords=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do keywords+=("$1"); shift; done
    shift  # the --
    local log="$TMP/$name.np$np.log" rc
    if [ "$np" = 1 ]; then
        timeout --kill-after=5 60 $BIN "${BASE[@]}" "$@" >"$log" 2>&1
    elif [ "$np" = mpmd ]; then  # "$@" is mpirun's whole MPMD command line: -np 1 A : -np 1 B
        timeout --kill-after=5 60 "${MPIRUN[@]}" "$@" >"$log" 2>&1
    else
        timeout --kill-after=5 60 "${MPIRUN[@]}" -np "$np" $BIN "${BASE[@]}" "$@" >"$log" 2>&1
    fi
    rc=$?
    local problems=()
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then problems+=("HANG: killed after 60 s");
    elif [ $rc -eq 0 ]; then problems+=("exit code 0");
    elif [ $rc -ge 128 ]; then problems+=("killed by a signal (exit $rc)"); fi
    grep -qE 'Segmentation fault|core dumped|exited on signal|Aborted \(core' "$log" && problems+=("crash text in the output")
    local n
    n=$(grep -c 'error:' "$log")
    [ "$n" = 1 ] || problems+=("$n 'error:' lines, expected exactly 1")
    local keyword
    for keyword in "${keywords[@]}"; do
        grep 'error:' "$log" | grep -qF -- "$keyword" || problems+=("the error line does not mention '$keyword'")
    done
    if [ "$np" != 1 ] && grep -q '^\[rank [1-9]' "$log"; then problems+=("a non-zero rank also reported it"); fi
    if [ ${#problems[@]} -eq 0 ]; then
        ok "$name (np=$np, exit $rc): $(grep 'error:' "$log" | head -1 | cut -c1-140)"
    else
        bad "$name (np=$np): $(printf "%s; " "${problems[@]}")"
        sed 's/^/       | /' "$log" | tail -n 15
    fi
}
fi

# ---- fixtures -------------------------------------------------------------------------
# small_model PATH: an oracle model with V=1000 (Vp=1024), L=2, C=64, NH=4, maxT=64, fp32 (v3).
V=1000
small_model() {
    timeout 120 $PY dev/test/gpt2_oracle.py make --out-model "$1" --out-state "$TMP/unused_state.bin" \
        --vocab $V --steps 0 --batch 1 --seq 8 >"$TMP/oracle.log" 2>&1 && rm -f "$TMP/unused_state.bin" && return 0
    cat "$TMP/oracle.log"
    echo "FAIL: the oracle could not write a model"
    return 1
}

# Token shards: header int32[256] = 20240520, 1, n; then n uint16 tokens (ids < V).
# write_shard PATH N [MAGIC] [BAD_INDEX BAD_ID]
write_shard() {
    $PY - "$@" <<'PYEOF'
import struct, sys
path, n = sys.argv[1], int(sys.argv[2])
magic = int(sys.argv[3]) if len(sys.argv) > 3 else 20240520
toks = [(i * 7919) % 1000 for i in range(n)]          # ids < V = 1000
if len(sys.argv) > 5:
    toks[int(sys.argv[4])] = int(sys.argv[5])
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = magic, 1, n
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%dH" % n, *toks))
PYEOF
}

# set_int32 FILE INDEX VALUE: writes VALUE (little-endian int32, may be negative) as the
# INDEX-th int32 of FILE, i.e. a header field.
set_int32() {
    $PY -c 'import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(4 * int(sys.argv[2])); f.write(struct.pack("<i", int(sys.argv[3])))' "$@"
}
