#!/usr/bin/env bash
# test: timeout=600 lane=cpu tier=full
# The tolerance-based numeric tests under every OpenBLAS kernel family this CPU and this
# OpenBLAS can run (OPENBLAS_CORETYPE), so that the family a machine happens to pick cannot
# hide a tolerance that only holds for another one: SSE (Prescott), AVX (Sandybridge),
# AVX2 (Haswell) and AVX-512 (SkylakeX) sum matmuls in other orders. Under each: the CPU
# kernels (test_kernels), the trainer against the PyTorch oracle (np 1; np 2 with ZeRO-1;
# bf16 params) and ZeRO-1 against replicated where the runs round differently
# (test_zero1: averaging at np 3, the split embedding at np 3 and 4, fp32 accumulation).
# A family the CPU lacks the instructions for (/proc/cpuinfo, where SSE3 is "pni") says
# SKIPPED; one this OpenBLAS does not accept (its "Core:" report names another) is a FAIL.
# With OPENBLAS_CORETYPE set the programs keep the user's choice (run/blas_cores.h). The
# family they choose themselves runs these rows in the kernels, oracle and zero1 steps of
# dev/test/run_tests.sh; ALL=1 runs it here too.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
make -s test_kernels >/dev/null && make -s test_gpt2 test_zero1 USE_ZERO1=1 >/dev/null || fatal "build"
ORACLE=dev/test/gpt2_oracle.py
$PY $ORACLE make --out-model "$TMP/m.bin" --out-state "$TMP/s.bin" >/dev/null &&
    $PY $ORACLE make --out-model "$TMP/b.bin" --out-state "$TMP/b_state.bin" --dtype bf16 >/dev/null &&
    $PY $ORACLE make --out-model "$TMP/small.bin" --out-state "$TMP/x.bin" --vocab 1000 --max-seq 32 --seq 32 \
        --steps 1 >/dev/null &&
    $PY $ORACLE make --out-model "$TMP/c48.bin" --out-state "$TMP/x.bin" --vocab 1000 --channels 48 --max-seq 32 \
        --seq 32 --steps 1 >/dev/null || fatal "oracle models"

# NP PROGRAM ARGS... per line; rows whose tolerances the kernels' rounding could break.
ROWS=(
    "1 ./test_kernels"
    "1 ./test_gpt2 $TMP/m.bin $TMP/s.bin"
    "2 ./test_gpt2 $TMP/m.bin $TMP/s.bin -z 1 --bucket-size 4096"
    "1 ./test_gpt2 $TMP/b.bin $TMP/b_state.bin --param-dtype bf16"
    "3 ./test_zero1 $TMP/small.bin -z 1 --bucket-size 5000 --average-in-collective"
    "3 ./test_zero1 $TMP/c48.bin -z 1 --bucket-size 3000 --split-embedding --average-in-collective"
    "4 ./test_zero1 $TMP/c48.bin -z 1 --bucket-size 3000 --split-embedding"
    "3 ./test_zero1 $TMP/small.bin -z 1 --bucket-size 5000 --grad-dtype bf16 --fp32-accumulation --average-in-collective"
)

flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { local f; for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
ran=() skipped=()
own=$(OPENBLAS_VERBOSE=2 ./test_kernels 2>&1 >/dev/null | sed -n 's/^Core: //p' | tail -n 1)  # after any restart
for family in "Prescott pni" "Sandybridge avx" "Haswell avx2 fma" "SkylakeX avx512f avx512cd avx512bw avx512dq avx512vl"; do
    read -r core needs <<<"$family"
    # shellcheck disable=SC2086  # the flags, one per word
    if ! has $needs; then
        skip "the numeric rows under $core" "this CPU lacks $needs"
        skipped+=("$core")
        continue
    fi
    if [ "$core" = "$own" ] && [ "${ALL:-0}" != 1 ]; then
        note "$core: the programs' own choice here, run by the kernels, oracle and zero1 steps"
        ran+=("$core")
        continue
    fi
    got=$(OPENBLAS_CORETYPE=$core OPENBLAS_VERBOSE=2 ./test_kernels 2>&1 >/dev/null | sed -n 's/^Core: //p')
    if [ "$got" != "$core" ]; then
        not_ok "$core: this OpenBLAS runs '$got' when asked for it"
        continue
    fi
    ran+=("$core")
    for row in "${ROWS[@]}"; do
        read -r np cmd <<<"$row"
        # shellcheck disable=SC2086  # the command line, split on purpose
        if OPENBLAS_CORETYPE=$core timeout 300 "${MPIRUN[@]}" -np "$np" $cmd >"$TMP/log" 2>&1; then
            ok "$core np=$np ${cmd#./}"
        else
            not_ok "$core np=$np ${cmd#./}"
            diag "$(tap_not_ok "$TMP/log" | head -5)"
            diag "$(tail -n 5 "$TMP/log")"
        fi
    done
done
note "kernel families run: ${ran[*]:-none}; not on this CPU: ${skipped[*]:-none}"
[ ${#ran[@]} -gt 0 ] || not_ok "no kernel family ran"
done_testing
