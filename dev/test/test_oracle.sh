#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=fast,full
# The CPU trainer against the PyTorch oracle (dev/test/gpt2_oracle.py), through ./test_gpt2.
#
#   fp32 model: np=1 (logits, loss, every gradient, 10 AdamW step losses); np=2 x B=2;
#               np=4 x B=1; np=2 x 2 micro-steps x B=1 (step losses + bitwise identical
#               parameters on every rank).
#   bf16 model (v5 file): the default trainer widens it to fp32 params and trains in fp32,
#               checked against the oracle's --train-dtype fp32 state (everything, as fp32);
#               with --param-dtype bf16 against the oracle's bf16-storage steps.
#   -z 1 (np=2 with small buckets, np=4, np=2 x 2 micro-steps) and bf16 param storage
#               (np=1, np=2 -z 1) against the oracle: test_gpt2 must be a USE_ZERO1=1 build.
#   negative control: a state from another seed must make test_gpt2 fail.
#
# Env: ORACLE_EXTRA_FLAGS (e.g. "-z 1 --bucket-size 4096") is appended to every test_gpt2 run.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
ORACLE=dev/test/gpt2_oracle.py
EXTRA=${ORACLE_EXTRA_FLAGS:-}
# The fast tier: fp32 at np 1 and 2 (-z 0 and -z 1) and the negative control.
fast_rows fp32_np1 fp32_np2_B2 fp32_np2_z1_bucket4096 negative_control_wrong_state

[ -x ./test_gpt2 ] || fatal "./test_gpt2 is built (make test_gpt2)"

make_oracle() {  # NAME [oracle make flags]
    local name=$1; shift
    if ! timeout 300 $PY $ORACLE make --out-model "$TMP/$name.model.bin" --out-state "$TMP/$name.state.bin" "$@" \
        >"$TMP/$name.oracle.log" 2>&1; then
        fatal "the oracle makes $name" "$TMP/$name.oracle.log"
    fi
}

# run_case NAME NP EXPECT_RC "PATTERN1|PATTERN2|..." -- test_gpt2 arguments: the row NAME
# Asserts the exit code, test_gpt2's TAP verdict (passed for EXPECT_RC 0, else failed) and that
# every pattern occurs: "ok DESC" or "not ok DESC" as that TAP line, another as a fixed string.
run_case() {
    local name=$1 np=$2 want_rc=$3 patterns=$4; shift 5
    selected "$name" || return 0
    local log="$TMP/$name.log" rc
    if [ "$np" = 1 ]; then
        timeout 120 ./test_gpt2 "$@" $EXTRA >"$log" 2>&1
    else
        timeout 120 "${MPIRUN[@]}" -np "$np" ./test_gpt2 "$@" $EXTRA >"$log" 2>&1
    fi
    rc=$?
    local problems=()
    if [ "$want_rc" = 0 ] && [ $rc -ne 0 ]; then problems+=("exit code $rc, expected 0"); fi
    if [ "$want_rc" = nonzero ] && { [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $rc -ge 128 ]; }; then
        problems+=("exit code $rc, expected a clean failure (1)")
    fi
    local IFS='|' verdict want=passed
    for p in $patterns; do
        case $p in
        "ok "*) tap_has "$log" ok "${p#ok }" || problems+=("no line '$p'") ;;
        "not ok "*) tap_has "$log" "not ok" "${p#not ok }" || problems+=("no line '$p'") ;;
        *) grep -qF -- "$p" "$log" || problems+=("no line '$p'") ;;
        esac
    done
    unset IFS
    [ "$want_rc" = 0 ] || want=failed
    verdict=$(tap_verdict "$log")
    [ "$verdict" = $want ] || problems+=("TAP verdict $verdict, expected $want")
    if [ ${#problems[@]} -eq 0 ]; then
        ok "$name"
    else
        not_ok "$name: $(printf "%s; " "${problems[@]}")"
        sed 's/^/       | /' "$log" | tail -n 30
    fi
}

t0=$SECONDS
make_oracle fp32                                   # L=2 C=64 NH=4 maxT=64, B=4 T=64, 10 steps
BF16_ROWS=(bf16_fp32params_np1 bf16_fp32params_np2 bf16_bf16params_np1 bf16_bf16params_np2_z1)
selected "${BF16_ROWS[@]}" && make_oracle bf16 --dtype bf16     # same init, rounded to bf16, v5 file
selected "${BF16_ROWS[@]:0:2}" && make_oracle bf16_fp32train --dtype bf16 --train-dtype fp32  # v5, fp32 steps
make_oracle other_seed --seed 1 --steps 2           # for the negative control
note "oracle files made in $((SECONDS - t0)) s"
M=$TMP/fp32.model.bin S=$TMP/fp32.state.bin

ALL_SINGLE="ok logits|ok loss|ok gradients|ok step losses"
ALL_MULTI="ok step losses|ok parameters bitwise identical on all ranks"

run_case fp32_np1 1 0 "1 ranks x 1 micro-steps x B=4|$ALL_SINGLE" -- "$M" "$S"
run_case fp32_np2_B2 2 0 "2 ranks x 1 micro-steps x B=2|$ALL_MULTI" -- "$M" "$S"
run_case fp32_np4_B1 4 0 "4 ranks x 1 micro-steps x B=1|$ALL_MULTI" -- "$M" "$S" --accum 1
run_case fp32_np2_accum2 2 0 "2 ranks x 2 micro-steps x B=1|$ALL_MULTI" -- "$M" "$S" --accum 2

# bf16 model file, fp32 training.
run_case bf16_fp32params_np1 1 0 "$ALL_SINGLE" -- "$TMP/bf16.model.bin" "$TMP/bf16_fp32train.state.bin"
run_case bf16_fp32params_np2 2 0 "$ALL_MULTI" -- "$TMP/bf16.model.bin" "$TMP/bf16_fp32train.state.bin"
# With the zero1/ plugin (the suite's test_gpt2 is built with USE_ZERO1=1; a build without it
# fails these rows, saying so): bf16 param storage, where the oracle's bf16 step losses apply,
# and ZeRO-1 (-z 1) against the same oracle numbers.
B16M=$TMP/bf16.model.bin B16S=$TMP/bf16.state.bin
run_case bf16_bf16params_np1 1 0 "$ALL_SINGLE" -- "$B16M" "$B16S" --param-dtype bf16
run_case bf16_bf16params_np2_z1 2 0 "-z 1|$ALL_MULTI" -- "$B16M" "$B16S" --param-dtype bf16 -z 1
run_case fp32_np2_z1_bucket4096 2 0 "-z 1|$ALL_MULTI" -- "$M" "$S" -z 1 --bucket-size 4096
run_case fp32_np4_z1 4 0 "4 ranks x 1 micro-steps x B=1, T=64, -z 1|$ALL_MULTI" -- "$M" "$S" --accum 1 -z 1
run_case fp32_np2_accum2_z1 2 0 "2 ranks x 2 micro-steps x B=1, T=64, -z 1|$ALL_MULTI" \
    -- "$M" "$S" --accum 2 -z 1 --bucket-size 100000

# Negative control: the checks can fail. The model of seed 0 against the state of seed 1.
run_case negative_control_wrong_state 1 nonzero "not ok logits" -- "$M" "$TMP/other_seed.state.bin"

note "test_oracle: $((SECONDS - t0)) s"
done_testing
