# shellcheck shell=bash
# The shell tests' one vocabulary, printing TAP (the Test Anything Protocol, version 13):
# `source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"` at the top of a test, then
#
#   ok DESC                      a check that passed:           ok 3 - DESC
#   not_ok DESC [LOG]            a check that failed, LOG's tail as diagnostics
#   check DESC CMD [ARG...]      ok when CMD exits 0 (its output indented), else not_ok with
#                                its output's tail
#   check_match DESC REGEX FILE  ok when a line of FILE matches REGEX (grep -E)
#   expect_error NAME NP KEYWORD... -- ARGS...   one case of bad input (below)
#   skip DESC REASON             a check that cannot run here:  ok 4 - DESC # SKIP REASON
#   skip_all REASON              the whole script cannot run here (before any check): exits 0
#   fatal DESC [LOG]             not_ok, then stop: the checks after it cannot run
#   note MSG / diag MSG          a `# MSG` line, on stdout / stderr (shown by prove)
#   indented CMD [ARG...]        runs CMD with its output indented, keeping its exit status
#   done_testing                 the plan `1..N` and `# N passed, M failed, K skipped`; exits 1
#                                iff any check was not ok
# and, each explained below: the scratch directory $TMP (at_exit), the prerequisites
# (require, have, missing), the selection of tiers and rows (fast_rows, selected, in_tier),
# and reading a C test's TAP (tap_has, tap_verdict, tap_not_ok).
#
# Only those functions print at column 0; every other line is indented or a `# ` comment,
# so `prove --exec bash dev/test/test_X.sh` and run_tests.sh read the same lines. A SKIP
# also prints the word SKIPPED, which run_tests.sh shows loudly.
# This file sources env.sh (the working directory, threads, $PY, $MPIRUN) so that a test
# needs one line; the benchmarks source env.sh alone and print no TAP.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# Every program a test builds is a test build: it links dev/test/seams.c, whose LLMC_TEST_*
# variables plant faults and stop points (docs/testing.md, "Environment hooks").
export TEST_SEAMS=1

# The counts live in a file, not only in variables, so that a check made in a subshell (a
# pipeline, $(...)) still counts; the file is unlinked at once and reached through this
# shell's descriptor, so nothing is left behind however the script ends.
_test_state=$(mktemp)
exec {TEST_STATE_FD}<>"$_test_state"
rm -f "$_test_state"
TEST_STATE=/proc/$$/fd/$TEST_STATE_FD
echo "0 0 0" >"$TEST_STATE"
TEST_COUNT=0 TEST_FAILED=0 TEST_SKIPPED=0
# _test_count FAILED [SKIPPED]: one more check (FAILED 1 if it failed, SKIPPED 1 if it was
# skipped); sets TEST_COUNT, TEST_FAILED, TEST_SKIPPED.
_test_count() {
    read -r TEST_COUNT TEST_FAILED TEST_SKIPPED <"$TEST_STATE"
    TEST_COUNT=$((TEST_COUNT + 1)) TEST_FAILED=$((TEST_FAILED + $1)) TEST_SKIPPED=$((${TEST_SKIPPED:-0} + ${2:-0}))
    echo "$TEST_COUNT $TEST_FAILED $TEST_SKIPPED" >"$TEST_STATE"
}
echo "TAP version 13"

# ---- the scratch directory -----------------------------------------------------------------
# $TMP: this script's own, made here. At the end it is removed if every check passed (a
# whole-script skip included), and kept and named ("# scratch directory kept: ...") if one
# failed, the script stopped early (a timeout: TERM ends it through its EXIT trap too) or
# KEEP_TMP=1. at_exit CMD: CMD runs at the end first (the last registered first), as a
# script's own clean-up (processes, mounts, namespaces).
TMP=$(mktemp -d "${TMPDIR:-/tmp}/llmc_$(basename "$0" .sh).XXXXXX") || { echo "Bail out! mktemp -d failed"; exit 1; }
_test_tmp=$TMP _test_at_exit=()
at_exit() { _test_at_exit+=("$1"); }
_test_end() {
    local rc=$? i
    for ((i = ${#_test_at_exit[@]} - 1; i >= 0; i--)); do eval "${_test_at_exit[i]}"; done
    read -r TEST_COUNT TEST_FAILED TEST_SKIPPED <"$TEST_STATE"
    if [ $rc = 0 ] && [ "$TEST_FAILED" = 0 ] && [ "${KEEP_TMP:-0}" != 1 ]; then
        rm -rf "$_test_tmp"
    else
        diag "scratch directory kept: $_test_tmp"
    fi
}
trap _test_end EXIT
trap 'exit 143' TERM INT HUP

# A description is one line: a newline in it becomes " | ".
ok() { local d="$*"; _test_count 0; echo "ok $TEST_COUNT - ${d//$'\n'/ | }"; }
not_ok() {
    _test_count 1
    echo "not ok $TEST_COUNT - ${1//$'\n'/ | }"
    [ -n "${2:-}" ] && [ -e "$2" ] && tail -n "${TEST_LOG_LINES:-15}" "$2" | sed 's/^/#   | /' >&2
    return 0
}
skip() {
    _test_count 0 1
    echo "ok $TEST_COUNT - $1 # SKIP $2"
    echo "# SKIPPED: $1: $2"
}
skip_all() {
    echo "1..0 # SKIP $1"
    echo "# SKIPPED: $1"
    exit 0
}
fatal() { not_ok "$@"; done_testing; }
note() { echo "$*" | sed 's/^/# /'; }
diag() { echo "$*" | sed 's/^/# /' >&2; }
# Keeps CMD's exit status through the pipe; lines of CMD never look like TAP.
indented() { "$@" 2>&1 | sed 's/^/    /'; return "${PIPESTATUS[0]}"; }

check() {
    local desc=$1 log rc
    shift
    log=$(mktemp -p "$TMP")
    "$@" >"$log" 2>&1
    rc=$?
    if [ $rc = 0 ]; then
        sed 's/^/    /' "$log"
        ok "$desc"
    else
        TEST_LOG_LINES=40 not_ok "$desc (exit $rc)" "$log"
    fi
    rm -f "$log"
}
check_match() {
    if grep -qE -- "$2" "$3"; then ok "$1"; else not_ok "$1 (no line matches '$2')" "$3"; fi
}

# ---- prerequisites: what the machine must have (git's test_have_prereq) --------------------
#   require PREREQ...           the script cannot run without them: skip_all naming the first
#                               one missing and why
#   have PREREQ                 whether the machine has it
#   missing PREREQ DESC [WHY]   the row DESC cannot run for want of PREREQ: a skip naming it
#                               and WHY (default: the probe's reason)
# The one rule: under CI (CI=true; .ci/run sets it, as most CI services do) a missing PYPI is
# a failure, never a skip: CI runs every peer from the package index.
#   LAYER  the CPU execution layer for CUDA can be built (CUDA headers: cuda_cpu/cuda_headers.sh)
#   GPU    an NVIDIA GPU (nvidia-smi lists one)
#   NVCC   the CUDA compiler ($NVCC, ${CUDA_HOME:-/usr/local/cuda}/bin/nvcc or nvcc on PATH)
#   PYPI   the package index pip uses answers (the peers fetched from it are cached, so the
#          tests ask for it only where a peer could not be had: megatron_core.sh, install_hf_client.sh)
declare -A _test_prereq=()
_probe() {  # _probe PREREQ: its reason for being missing ('' when present) in _test_prereq, once
    [ -n "${_test_prereq[$1]+set}" ] && return
    local why=''
    case $1 in
    LAYER) bash cuda_cpu/cuda_headers.sh >/dev/null ||
               why="no CUDA headers (no toolkit, and the PyPI wheels could not be had): the GPU code cannot be built" ;;
    GPU) nvidia-smi -L 2>/dev/null | grep -q '^GPU' ||
             why="no NVIDIA GPU found (nvidia-smi lists none)" ;;
    NVCC) [ -x "${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}" ] || command -v nvcc >/dev/null ||
              why="no nvcc (the CUDA toolkit)" ;;
    PYPI) timeout 60 python3 -m pip index versions pip >/dev/null 2>&1 ||
              why="the package index pip uses cannot be reached" ;;
    *) why="an unknown prerequisite (test_lib.sh knows LAYER, GPU, NVCC, PYPI)" ;;
    esac
    _test_prereq[$1]=$why
}
have() { _probe "$1"; [ -z "${_test_prereq[$1]}" ]; }
require() {
    local p
    for p; do
        have "$p" && continue
        [ "$p" = PYPI ] && [ "${CI:-}" = true ] && fatal "$p: ${_test_prereq[$p]} (CI=true: CI runs every peer)"
        skip_all "$p: ${_test_prereq[$p]}"
    done
}
missing() {
    local why=${3:-}
    [ -n "$why" ] || { _probe "$1"; why=${_test_prereq[$1]}; }
    if [ "$1" = PYPI ] && [ "${CI:-}" = true ]; then
        not_ok "$2: $1: $why (CI=true: CI runs every peer)"
    else
        skip "$2" "$1: $why"
    fi
}

# pypi_peer DESC SCRIPT VERSION: a peer fetched from PyPI by dev/test/SCRIPT (megatron_core.sh,
# emerging_optimizers.sh: exit 2 when PyPI cannot be reached). Sets PEER_DIR to its directory,
# or '' after `missing PYPI` (a skip; under CI a failure); any other failure is fatal.
pypi_peer() {
    local rc
    PEER_DIR=$(bash "dev/test/$2" "$3")
    rc=$?
    if [ $rc = 2 ]; then
        missing PYPI "$1 $3" "PyPI cannot be reached, so $1 $3 could not be fetched"
        PEER_DIR=''
    elif [ $rc != 0 ]; then
        fatal "$1 $3 could not be had (dev/test/$2 exited $rc)"
    fi
}

# replace_once FILE OLD NEW: OLD replaced by NEW in FILE, where it occurs exactly once (a planted
# change whose text no longer applies fails rather than testing nothing).
replace_once() {
    $PY - "$@" <<'PYEOF'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(1)
open(path, "w").write(text.replace(old, new))
PYEOF
}

# ---- selection: the tiers and the rows -----------------------------------------------------
# LLMC_TEST_TIER: full (the default) or fast (dev/test/run_tests.sh --fast sets it). In the
# fast tier a script runs the rows it names with fast_rows, or every row if it names none.
# LLMC_TEST_ROWS=REGEX: only the rows whose names match (grep -E), to debug one script; a row
# whose set-up is an earlier row needs that one to match too.
#   fast_rows NAME...   the rows this script runs in the fast tier
#   selected NAME...    whether the row NAME runs here (with several names: the set-up that
#                       only those rows need); the rows left out are counted, and
#                       done_testing says how many
#   in_tier TIER        whether this is a run of TIER (what a build step builds for it)
# A check not behind `selected` runs in every tier and under any LLMC_TEST_ROWS.
declare -A _test_fast_rows=() _test_left_out=()
fast_rows() { local n; for n; do _test_fast_rows[$n]=1; done; }
in_tier() { [ "${LLMC_TEST_TIER:-full}" = "$1" ]; }
selected() {
    local n none=1
    for n; do
        if { ! in_tier fast || [ ${#_test_fast_rows[@]} = 0 ] || [ -n "${_test_fast_rows[$n]:-}" ]; } &&
           { [ -z "${LLMC_TEST_ROWS:-}" ] || grep -qE -- "$LLMC_TEST_ROWS" <<<"$n"; }; then
            none=0
        else
            _test_left_out[$n]=1
        fi
    done
    return $none
}

# expect_error NAME NP KEYWORD... -- EXTRA_ARGS...
# expect_error NAME mpmd KEYWORD... -- -np 1 BIN ARGS : -np 1 BIN ARGS   (ranks given different jobs)
# ok when `$BIN "${BASE[@]}" EXTRA_ARGS` (the caller sets BIN and BASE, the arguments of a
# good run; later flags win; under mpirun -np NP when NP > 1) exits != 0 by itself (no
# timeout within 60 s, no signal, no crash text) with exactly one `error:` line that
# contains every KEYWORD, and under mpirun without a message from a non-zero rank (rank 0
# speaks for an error every rank sees). The case is the row NAME/NP (selected, below). Its
# output stays in $TMP/NAME.npNP.log.
expect_error() {
    local name=$1 np=$2
    shift 2
    selected "$name/$np" || return 0
    local keywords=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do keywords+=("$1"); shift; done
    shift  # the --
    local log=$TMP/$name.np$np.log rc
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
        not_ok "$name (np=$np): $(printf "%s; " "${problems[@]}")" "$log"
    fi
}

# hf_client: the real Hugging Face client, transformers pinned in a venv over Debian's
# python3 (scripts/install_hf_client.sh, cached). Sets HF_PY (its python) and HF_CHECK (the
# reference's logits check under it, transformers required) and returns 0; where the package
# index cannot be reached (the script's exit 3) the row "the real Hugging Face client" is
# missing PYPI (a skip; under CI a failure), HF_PY stays empty and HF_CHECK on $PY, and it
# returns 0; any other failure prints why and returns 1.
hf_client() {
    local out rc
    HF_PY='' HF_CHECK=("$PY" dev/test/hf_reference.py check)
    out=$(bash scripts/install_hf_client.sh 2>&1)
    rc=$?
    if [ $rc = 0 ]; then
        HF_PY=$(echo "$out" | tail -n 1)
        HF_CHECK=("$HF_PY" dev/test/hf_reference.py check --require-transformers)
        return 0
    fi
    if [ $rc = 3 ]; then
        missing PYPI "the real Hugging Face client" "$(echo "$out" | sed -n 's/^SKIPPED: //p')"
        return 0
    fi
    echo "$out" | tail -n 8 | sed 's/^/       | /'
    return 1
}

# kill_session SID: kill -9 every process of session SID (a job started with setsid) and wait
# until only single-threaded zombies are left: a job's wait returns on mpirun alone while its ranks
# may still be exiting, and a rank's files (its -o lock) go with its last thread ("Zl": not yet).
kill_session() {
    local pids deadline=$((SECONDS + 60))
    while pids=$(ps -o pid=,stat= -s "$1" 2>/dev/null | awk '$2 !~ /^Z/ || $2 ~ /l/ { print $1 }'); [ -n "$pids" ]; do
        # shellcheck disable=SC2086  # one pid per word
        kill -KILL $pids 2>/dev/null
        [ $SECONDS -lt $deadline ] || { diag "kill_session $1: still running after 60 s: $pids"; return 1; }
        sleep 0.05
    done
}

# A C test's TAP (dev/test/check.h) in its log: under mpirun rank 0 prints it and another
# rank's failed check is a line "# rank R: not ok - what".
# tap_not_ok FILE...: the failed checks' lines, from any rank.
tap_not_ok() { grep -hE '^(not ok|# rank [0-9]+: not ok)' "$@"; }
# tap_has LOG RESULT DESC: LOG holds the line "RESULT N - DESC..." (RESULT ok or "not ok"; DESC
# a fixed prefix of the description).
tap_has() {
    awk -v r="$2 " -v d="$3" 'index($0, r) == 1 && match(substr($0, length(r) + 1), /^[0-9]+ - /) &&
                              index(substr($0, length(r) + 1 + RLENGTH), d) == 1 { f = 1 } END { exit !f }' "$1"
}
# tap_verdict LOG: passed (its plan, and no check failed on any rank), failed (its plan and a
# failed check), skipped (the plan 1..0: it could test nothing here) or unfinished (no plan:
# it stopped before its end).
tap_verdict() {
    if grep -q '^1\.\.0' "$1"; then echo skipped
    elif ! grep -qE '^1\.\.[0-9]+$' "$1"; then echo unfinished
    elif tap_not_ok "$1" >/dev/null; then echo failed
    else echo passed; fi
}

done_testing() {
    read -r TEST_COUNT TEST_FAILED TEST_SKIPPED <"$TEST_STATE"
    [ "$TEST_COUNT" = 0 ] && not_ok "the script ran no check"
    local how="LLMC_TEST_TIER=${LLMC_TEST_TIER:-full}${LLMC_TEST_ROWS:+, LLMC_TEST_ROWS=$LLMC_TEST_ROWS}"
    [ ${#_test_left_out[@]} = 0 ] || note "${#_test_left_out[@]} rows left out ($how; make test runs every row)"
    echo "1..$TEST_COUNT"
    [ "$TEST_FAILED" = 0 ] || diag "$TEST_FAILED of $TEST_COUNT checks failed"
    note "$((TEST_COUNT - TEST_FAILED - TEST_SKIPPED)) passed, $TEST_FAILED failed, $TEST_SKIPPED skipped"
    exit $((TEST_FAILED > 0))
}
