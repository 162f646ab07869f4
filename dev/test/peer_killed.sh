#!/usr/bin/env bash
# A peer that dies in its teardown (or elsewhere: PEER_KILLED_AT):
#
#   [PEER_KILLED_AT=POINT:1:N] peer_killed.sh LOG TIMEOUT_S WORDS -- MPIRUN... -np 2 PROGRAM ARGS...
#
# runs the job (a test build: dev/test/seams.c; PROGRAM takes --comm-timeout, which is
# appended) with rank 1 stopping itself at an LLMC_TEST_STOP point, kills rank 1 there
# (SIGKILL), and times rank 0, which goes on into a wait that rank 1 never joins. The default,
# teardown:1:1, stops it before its first ncclCommDestroy: since NCCL 2.14 ncclCommDestroy
# returns only once every rank has reached its own (an intra-node collective call), so rank 0
# ends only if that destroy is under the job's deadline. sync_params:1:1 stops it before its
# parameters' all-gathers, step:1:S before step S's collectives: rank 0's host then waits on
# NCCL work that never ends (its kernels spin). mpirun is told not to end the job when a rank dies
# (orte_abort_on_non_zero_status 0: Open MPI 4), so that nothing but rank 0 itself ends it; it
# is killed at the end (it then waits for good). PASS when rank 0 ended within TIMEOUT_S + 5 s
# (the watchdog's grace, run/watchdog.h) of the kill and any "error:" line contains WORDS; else
# FAIL and LOG's tail. Exit 0 on PASS.
set -u
log=$1 timeout_s=$2 words=$3
shift 4  # the --
source "$(dirname "$0")/env.sh"
at=${PEER_KILLED_AT:-teardown:1:1}
LLMC_TEST_STOP=$at timeout -k 5 $((timeout_s + 60)) "$1" --mca orte_abort_on_non_zero_status 0 "${@:2}" \
    --comm-timeout "$timeout_s" >"$log" 2>&1 &
job=$!
rank_pid() {  # the job's ranks: the children of mpirun, the child of timeout ($job)
    local launcher
    launcher=$(pgrep -P "$job" | head -n 1)
    [ -n "$launcher" ] || return 0  # the job has ended
    for p in $(pgrep -P "$launcher"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"
    done | head -n 1
}
victim=
for _ in $(seq 1200); do  # the run's steps first (wait_stopped, but giving up when the job ended)
    kill -0 "$job" 2>/dev/null || break
    grep -q '^test: rank 1 stops itself' "$log" && victim=$(rank_pid 1) &&
        [[ $(ps -o stat= -p "$victim" 2>/dev/null) == T* ]] && break
    victim=
    sleep 0.1
done
rank0=$(rank_pid 0)
if [ -z "$victim" ] || [ -z "$rank0" ]; then
    echo "FAIL rank 1 did not stop at $at (or no rank 0)"
    kill "$job" 2>/dev/null
    tail -n 15 "$log" | sed 's/^/    | /'
    exit 1
fi
kill -KILL "$victim"
start=$SECONDS
while kill -0 "$rank0" 2>/dev/null && [ $((SECONDS - start)) -le $((timeout_s + 5)) ]; do sleep 0.2; done
secs=$((SECONDS - start))
alive=0
kill -0 "$rank0" 2>/dev/null && alive=1
kill -KILL "$rank0" 2>/dev/null
kill "$job" 2>/dev/null  # timeout passes it on to mpirun
wait "$job" 2>/dev/null
errors=$(grep 'error:' "$log")
if [ $alive = 0 ] && { [ -z "$errors" ] || [[ $errors == *"$words"* ]]; }; then
    echo "PASS rank 0 ended $secs s after rank 1 died at $at (timeout $timeout_s s)${errors:+: $errors}"
    exit 0
fi
[ $alive = 1 ] && echo "FAIL rank 0 did not end within $((timeout_s + 5)) s of rank 1's death at $at"
[ $alive = 0 ] && echo "FAIL rank 0 ended, but its error lines do not name '$words'"
tail -n 15 "$log" | sed 's/^/    | /'
exit 1
