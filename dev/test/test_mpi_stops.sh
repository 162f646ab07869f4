#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# A rank stopped inside any MPI call that waits for the others, not only the collectives of a
# step, ends the whole job within --comm-timeout plus the documented grace, naming the call
# (run/mpi_wait.h's mpiDeadline; docs/zero1.md, "Deadlines"): the CPU trainer stopped by an
# LD_PRELOAD shim (dev/test/mpi_stop_shim.c, dev/test/mpi_stop.sh) in MPI_Init, the thread
# set-up's MPI_Comm_split_type, the instances' MPI_Comm_split and MPI_Finalize. The GPU
# trainer's (set-up gathers and broadcasts, the NCCL bootstrap, the split embedding's host
# all-gather) are rows of the GPU suite (run_gpu_tests.sh, "stopped in an MPI call").
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
make -s train_gpt2 USE_ZERO1=1 >/dev/null || fatal "build train_gpt2"
mpicc -shared -fPIC -O1 -o "$TMP/mpi_stop_shim.so" dev/test/mpi_stop_shim.c -ldl || fatal "the shim builds"
JOB=("${MPIRUN[@]}" -np 2 ./train_gpt2 -e d1 -b 2 -t 32 -v 0 -s 0 -x 1 -i data/tinyshakespeare_train.bin)
# CASE: SPEC WORDS [FLAGS...]; the four at once (the stopped jobs mostly wait)
cases=("MPI_Init|MPI_Init" "MPI_Comm_split_type|MPI_Comm_split_type" "MPI_Comm_split|instances' MPI_Comm_split|--dist-opt-instances 2"
       "MPI_Finalize|MPI_Finalize")
for i in "${!cases[@]}"; do
    IFS='|' read -r spec words flags <<<"${cases[$i]}"
    # shellcheck disable=SC2086
    bash dev/test/mpi_stop.sh "$TMP" "$spec" 3 "$words" -- "${JOB[@]}" $flags >"$TMP/case$i.out" 2>&1 &
done
wait
for i in "${!cases[@]}"; do
    IFS='|' read -r spec _ <<<"${cases[$i]}"
    if grep -q '^PASS' "$TMP/case$i.out"; then ok "$(cat "$TMP/case$i.out" | head -1 | cut -c1-200)"
    else not_ok "stopped in $spec" "$TMP/case$i.out"; fi
done
done_testing
