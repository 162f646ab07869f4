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
#   done_testing                 the plan `1..N`; exits 1 iff any check was not ok
#
# Only those functions print at column 0; every other line is indented or a `# ` comment,
# so `prove --exec bash dev/test/test_X.sh` and run_tests.sh read the same lines. A SKIP
# also prints the word SKIPPED, which run_tests.sh shows loudly.
# This file sources env.sh (the working directory, threads, $PY, $MPIRUN) so that a test
# needs one line; the benchmarks source env.sh alone and print no TAP.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# The counts live in a file, not only in variables, so that a check made in a subshell (a
# pipeline, $(...)) still counts; the file is unlinked at once and reached through this
# shell's descriptor, so nothing is left behind however the script ends.
_test_state=$(mktemp)
exec {TEST_STATE_FD}<>"$_test_state"
rm -f "$_test_state"
TEST_STATE=/proc/$$/fd/$TEST_STATE_FD
echo "0 0" >"$TEST_STATE"
TEST_COUNT=0 TEST_FAILED=0
# _test_count FAILED: one more check (FAILED 1 if it failed); sets TEST_COUNT, TEST_FAILED.
_test_count() {
    read -r TEST_COUNT TEST_FAILED <"$TEST_STATE"
    TEST_COUNT=$((TEST_COUNT + 1)) TEST_FAILED=$((TEST_FAILED + $1))
    echo "$TEST_COUNT $TEST_FAILED" >"$TEST_STATE"
}
echo "TAP version 13"

# A description is one line: a newline in it becomes " | ".
ok() { local d="$*"; _test_count 0; echo "ok $TEST_COUNT - ${d//$'\n'/ | }"; }
not_ok() {
    _test_count 1
    echo "not ok $TEST_COUNT - ${1//$'\n'/ | }"
    [ -n "${2:-}" ] && [ -e "$2" ] && tail -n "${TEST_LOG_LINES:-15}" "$2" | sed 's/^/#   | /' >&2
    return 0
}
skip() {
    _test_count 0
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
    log=$(mktemp)
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

# expect_error NAME NP KEYWORD... -- EXTRA_ARGS...
# expect_error NAME mpmd KEYWORD... -- -np 1 BIN ARGS : -np 1 BIN ARGS   (ranks given different jobs)
# ok when `$BIN "${BASE[@]}" EXTRA_ARGS` (the caller sets BIN and BASE, the arguments of a
# good run; later flags win; under mpirun -np NP when NP > 1) exits != 0 by itself (no
# timeout within 60 s, no signal, no crash text) with exactly one `error:` line that
# contains every KEYWORD, and under mpirun without a message from a non-zero rank (rank 0
# speaks for an error every rank sees). With FAST=1 and FAST_CASES set ("NAME/NP ..."),
# runs only those cases and counts the others in $left_out. The case's output stays in
# $TMP/NAME.npNP.log (the caller's scratch directory, expect_error.sh's $TMP).
left_out=0
expect_error() {
    local name=$1 np=$2
    shift 2
    if [ "${FAST:-0}" = 1 ] && [ -n "${FAST_CASES:-}" ] && [[ " ${FAST_CASES//$'\n'/ } " != *" $name/$np "* ]]; then
        left_out=$((left_out + 1))
        return 0
    fi
    local keywords=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do keywords+=("$1"); shift; done
    shift  # the --
    local log=${TMP:?expect_error needs a scratch directory \$TMP}/$name.np$np.log rc
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
    read -r TEST_COUNT TEST_FAILED <"$TEST_STATE"
    [ $TEST_COUNT = 0 ] && not_ok "the script ran no check"
    echo "1..$TEST_COUNT"
    [ $TEST_FAILED = 0 ] || diag "$TEST_FAILED of $TEST_COUNT checks failed"
    exit $((TEST_FAILED > 0))
}
