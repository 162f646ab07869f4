#!/usr/bin/env bash
# `make test` and `make test-fast`: runs the test scripts under prove, the TAP harness, as
# their header lines say. Every dev/test/test_NAME.sh (but test_lib.sh) is the test NAME and
# has one, near its top:
#
#   # test: timeout=SECONDS lane=alone|cpu|layer tier=full|fast|fast,full
#
#   timeout  past it the script is stopped, and fails
#   lane     alone: the build and data scripts, which run first, one after another; then, where
#            nproc says two cores or more (LLMC_TEST_JOBS=1: one), two lanes at once: layer,
#            the scripts that run CUDA code on the CPU execution layer (docs among them, for
#            docs/cuda_cpu.md's blocks: it evens the two lanes out), one after another,
#            beside cpu, all the others, one after another. In a lane, file-name order.
#   tier     the tiers that run it: full (make test), fast (make test-fast: LLMC_TEST_TIER=fast,
#            under which a script runs its fast rows, dev/test/test_lib.sh)
#
#   dev/test/run_tests.sh [--fast] [NAME...]      (NAMEs: only those tests of the tier)
#
# Two prove runs: the alone lane's, then both other lanes' (prove -j2 with a --rules=seq= for
# the layer lane and one for the rest), because prove's --rules cannot say "these first".
# prove runs each script through this file (--exec), which keeps its timeout and writes its
# output, stdout and stderr, to $LOG_DIR/NAME.log (LOG_DIR: a fresh /tmp/llmc_tests.* unless
# set) while passing it on to prove, and then prints to stderr its SKIPPED lines, or for a
# script that failed its `not ok` lines and the log's tail. prove prints a line per script
# (ok, skipped: WHY for a whole-script skip, or the failure) and its summary; from those
# summaries the last line counts the scripts: `N passed, M failed, K skipped`, after the failed
# ones' names. Exits 1 if any failed. A script or binary that is missing is a failure.
set -u
cd "$(dirname "$0")/../.." || exit 1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
TAIL_LINES=${TAIL_LINES:-25}

# header SCRIPT KEY: KEY's value in SCRIPT's header line (empty without one).
header() { sed -n '1,5s/^# test: //p' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
test_name() { local b=${1##*/}; b=${b%.sh}; echo "${b#test_}"; }

# ---- prove's --exec: one script --------------------------------------------------------------
if [ "${1:-}" = --exec ]; then
    script=$2 name=$(test_name "$2") limit=$(header "$2" timeout)
    log=${LOG_DIR:=$(mktemp -d /tmp/llmc_tests.XXXXXX)}/$name.log  # LOG_DIR: the runner's
    : >"$log"
    timeout --kill-after=10 "${limit:-60}" bash "$script" >"$log" 2>&1 &
    pid=$!
    tail -n +1 -s 0.2 -f --pid=$pid "$log"  # to prove as it comes, all of it once the script ends
    wait $pid
    rc=$?
    if [ $rc = 0 ] && grep -q '^1\.\.[0-9]' "$log" && ! grep -q '^not ok ' "$log"; then
        grep -h 'SKIPPED' "$log" | head -n 5 | sed "s/^ */    $name: /" >&2  # what did not run, loudly
    else
        why="exit $rc"
        { [ $rc = 124 ] || [ $rc = 137 ]; } && why="timed out after $limit s"
        { echo "FAIL $name ($why; log $log)"
          grep -h '^not ok ' "$log" | head -n 10 | sed 's/^/    /'
          tail -n "$TAIL_LINES" "$log" | sed 's/^/    | /'
        } >&2
    fi
    exit $rc
fi

# ---- the tests of this run, by lane ------------------------------------------------------------
tier=full
if [ "${1:-}" = --fast ]; then
    shift
    tier=fast
    export USE_ZERO1=1  # every make of the fast tier: none rewrites the build stamp (warm runs stay warm)
fi
export LLMC_TEST_TIER=$tier
alone=() cpu=() layer=() missing=()
for f in $(printf '%s\n' dev/test/test_*.sh | LC_ALL=C sort); do
    [ "$f" = dev/test/test_lib.sh ] && continue
    if [ -z "$(header "$f" timeout)" ]; then
        echo "run_tests: $f has no header line '# test: timeout=... lane=... tier=...'"
        missing+=("$(test_name "$f")")
        continue
    fi
    [[ ,$(header "$f" tier), == *,$tier,* ]] || continue
    [ $# = 0 ] || [[ " $* " == *" $(test_name "$f") "* ]] || continue
    case $(header "$f" lane) in
    alone) alone+=("$f") ;;
    layer) layer+=("$f") ;;
    *) cpu+=("$f") ;;
    esac
done
for name; do  # a name that is no test of this tier fails: it cannot have run
    [[ " ${alone[*]} ${cpu[*]} ${layer[*]} " == *" dev/test/test_$name.sh "* ]] ||
        { echo "run_tests: no test $name in the $tier tier (dev/test/test_$name.sh)"; missing+=("$name"); }
done

LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/llmc_tests.XXXXXX)}
export LOG_DIR TAIL_LINES
mkdir -p "$LOG_DIR"
echo "test logs: $LOG_DIR"
JOBS=${LLMC_TEST_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)}  # nproc obeys OMP_*

# run_prove LOG ARGS...: prove over ARGS (its options and scripts), its output shown and kept in LOG.
run_prove() {
    local log=$1
    shift
    prove --exec "bash $0 --exec" --timer "$@" 2>&1 | tee "$log"
}
# summary LOG: the scripts prove ran, from its summary: "PASSED FAILED SKIPPED FAILED_NAMES...".
# Each script with a problem has a line "SCRIPT (Wstat: ...)" in the Test Summary Report, a
# whole-script skip the result "skipped: WHY"; Files=N counts them all.
summary() {
    local files failed skipped
    files=$(sed -n 's/^Files=\([0-9]*\), .*/\1/p' "$1")
    failed=$(sed -nE 's/^(\S+) +\(Wstat: [0-9]+.*/\1/p' "$1")
    skipped=$(grep -cE '^(\[[0-9:]+\] )?\S+ \.+ skipped: ' "$1")
    [ -n "$files" ] || { echo "0 1 0 prove"; return; }  # prove itself did not finish
    set -- $failed
    echo "$((files - $# - skipped)) $# $skipped $(for f; do printf '%s ' "$(test_name "$f")"; done)"
}

runs=()
if [ ${#alone[@]} -gt 0 ]; then
    run_prove "$LOG_DIR/.prove_alone" "${alone[@]}"
    runs+=("$LOG_DIR/.prove_alone")
fi
if [ $((${#cpu[@]} + ${#layer[@]})) -gt 0 ]; then
    lanes=()
    if [ "$JOBS" -ge 2 ] && [ ${#cpu[@]} -gt 0 ] && [ ${#layer[@]} -gt 0 ]; then
        echo "two lanes: the CUDA-on-CPU scripts beside the others, after the build and data scripts (LLMC_TEST_JOBS=1: one lane)"
        lanes=(-j2 "--rules=seq={$(IFS=,; echo "${layer[*]}")}" "--rules=seq=**")
    fi
    run_prove "$LOG_DIR/.prove_lanes" "${lanes[@]}" "${cpu[@]}" "${layer[@]}"
    runs+=("$LOG_DIR/.prove_lanes")
fi

passed=0 failed=${#missing[@]} skipped=0 names=("${missing[@]}")
for run in "${runs[@]}"; do
    read -r p f s fnames < <(summary "$run")
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    names+=($fnames)
done
[ "$failed" -gt 0 ] && echo "failed: ${names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
