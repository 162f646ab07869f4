#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# The CPU trainer's threads (run/threads.h, docs/training.md#threads):
#   1. without OMP_NUM_THREADS / OPENBLAS_NUM_THREADS it runs one thread per core it may use,
#      divided among the ranks of the host whose cores overlap (1 rank; taskset to one core;
#      np 2 and 4 unbound; np 2 bound to a core each), so ranks never oversubscribe a host;
#      the expectation comes from `nproc` (the affinity mask), not from the trainer;
#   2. a user's OMP_NUM_THREADS and OPENBLAS_NUM_THREADS are kept and named as theirs;
#   3. OpenBLAS runs one thread and the trainer splits the matmuls (OpenBLAS's pthread and
#      serial builds), or its OpenMP build threads them;
#   4. 1 and 2 threads train to the same bits: step lines and the checkpoint's model.bin and
#      optimizer.bin, with the zero1/ build (-z 1 and -z 0) and the plain one (-z 0); the
#      clip at 0.01 makes every update depend on the grad norm's last bits too;
#   5. thread counts from the environment are checked: a value libgomp ignores ("abc", "1.5",
#      "0", "-1", a list), one beyond the cap (1025, 100000: libgomp crashed starting them)
#      or an OPENBLAS_NUM_THREADS of "x" is one error naming the variable (np 1 and 2); threads
#      that cannot be started (ulimit -v too small for their stacks) are one error too.
# Every run here unsets the runner's OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 first.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

for bin in train_gpt2 train_gpt2_plain; do
    [ -x "./$bin" ] || fatal "./$bin is built"
done
DATA=data/tinyshakespeare_train.bin
[ -f $DATA ] || fatal "$DATA is there (make data)"
ARGS=(-e d1 -b 2 -t 32 -v 0 -s 0 -i $DATA)
CORES=$(env -u OMP_NUM_THREADS nproc)  # the cores this process may use (its affinity)
per() { local n=$(($1 / $2)); echo $((n > 0 ? n : 1)); }
plural() { [ "$1" = 1 ] && echo "$1 $2" || echo "$1 $2s"; }
# the OpenBLAS the trainer loads: its OpenMP build threads the matmuls itself
BLAS_LIB=$(ldd ./train_gpt2 | awk '/libopenblas/ { print $3 }')
case $(readlink -f "$BLAS_LIB") in
    *openmp*) split="OpenBLAS's OpenMP build" ;;
    *) split="OpenBLAS 1 thread" ;;
esac
note "this machine: $CORES cores for this process; $(readlink -f "$BLAS_LIB")"

# expect NAME LINE LAUNCH...: the run's threads line is exactly LINE (a prefix of it)
expect() {
    local name=$1 want=$2; shift 2
    env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "$@" -x 1 >"$TMP/$name.log" 2>&1
    local rc=$? got
    got=$(grep -m1 '^threads:' "$TMP/$name.log")
    if [ $rc -eq 0 ] && [[ $got == "$want"* ]]; then
        ok "$name: $got"
    else
        not_ok "$name: exit $rc, threads line '$got', expected '$want...'" "$TMP/$name.log"
    fi
}

# ---- 1. the automatic choice ----------------------------------------------------------
expect one_rank "threads: $CORES per rank ($(plural "$CORES" core) for 1 rank of this host); $split" \
    ./train_gpt2 "${ARGS[@]}"
expect taskset_one_core "threads: 1 per rank (1 core for 1 rank of this host); $split" \
    taskset -c "$(taskset -pc $$ | awk -F': ' '{ split($2, a, /[,-]/); print a[1] }')" ./train_gpt2 "${ARGS[@]}"
for np in 2 4; do
    expect "np${np}_unbound" "threads: $(per "$CORES" $np) per rank ($(plural "$CORES" core) for $np ranks of this host)" \
        "${MPIRUN[@]}" --bind-to none -np $np ./train_gpt2 "${ARGS[@]}"
done
if [ "$CORES" -ge 2 ]; then
    expect np2_bound_to_cores "threads: 1 per rank (1 core for 1 rank of this host)" \
        "${MPIRUN[@]}" --bind-to core -np 2 ./train_gpt2 "${ARGS[@]}"
else
    skip "np2_bound_to_cores" "one core"
fi

# ---- 2. the user's choice ---------------------------------------------------------------
expect omp_yours "threads: 3 per rank (OMP_NUM_THREADS=3, yours)" env OMP_NUM_THREADS=3 ./train_gpt2 "${ARGS[@]}"
expect omp_yours_np4 "threads: 2 per rank (OMP_NUM_THREADS=2, yours)" \
    env OMP_NUM_THREADS=2 "${MPIRUN[@]}" --bind-to none -np 4 ./train_gpt2 "${ARGS[@]}"
if [[ $split == "OpenBLAS 1 thread" ]]; then
    expect openblas_yours "threads: $CORES per rank ($(plural "$CORES" core) for 1 rank of this host); OpenBLAS 2 threads of its own beside them (OPENBLAS_NUM_THREADS=2, yours)" \
        env OPENBLAS_NUM_THREADS=2 ./train_gpt2 "${ARGS[@]}"
fi

# ---- 3. 1 and 2 threads: the same bits ------------------------------------------------------
STEPS=3
CKPT=$(printf "checkpoint_%08d" $STEPS)
same_bits() {  # same_bits NAME BIN ARGS...: OMP_NUM_THREADS=1 against 2
    local name=$1 bin=$2 t; shift 2
    for t in 1 2; do
        env -u OPENBLAS_NUM_THREADS OMP_NUM_THREADS=$t "$bin" "${ARGS[@]}" -x $STEPS -l 1e-3 --grad-clip 0.01 -n $STEPS \
            -o "$TMP/$name.t$t" "$@" >"$TMP/$name.t$t.log" 2>&1 || not_ok "$name: the $t-thread run failed"
    done
    same_runs "$name.t1" "$name.t2"
}
if [[ $split == "OpenBLAS 1 thread" ]]; then
    same_bits zero1_z1 ./train_gpt2 -z 1
    same_bits zero1_z0 ./train_gpt2 -z 0
    same_bits plain_z0 ./train_gpt2_plain -z 0
else
    skip "1 and 2 threads bitwise" "OpenBLAS's OpenMP build threads the matmuls (its sums follow its threads)"
fi

# ---- 5. the environment's thread counts checked --------------------------------------------
source dev/test/expect_error.sh
BASE=("${ARGS[@]}" -x 1)
for v in abc 1.5 0 -1 4,2 1025 100000; do
    BIN="env OMP_NUM_THREADS=$v ./train_gpt2" expect_error "omp_$v" 1 "OMP_NUM_THREADS='$v'" "from 1 to 1024" --
done
BIN="env OMP_NUM_THREADS=100000 ./train_gpt2" expect_error omp_100000 2 "OMP_NUM_THREADS='100000'" --
BIN="env OPENBLAS_NUM_THREADS=x ./train_gpt2" expect_error openblas_x 1 "OPENBLAS_NUM_THREADS='x'" --
# 1000 threads' stacks and arenas do not fit in 3 GB of address space (libgomp: exit 1, no error
# line); the subshell keeps the ulimit to this row
(ulimit -v 3000000 && BIN="env OMP_NUM_THREADS=1000 ./train_gpt2" expect_error omp_threads_not_started 1 \
    "could not start 1000 threads" "ulimit" --)
done_testing
