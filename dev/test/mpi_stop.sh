#!/usr/bin/env bash
# One rank stopped inside an MPI call (dev/test/mpi_stop_shim.c, built here into DIR):
#
#   mpi_stop.sh DIR SPEC TIMEOUT_S WORDS -- MPIRUN... -np N PROGRAM ARGS...
#
# runs the job with LLMC_TEST_MPI_STOP=SPEC (NAME[:RANK[:NTH]]) and --comm-timeout TIMEOUT_S,
# and prints PASS when it ended with a non-zero exit, not by a signal or the test's own
# timeout, within TIMEOUT_S + 8 s of the stop (the deadline, the abort's stagger of 0.25 s per
# rank and the launcher's clean-up), with one "did not complete within" line that contains
# WORDS (the call it waited in); else FAIL and the log's tail. Exit 0 on PASS.
set -u
dir=$1 spec=$2 timeout_s=$3 words=$4
shift 5  # the --
shim=$dir/mpi_stop_shim.so
[ -f "$shim" ] || mpicc -shared -fPIC -O1 -o "$shim" "$(dirname "$0")/mpi_stop_shim.c" -ldl || { echo "FAIL shim build"; exit 1; }
log=$dir/mpi_stop.${spec//[:\/]/_}.log
start=$SECONDS
LD_PRELOAD=$shim LLMC_TEST_MPI_STOP=$spec timeout -k 5 $((timeout_s + 60)) "$@" --comm-timeout "$timeout_s" >"$log" 2>&1
rc=$?
secs=$((SECONDS - start))
stopped=$(grep -c '^mpi_stop_shim: .* stopped in' "$log")
lines=$(grep -c 'did not complete within' "$log")
line=$(grep -m1 'did not complete within' "$log")
if [ "$stopped" = 1 ] && [ $rc -ne 0 ] && [ $rc -lt 124 ] && [ $secs -le $((timeout_s + 8)) ] && [ "$lines" = 1 ] &&
    [[ $line == *"$words"* ]]; then
    echo "PASS $spec: exit $rc after $secs s: $line"
    exit 0
fi
echo "FAIL $spec: exit $rc after $secs s, the shim stopped $stopped rank(s), $lines deadline line(s) (want one naming '$words')"
tail -n 15 "$log" | sed 's/^/    | /'
exit 1
