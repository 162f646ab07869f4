#!/usr/bin/env bash
# cuda_cpu/tests/test_nccl.sh: runs every mode of test_nccl (the layer's NCCL) and checks
# the exit codes and, for the expected failures, the messages on stderr.
#
#   cuda_cpu/tests/test_nccl.sh [path/to/test_nccl]     (default: build/cuda_cpu/tests/test_nccl)
#
# Prints TAP (tap.sh), a check per run; exits 1 when any failed. Each run is
# under a 60 s timeout: a hang fails, it does not block CI. About 35 s on 2 cores.
set -uo pipefail
BIN=${1:-$(dirname "${BASH_SOURCE[0]}")/../../build/cuda_cpu/tests/test_nccl}
[ -x "$BIN" ] || { echo "test_nccl.sh: $BIN is not an executable (build test_nccl first)" >&2; exit 2; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")  # tap.sh changes to the layer's folder
source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# The lines of its output files that say a check failed (TAP's not ok, another rank's too).
tap_not_ok() { grep -hE '^(not ok|# rank [0-9]+: not ok)' "$@"; }

# expect NAME RC [+TEXT|-TEXT]... -- COMMAND...: COMMAND exits with RC; its stderr holds each
# +TEXT and no -TEXT; no check failed on any rank (TAP: a not ok line).
expect() {
    local name=$1 want=$2 musts=() nots=()
    shift 2
    while [ "$1" != "--" ]; do
        case "$1" in +*) musts+=("${1#+}") ;; -*) nots+=("${1#-}") ;; esac
        shift
    done
    shift
    local rc=0 why=""
    timeout 60 "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = 124 ] && why="timed out (a hang)"
    [ -z "$why" ] && [ "$rc" != "$want" ] && why="exit code $rc, expected $want"
    [ -z "$why" ] && tap_not_ok "$TMP/out" "$TMP/err" >/dev/null && why="a check failed: $(tap_not_ok "$TMP/out" "$TMP/err" | head -n 1)"
    for t in ${musts[@]+"${musts[@]}"}; do
        [ -z "$why" ] && ! grep -qF -- "$t" "$TMP/err" && why="stderr lacks: $t"
    done
    for t in ${nots[@]+"${nots[@]}"}; do
        [ -z "$why" ] && grep -qF -- "$t" "$TMP/err" && why="stderr has: $t"
    done
    if [ -z "$why" ]; then
        ok "$name ($(grep -c '^ok ' "$TMP/out") checks)"
    else
        not_ok "$name: $why"
        diag "$(cat "$TMP/out" "$TMP/err" | grep -v '^ok ' | tail -20)"
    fi
}

INVERSION="ranks issued collectives on two communicators in different orders (NCCL can deadlock): rank "
# basic's expected sums are worked out in rank order (at 2 ranks every order gives them).
for n in 2 3 4; do
    expect "basic, $n ranks" 0 -"$INVERSION" -- env CUDA_CPU_NCCL_ORDER=rank "${MPIRUN[@]}" -x CUDA_CPU_NCCL_ORDER \
        -np $n "$BIN" basic
done
# The sum orders (CUDA_CPU_NCCL_ORDER), against results worked out by hand from NCCL's
# ring and tree (test_nccl.cpp, test_orders); the default is ring.
for order in ring tree random; do
    for n in 3 4; do
        expect "orders: $order, $n ranks" 0 -- env CUDA_CPU_NCCL_ORDER=$order "${MPIRUN[@]}" -x CUDA_CPU_NCCL_ORDER \
            -np $n "$BIN" orders $order
    done
done
expect "orders: the default is ring" 0 -- "${MPIRUN[@]}" -np 3 "$BIN" orders ring
for mode in eager lazy; do
    expect "basic, 2 ranks, CUDA_CPU_EXEC=$mode" 0 -- env CUDA_CPU_EXEC=$mode "${MPIRUN[@]}" -x CUDA_CPU_EXEC -np 2 "$BIN" basic
done
source tests/pkeys.sh
if pkeys_available; then
    expect "basic, 3 ranks, CUDA_CPU_PROTECT=1" 0 -- env CUDA_CPU_PROTECT=1 "${MPIRUN[@]}" -x CUDA_CPU_PROTECT -np 3 "$BIN" basic
else
    skip "basic, 3 ranks, CUDA_CPU_PROTECT=1" "$PKEYS_SKIPPED"
fi
expect "mismatch: a fault naming both sides, exit 2" 2 \
    +"error: cuda_cpu: collective #1 on communicator " \
    +"rank 0 issued ncclReduceScatter of 4096 float sum, rank 1 issued ncclAllGather of 2048 bfloat16" \
    -- "${MPIRUN[@]}" -np 2 "$BIN" mismatch
expect "inversion: two communicators in different orders, exit 2" 2 +"error: cuda_cpu: $INVERSION" \
    -- "${MPIRUN[@]}" -np 2 "$BIN" inversion
expect "inversion, CUDA_CPU_EXEC=eager" 2 +"error: cuda_cpu: $INVERSION" \
    -- env CUDA_CPU_EXEC=eager "${MPIRUN[@]}" -x CUDA_CPU_EXEC -np 2 "$BIN" inversion
# (abort needs a host thread that is not inside the collective: not under eager execution)
expect "abort while a peer never arrives" 0 +"abandoned: ncclCommAbort was called" +"rank 0 aborted the communicator" \
    -- "${MPIRUN[@]}" -np 2 "$BIN" abort
# A blocking abort (CUDA_CPU_NCCL_ABORT=block) waits for the device's queued work, which gives
# up at once here (nothing else runs): the same results. test_watchdog_cuda blocks it forever.
expect "abort, CUDA_CPU_NCCL_ABORT=block" 0 +"abandoned: ncclCommAbort was called" \
    -- env CUDA_CPU_NCCL_ABORT=block "${MPIRUN[@]}" -x CUDA_CPU_NCCL_ABORT -np 2 "$BIN" abort
expect "same order on two communicators, one rank late: no inversion" 0 -"$INVERSION" -- "${MPIRUN[@]}" -np 2 "$BIN" order
expect "CUDA_CPU_NCCL_CONCURRENT=1: one stream passes, a second stream beside an op in flight faults, exit 2" 2 \
    +"may run at once on one GPU, which NCCL does not support" \
    -- env CUDA_CPU_NCCL_CONCURRENT=1 "${MPIRUN[@]}" -x CUDA_CPU_NCCL_CONCURRENT -np 2 "$BIN" concurrent
expect "two ranks on one GPU: ncclInvalidUsage" 0 +"use the same GPU" \
    -- env CUDA_CPU_SHARED_GPU=1 "${MPIRUN[@]}" -x CUDA_CPU_SHARED_GPU -np 2 "$BIN" shared_gpu
expect "a peer that exits: ncclRemoteError" 0 +"has exited" -- "$BIN" dead
expect "a stopped peer (SIGSTOP) is waited for" 0 -"$INVERSION" -- "$BIN" stopped
# NCCL's own peers (CUDA_CPU_NCCL_PEERS=local): a peer's exit unseen, destroy waits for every rank.
expect "CUDA_CPU_NCCL_PEERS=local: a dead peer unseen until the rank's own abort; destroy waits for every rank" 0 \
    +"waits for rank 1 (pid" +"exited) to reach ncclCommDestroy or ncclCommAbort" -"cannot complete" \
    -- env CUDA_CPU_NCCL_PEERS=local "$BIN" peers_local
expect "CUDA_CPU_NCCL_PEERS=bogus refused" 1 +"error: cuda_cpu: CUDA_CPU_NCCL_PEERS=bogus: use one of notify local" \
    -- env CUDA_CPU_NCCL_PEERS=bogus "$BIN" dead

done_testing
