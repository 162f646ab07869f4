#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# run/blas_cores.h: the programs restart themselves with OPENBLAS_CORETYPE when OpenBLAS
# chose kernels below what the CPU can run (cloud VMs with a generic CPU model get
# "Prescott" on AVX-512 hardware). This machine is usually detected right, so the fault is
# faked with the test-only LLMC_TEST_BLAS_CORENAME (what the first process believes
# OpenBLAS reported). What OpenBLAS really loads is read from OpenBLAS itself: with
# OPENBLAS_VERBOSE=2 it prints "Core: NAME" on stderr each time the library loads, once
# per process image. The best core for this CPU is computed here independently, from the
# kernel's /proc/cpuinfo flags. The restarted process keeps its name (ps, pgrep).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

for bin in train_gpt2 train_gpt2_plain test_gpt2 test_zero1 test_kernels; do
    [ -x "./$bin" ] || fatal "./$bin is built"
done
DATA=data/tinyshakespeare_train.bin
[ -f $DATA ] || fatal "$DATA is there (make data)"
TRAIN=(./train_gpt2 -e d1 -b 1 -t 32 -x 1 -v 0 -s 0 -i $DATA)

# ---- the expectation, from /proc/cpuinfo (Linux lists avx/avx512 only when the OS saves
# their registers) and OpenBLAS's family names ----------------------------------------
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
vendor=$(grep -m1 '^vendor_id' /proc/cpuinfo | awk '{ print $3 }')
has() { local f; for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
if has avx512f avx512cd avx512bw avx512dq avx512vl; then expect=SkylakeX twin=Cooperlake
elif has avx2 fma avx; then
    case $vendor in AuthenticAMD | HygonGenuine) expect=Zen twin=Haswell ;; *) expect=Haswell twin=Zen ;; esac
elif has avx; then expect=Sandybridge twin=Bulldozer
else expect=none twin=none; fi
level() {  # what instructions an OpenBLAS kernel family uses: 3 AVX-512 ... 0 SSE, ? unknown
    case ${1,,} in
    skylakex | cooperlake | sapphirerapids) echo 3 ;;
    haswell | zen) echo 2 ;;
    sandybridge | bulldozer | piledriver | steamroller | excavator) echo 1 ;;
    prescott | core2 | penryn | dunnington | nehalem | atom | opteron* | barcelona | nano | bobcat) echo 0 ;;
    *) echo '?' ;;
    esac
}
note "this CPU: $vendor, best OpenBLAS kernels by /proc/cpuinfo: $expect"

# run NAME ENV... -- COMMAND...: the command with OpenBLAS's load report on, under a clean
# environment for the variables the check reads; $TMP/NAME.out, .err and .rc.
run() {
    local name=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env -u OPENBLAS_CORETYPE -u LLMC_BLAS_REEXEC -u LLMC_TEST_BLAS_CORENAME OPENBLAS_VERBOSE=2 "${envs[@]}" \
        timeout --kill-after=5 60 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    echo $? >"$TMP/$name.rc"
}
restart_re='^blas: OpenBLAS chose the Prescott kernels on a CPU with [A-Za-z0-9 -]+; restarting with OPENBLAS_CORETYPE=([A-Za-z]+) \(set OPENBLAS_CORETYPE yourself to choose\)$'
count() { local re=$1; shift; cat "$@" | grep -cE -- "$re"; }  # count REGEX FILE...: matching lines in all
cores() { sed -n 's/^Core: //p' "$TMP/$1.err" | tr '\n' ' '; }
show() { sed 's/^/       | /' "$TMP/$1.out" "$TMP/$1.err" | tail -n 12; }

# Without "Core:" lines nothing below can be judged: only dynamic-arch builds print them.
run probe -- ./test_gpt2
[ -n "$(cores probe)" ] || fatal "OpenBLAS prints a 'Core:' line under OPENBLAS_VERBOSE=2 (a dynamic-arch build)"

# ---- (a) the cloud-VM fault: one restart line, then OpenBLAS loads the named kernels ----
run fault LLMC_TEST_BLAS_CORENAME=Prescott -- "${TRAIN[@]}"
if [ $expect = none ]; then
    [ "$(count '^blas:' $TMP/fault.out)" = 0 ] && ok "SSE-only CPU: no restart with a faked Prescott" ||
        { not_ok "SSE-only CPU: a faked Prescott restarted the trainer"; show fault; }
else
    problems=()
    [ "$(cat $TMP/fault.rc)" = 0 ] || problems+=("exit $(cat $TMP/fault.rc)")
    [ "$(count "$restart_re" $TMP/fault.out)" = 1 ] || problems+=("not exactly one restart line")
    [ "$(head -n 1 $TMP/fault.out | grep -cE "$restart_re")" = 1 ] || problems+=("the restart line is not the first line")
    chosen=$(sed -nE "s/$restart_re/\\1/p" $TMP/fault.out | head -n 1)
    [ "$chosen" = "$expect" ] || problems+=("the line chose '$chosen', /proc/cpuinfo says $expect")
    loads=($(cores fault))
    [ ${#loads[@]} = 2 ] || problems+=("OpenBLAS loaded ${#loads[@]} times (${loads[*]}), expected twice: before and after the restart")
    [ "${loads[1]:-}" = "$chosen" ] || problems+=("after the restart OpenBLAS runs '${loads[1]:-}', the line said '$chosen'")
    [ "$(count '^blas: warning' $TMP/fault.err)" = 0 ] || problems+=("a warning")
    [ "$(count '^step +1/1' $TMP/fault.out)" = 1 ] || problems+=("not exactly one step line")
    if [ ${#problems[@]} = 0 ]; then ok "faked Prescott: one restart line, then OpenBLAS loads $chosen (loads: ${loads[*]})"
    else not_ok "faked Prescott: $(printf '%s; ' "${problems[@]}")"; show fault; fi

    # The load reports above cannot show that OPENBLAS_CORETYPE was set where OpenBLAS's own
    # detection already gives the chosen core (as here): read the variable from the
    # environment the restarted image got (/proc/PID/environ; exec keeps the PID).
    env -u OPENBLAS_CORETYPE -u LLMC_BLAS_REEXEC LLMC_TEST_BLAS_CORENAME=Prescott \
        "${TRAIN[@]}" -x 8 >"$TMP/environ.out" 2>&1 &
    pid=$!
    seen=
    while [ -z "$seen" ] && kill -0 $pid 2>/dev/null; do
        seen=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^OPENBLAS_CORETYPE=//p')
        [ -n "$seen" ] || sleep 0.02
    done
    wait $pid
    rc=$?
    if [ "$seen" = "$expect" ] && [ $rc = 0 ]; then ok "the restarted process got OPENBLAS_CORETYPE=$seen"
    else not_ok "the restarted process got OPENBLAS_CORETYPE='$seen' (expected $expect), exit $rc"; show environ; fi

    # The restarted process keeps its name (an exec of /proc/self/exe names it "exe"), so
    # that ps, top and pgrep find it as before: read once its first step line is out.
    env -u OPENBLAS_CORETYPE -u LLMC_BLAS_REEXEC LLMC_TEST_BLAS_CORENAME=Prescott \
        "${TRAIN[@]}" -x 1000 >"$TMP/name.out" 2>&1 &
    pid=$!
    while kill -0 $pid 2>/dev/null && ! grep -q '^step ' "$TMP/name.out"; do sleep 0.02; done
    comm=$(ps -o comm= -p $pid)
    found=$(pgrep -x train_gpt2 | grep -cx $pid)
    kill $pid 2>/dev/null
    wait $pid 2>/dev/null
    if [ "$(count "$restart_re" "$TMP/name.out")" = 1 ] && [ "$comm" = train_gpt2 ] && [ "$found" = 1 ]; then
        ok "the restarted process keeps its name: ps -o comm= says '$comm', pgrep -x train_gpt2 finds it"
    else not_ok "the restarted process: ps -o comm= says '$comm' (expected train_gpt2), pgrep -x train_gpt2 found it $found time(s)"; show name; fi

    # ---- (b) under mpirun: both ranks restart, rank 0 alone says so ---------------------
    run mpi LLMC_TEST_BLAS_CORENAME=Prescott -- "${MPIRUN[@]}" -np 2 "${TRAIN[@]}"
    loads=($(cores mpi))
    after=$(grep -c "^Core: $expect\$" $TMP/mpi.err)
    if [ "$(cat $TMP/mpi.rc)" = 0 ] && [ "$(count '^blas:' $TMP/mpi.out)" = 1 ] && [ "$(count '^blas:' $TMP/mpi.err)" = 0 ] &&
        [ ${#loads[@]} = 4 ] && [ "$after" -ge 2 ] && [ "$(count '^step +1/1' $TMP/mpi.out)" = 1 ]; then
        ok "mpirun -np 2, faked Prescott: one restart line, 4 loads (${loads[*]})"
    else not_ok "mpirun -np 2, faked Prescott: rc $(cat $TMP/mpi.rc), $(count '^blas:' $TMP/mpi.out) restart line(s), loads: ${loads[*]}"; show mpi; fi

    # ---- the loop guard: a restarted process whose OpenBLAS still runs lesser kernels (as
    # when a library rejects the name) warns once and goes on, without another exec ------
    run guard LLMC_BLAS_REEXEC=1 OPENBLAS_CORETYPE=Prescott -- "${TRAIN[@]}"
    loads=($(cores guard))
    if [ "$(cat $TMP/guard.rc)" = 0 ] && [ "$(count '^blas: warning: OpenBLAS still runs the Prescott kernels' $TMP/guard.err)" = 1 ] &&
        [ "$(count '^blas:' $TMP/guard.out)" = 0 ] && [ "${loads[*]}" = Prescott ]; then
        ok "restarted, still Prescott: $(grep '^blas:' $TMP/guard.err)"
    else not_ok "restarted, still Prescott: rc $(cat $TMP/guard.rc), loads: ${loads[*]}"; show guard; fi

    # ---- a report of the same level is no fault: levels are compared, not names ---------
    for fake in $twin FutureLake; do
        run fake_$fake LLMC_TEST_BLAS_CORENAME=$fake -- "${TRAIN[@]}"
        loads=($(cores fake_$fake))
        if [ "$(cat $TMP/fake_$fake.rc)" = 0 ] && [ "$(count '^blas:' $TMP/fake_$fake.out $TMP/fake_$fake.err)" = 0 ] &&
            [ ${#loads[@]} = 1 ]; then
            ok "faked $fake (level $(level $fake), this CPU's best $(level $expect)): no restart"
        else not_ok "faked $fake: a restart or a failure (rc $(cat $TMP/fake_$fake.rc), loads: ${loads[*]})"; show fake_$fake; fi
    done

    # ---- every program that runs OpenBLAS matmuls is wired (before MPI_Init / usage) ---
    # (train_gpt2_plain gets the tiny run; the test programs stop at their usage message)
    for bin in train_gpt2_plain test_gpt2 test_zero1 test_kernels; do
        args=()
        [ $bin = train_gpt2_plain ] && args=("${TRAIN[@]:1}")
        run wire_$bin LLMC_TEST_BLAS_CORENAME=Prescott -- ./$bin "${args[@]}"
        loads=($(cores wire_$bin))
        rc=$(cat $TMP/wire_$bin.rc) want_rc=0 usage=0
        case $bin in test_gpt2 | test_zero1) want_rc=1 usage=1 ;; esac  # one usage message, after the restart
        if [ "$(count "$restart_re" $TMP/wire_$bin.out)" = 1 ] && [ ${#loads[@]} = 2 ] && [ "${loads[1]}" = $expect ] &&
            [ "$rc" = $want_rc ] && [ "$(count '^error: usage' $TMP/wire_$bin.err)" = $usage ]; then
            ok "./$bin restarts too (loads: ${loads[*]}, exit $rc)"
        else not_ok "./$bin with a faked Prescott: $(count "$restart_re" $TMP/wire_$bin.out) restart line(s), loads: ${loads[*]}, exit $rc"; show wire_$bin; fi
    done
fi

# ---- (c) the user's OPENBLAS_CORETYPE is respected silently ----------------------------
run user OPENBLAS_CORETYPE=Prescott -- "${TRAIN[@]}"
if [ "$(cat $TMP/user.rc)" = 0 ] && [ "$(count '^blas:' $TMP/user.out $TMP/user.err)" = 0 ] && [ "$(cores user)" = "Prescott " ]; then
    ok "OPENBLAS_CORETYPE=Prescott by the user: no restart, OpenBLAS runs Prescott"
else not_ok "OPENBLAS_CORETYPE=Prescott by the user: rc $(cat $TMP/user.rc), loads: $(cores user)"; show user; fi

# ---- (d) nothing faked: a restart exactly when OpenBLAS's own choice is below the CPU's --
run plain -- "${TRAIN[@]}"
loads=($(cores plain))
detected=${loads[0]:-}
want=0
[ $expect != none ] && [ "$(level "$detected")" != '?' ] && [ "$(level "$detected")" -lt "$(level $expect)" ] && want=1
got=$(grep -c '^blas: OpenBLAS chose' $TMP/plain.out)
if [ "$(cat $TMP/plain.rc)" = 0 ] && [ "$got" = $want ] && [ ${#loads[@]} = $((1 + want)) ]; then
    ok "nothing faked: OpenBLAS detected $detected, $([ $want = 1 ] && echo "restarted once: $(cores plain)" || echo "no restart")"
else not_ok "nothing faked: OpenBLAS detected '$detected' (best $expect), $got restart line(s), expected $want"; show plain; fi

done_testing
