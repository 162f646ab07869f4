#!/usr/bin/env bash
# test: timeout=420 lane=cpu tier=full
# --optimizer muon on the CPU trainer (issue 43), replicated and under ZeRO-1 (Megatron's
# layer-wise distributed optimizer, zero1/layout_layerwise.h):
#   1. the real peer: emerging-optimizers 0.3.0's own Muon with megatron-core 0.19.2's defaults
#      (dev/test/muon_reference.py, fp32 Newton-Schulz, wpe with AdamW as ours) against ./test_gpt2
#      over 10 steps of the oracle's GPT-2: step losses, grad norms and the final weights (each
#      Muon matrix within 1e-4 of its update, the rest 1e-4 absolute), at the defaults and with
#      every --muon-* flag moved (two more reference runs); replicated at np 2 and 4; ZeRO-1 at
#      np 2, 3 and 4 with small buckets (several Muon buckets, uneven ownership), also with
#      --average-in-collective, --dp-invariant, --split-embedding, --check-nan and no overlap
#      (bitwise identical replicas each); --grad-dtype bf16 within 5e-4 of the loss; AdamW's run
#      fails against Muon's reference;
#   2. planted bugs, each a ./test_gpt2 built from a copy of the sources with one change, each
#      failing against a reference: Q, K and V orthogonalized together, Nesterov flipped, the
#      coefficient sets swapped, the scale of the transposed shape;
#   3. checkpoints: a resume at step 3 writes the straight run's step-6 checkpoint byte for byte,
#      replicated and ZeRO-1 (and a build that does not save a matrix's momentum is caught);
#      replicated np 2 -> np 1, ZeRO-1 np 2 -> np 3 and np 4 -> np 1 continue within 1e-5 of the
#      straight run; --dp-invariant at np 2 and np 4 write the same checkpoint bytes; a resume
#      with --optimizer adamw is refused naming both; a changed --muon-momentum is refused
#      without --allow-resume-change;
#   4. the flag rules: bad choices, --muon-* without muon, instances, --muon-ns-bf16 on the CPU
#      trainer: one error line each.
# Without PyPI the peer rows say SKIPPED, except under CI (CI=true), where they fail.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
source dev/test/expect_error.sh

make -s train_gpt2 test_gpt2 USE_ZERO1=1 >/dev/null && make -s train_gpt2_plain >/dev/null ||
    fatal "make train_gpt2 test_gpt2 USE_ZERO1=1, train_gpt2_plain"

# ---- 1. the peer -------------------------------------------------------------------------
pypi_peer emerging-optimizers emerging_optimizers.sh "$(bash dev/test/emerging_optimizers.sh --pinned)"
EO=$PEER_DIR

# reference NAME [flags]: NAME.m0 (initial), NAME.state (losses, norms), NAME.final after 10 steps.
reference() {
    local name=$1
    shift
    timeout 300 $PY dev/test/muon_reference.py run --emerging "$EO" --steps 10 --wpe adamw \
        --muon-fp32-matmul-prec highest --out-model "$TMP/$name.m0" --out-state "$TMP/$name.state" \
        --out-final "$TMP/$name.final" "$@" >"$TMP/$name.ref.log" 2>&1 || fatal "muon_reference $name" "$TMP/$name.ref.log"
}
# against NAME WANT DESC NP BIN [flags]: BIN (a test_gpt2) on NAME's reference; WANT passed|failed.
against() {
    local name=$1 want=$2 desc=$3 np=$4 bin=$5 log
    shift 5
    log=$TMP/$(echo "$desc" | tr -c 'a-zA-Z0-9\n' _).log
    timeout 120 "${MPIRUN[@]}" -np "$np" "$bin" "$TMP/$name.m0" "$TMP/$name.state" --final "$TMP/$name.final" \
        "$@" >"$log" 2>&1
    local verdict
    verdict=$(tap_verdict "$log")
    if [ "$verdict" = "$want" ]; then
        local first=''
        [ "$want" = failed ] && first=" ($(tap_not_ok "$log" | head -1 | tr -s ' '))"
        ok "$desc: test_gpt2 $verdict$first"
    else
        not_ok "$desc: test_gpt2 $verdict, expected $want" "$log"
    fi
}

VARIANT_A=(--muon-split-qkv 0 --muon-nesterov 1 --muon-coefficients simple --muon-scale unit_rms_norm
           --muon-momentum 0.9 --muon-extra-scale 0.5 --muon-ns-steps 4)
VARIANT_B=(--muon-scale shape_scaling --muon-extra-scale 2)
if [ -n "$EO" ]; then
    reference default
    reference batch12 --batch 12  # splits over 2, 3 and 4 ranks
    reference variant_a12 --batch 12 "${VARIANT_A[@]}"
    reference variant_a "${VARIANT_A[@]}"
    reference variant_b "${VARIANT_B[@]}"
    M=(--optimizer muon)
    Z1=(--optimizer muon -z 1 --bucket-size 20000)
    against default passed "np 1, Megatron's defaults, against emerging-optimizers' Muon" 1 ./test_gpt2 "${M[@]}"
    against variant_a passed "np 1, every --muon-* flag moved (${VARIANT_A[*]})" 1 ./test_gpt2 "${M[@]}" "${VARIANT_A[@]}"
    against variant_b passed "np 1, ${VARIANT_B[*]}" 1 ./test_gpt2 "${M[@]}" "${VARIANT_B[@]}"
    against default passed "np 2 x B 2, -z 0, replicas bitwise identical" 2 ./test_gpt2 "${M[@]}" -z 0
    against default passed "np 4 x B 1, -z 0, replicas bitwise identical" 4 ./test_gpt2 "${M[@]}" -z 0
    against batch12 passed "ZeRO-1 np 2 x B 6, --bucket-size 20000" 2 ./test_gpt2 "${Z1[@]}"
    against batch12 passed "ZeRO-1 np 3 x B 4, --bucket-size 20000" 3 ./test_gpt2 "${Z1[@]}"
    against batch12 passed "ZeRO-1 np 4 x B 3, --bucket-size 5000" 4 ./test_gpt2 "${M[@]}" -z 1 --bucket-size 5000
    against variant_a12 passed "ZeRO-1 np 3, every --muon-* flag moved" 3 ./test_gpt2 "${Z1[@]}" "${VARIANT_A[@]}"
    for extra in --average-in-collective --dp-invariant --split-embedding --check-nan \
        "--no-overlap-grad-reduce --no-overlap-param-gather"; do
        # shellcheck disable=SC2086  # $extra: one or two flags
        against default passed "ZeRO-1 np 2, $extra" 2 ./test_gpt2 "${Z1[@]}" $extra
    done
    # bf16 reductions round each summed gradient (2^-9 relative), which Newton-Schulz passes on:
    # held to the loss only, 5e-4 (measured 2.5e-4 over the 10 steps), replicas still identical.
    log=$TMP/bf16_grads.log
    timeout 120 "${MPIRUN[@]}" -np 2 ./test_gpt2 "$TMP/default.m0" "$TMP/default.state" "${Z1[@]}" --grad-dtype bf16 \
        >"$log" 2>&1
    err=$(sed -n 's/^.*ok [0-9]* - step losses *err \([^ ]*\).*/\1/p' "$log" | head -1)
    if [ -n "$err" ] && awk -v e="$err" 'BEGIN { exit !(e <= 5e-4) }' && tap_has "$log" ok "parameters bitwise identical on all ranks"; then
        ok "ZeRO-1 np 2, --grad-dtype bf16: step losses within $err of the reference (<= 5e-4), replicas identical"
    else
        not_ok "ZeRO-1 np 2, --grad-dtype bf16: step losses err '$err' (want <= 5e-4) or replicas differ" "$log"
    fi
    against default failed "negative control: AdamW against Muon's reference" 1 ./test_gpt2
fi

# ---- 2. planted bugs ---------------------------------------------------------------------
# plant NAME FILE OLD NEW [target]: $TMP/NAME/target (test_gpt2) built from a copy of the sources,
# OLD replaced by NEW in FILE (text that occurs exactly once there); the build's objects and
# stamps come along with their times, so only what the change touches is rebuilt.
plant() {
    local dir=$TMP/$1 target=${5:-test_gpt2}
    mkdir -p "$dir"
    cp -a Makefile llmc run zero1 dev train_gpt2.c build .build-*.stamp "$dir/" 2>/dev/null
    [ -f train_gpt2.cu ] && cp -a train_gpt2.cu "$dir/"
    replace_once "$dir/$2" "$3" "$4" || fatal "mutation $1: its text is not in $2 once"
    make -s -C "$dir" "$target" USE_ZERO1=1 >"$dir.build.log" 2>&1 || fatal "mutation $1 builds" "$dir.build.log"
}
if [ -n "$EO" ]; then
    plant qkv_together llmc/muon_cpu.h "int parts = qkv && cfg->split_qkv ? 3 : 1" "int parts = 1"
    against default failed "planted: Q, K and V orthogonalized together" 1 "$TMP/qkv_together/test_gpt2" "${M[@]}"
    plant nesterov_flipped llmc/muon.h "return nesterov ? " "return !nesterov ? "
    against default failed "planted: Nesterov flipped" 1 "$TMP/nesterov_flipped/test_gpt2" "${M[@]}"
    plant coefficients_swapped llmc/muon.h "kind == MUON_COEFFICIENTS_SIMPLE ? simple" \
        "kind != MUON_COEFFICIENTS_SIMPLE ? simple"
    against default failed "planted: the coefficient sets swapped" 1 "$TMP/coefficients_swapped/test_gpt2" "${M[@]}"
    plant transposed_scale llmc/muon_cpu.h "muon_scale_factor(cfg->scale, part_rows, cols)" \
        "muon_scale_factor(cfg->scale, cols, part_rows)"
    against variant_b failed "planted: the scale of the transposed shape" 1 "$TMP/transposed_scale/test_gpt2" \
        "${M[@]}" "${VARIANT_B[@]}"
fi

# ---- 3. checkpoints ----------------------------------------------------------------------
$PY dev/test/gpt2_oracle.py make --out-model "$TMP/m.bin" --out-state "$TMP/s.bin" --steps 0 >/dev/null || fatal "oracle"
COMMON=(-e "$TMP/m.bin" -i data/tinyshakespeare_train.bin -t 64 -x 6 -v 0 -s 0 -l 1e-2 -u 2 -q 0.1 -c 0.1
        --optimizer muon -n 3)
Z1=(-z 1 --bucket-size 20000)
train() {  # train BIN NP B DIR [flags]
    local bin=$1 np=$2 b=$3 dir=$4
    shift 4
    timeout 300 "${MPIRUN[@]}" -np "$np" "$bin" "${COMMON[@]}" -b "$b" -o "$dir" "$@" >"$dir.log" 2>&1
}
resume_from() {  # resume_from SRC DST: DST gets SRC's step-3 checkpoint and log
    mkdir -p "$2"
    cp -r "$1/checkpoint_00000003" "$2/"
    head -n 3 "$1/main.log" >"$2/main.log"
}
same_step6() { cmp -s "$1/checkpoint_00000006/model.bin" "$2/checkpoint_00000006/model.bin" &&
               cmp -s "$1/checkpoint_00000006/optimizer.bin" "$2/checkpoint_00000006/optimizer.bin"; }
losses() { sed -n 's/^s:\([0-9]*\) trl:\([^ ]*\).*/\1 \2/p' "$1/main.log"; }
close() {  # close A B: the losses of steps 4..6 agree within 1e-5
    awk 'NR == FNR { a[$1] = $2; next } $1 >= 4 { n++; d = $2 - a[$1]; if (d < 0) d = -d; if (d > 1e-5) bad = 1 }
         END { exit !(n == 3 && !bad) }' <(losses "$1") <(losses "$2")
}
# resumed BIN NP B STRAIGHT NAME [flags]: BIN resumes STRAIGHT's step-3 checkpoint; 0 if its step 6 is STRAIGHT's.
resumed() {
    local bin=$1 np=$2 b=$3 straight=$4 name=$5
    shift 5
    resume_from "$TMP/$straight" "$TMP/$name"
    train "$bin" "$np" "$b" "$TMP/$name" -y 1 "$@" && grep -q "resumed from .*checkpoint_00000003" "$TMP/$name.log" &&
        same_step6 "$TMP/$straight" "$TMP/$name"
}
# The plain replicated optimizer (train_gpt2.c's own, no zero1/), the reference of the rest.
train ./train_gpt2_plain 1 4 "$TMP/straight" || fatal "the straight Muon run" "$TMP/straight.log"
grep -q "^optimizer: muon on the 2 blocks' qkvw, attprojw, fcw, fcprojw (8 matrices" "$TMP/straight.log" &&
    grep -q "^optimizer muon$" "$TMP/straight/checkpoint_00000003/state.txt" &&
    ok "the header names Muon's matrices; state.txt records the optimizer" ||
    not_ok "the header or state.txt does not name the optimizer" "$TMP/straight.log"
if resumed ./train_gpt2_plain 1 4 straight resumed; then
    ok "plain replicated resume at step 3: the step-6 checkpoint is the straight run's, byte for byte"
else
    not_ok "plain replicated resume at step 3 differs from the straight run" "$TMP/resumed.log"
fi
plant momentum_not_saved train_gpt2.c \
    "memcpy(host, rep_state_at(replicated(o), which, range), range->n * sizeof(float));" \
    "memcpy(host, rep_state_at(replicated(o), which, range), range->n * sizeof(float));
    if (which == OPTIMIZER_M && gpt2_tensor_is_hidden_matrix(&replicated(o)->config, range->param))
        memset(host, 0, range->n * sizeof(float));" train_gpt2_plain
if resumed "$TMP/momentum_not_saved/train_gpt2_plain" 1 4 straight resumed_planted; then
    not_ok "planted (replicated): a matrix's momentum not saved, and the resume still matched"
else
    ok "planted (replicated): a matrix's momentum not saved: the resume differs from the straight run"
fi
train ./train_gpt2 2 2 "$TMP/straight_np2" -z 0 || fatal "the np 2 Muon run" "$TMP/straight_np2.log"
resume_from "$TMP/straight_np2" "$TMP/np2_to_np1"
if train ./train_gpt2 1 4 "$TMP/np2_to_np1" -z 0 -y 1 && close "$TMP/straight_np2" "$TMP/np2_to_np1"; then
    ok "replicated resume np 2 -> np 1: steps 4-6 within 1e-5 of the straight np 2 run"
else
    not_ok "replicated resume np 2 -> np 1 drifts from the straight run" "$TMP/np2_to_np1.log"
fi
# ZeRO-1: 12 sequences a step over 2, 3, 4 or 1 ranks (the owners of the matrices change).
train ./train_gpt2 2 6 "$TMP/z1_np2" "${Z1[@]}" || fatal "the ZeRO-1 np 2 Muon run" "$TMP/z1_np2.log"
grep -q "Muon's matrices, each whole on one rank" "$TMP/z1_np2.log" && ok "ZeRO-1's bucket table names Muon's buckets" ||
    not_ok "ZeRO-1's bucket table shows no Muon bucket" "$TMP/z1_np2.log"
if resumed ./train_gpt2 2 6 z1_np2 z1_np2_again "${Z1[@]}"; then
    ok "ZeRO-1 resume at np 2: the step-6 checkpoint is the straight run's, byte for byte"
else
    not_ok "ZeRO-1 resume at np 2 differs from the straight run" "$TMP/z1_np2_again.log"
fi
plant zero1_momentum_not_saved zero1/checkpoint.c \
    "if (which == ZERO1_STATE_V && zero1_bucket_is_muon(" "if (which != ZERO1_STATE_MASTER && zero1_bucket_is_muon(" \
    train_gpt2
if resumed "$TMP/zero1_momentum_not_saved/train_gpt2" 2 6 z1_np2 z1_planted "${Z1[@]}"; then
    not_ok "planted (ZeRO-1): a matrix's momentum not saved, and the resume still matched"
else
    ok "planted (ZeRO-1): a matrix's momentum not saved: the resume differs from the straight run"
fi
# kill -9 of the whole ZeRO-1 job (mpirun and ranks: a session) once step 4 is logged, then the same
# command line again: it resumes from its last checkpoint and ends on the straight run's bytes.
killed=$TMP/z1_killed
mkdir -p "$killed"
setsid "${MPIRUN[@]}" -np 2 ./train_gpt2 "${COMMON[@]}" -b 6 -o "$killed" "${Z1[@]}" -n 1 -y 1 >"$killed.log" 2>&1 &
sid=$!
deadline=$((SECONDS + 120))
until grep -q '^s:4 ' "$killed/main.log" 2>/dev/null || [ $SECONDS -ge $deadline ] || ! kill -0 $sid 2>/dev/null; do
    sleep 0.05
done
kill_session $sid
wait $sid 2>/dev/null
if train ./train_gpt2 2 6 "$killed" "${Z1[@]}" -n 1 -y 1 && grep -q "resumed from" "$killed.log" &&
   same_step6 "$TMP/z1_np2" "$killed"; then
    ok "kill -9 of a ZeRO-1 Muon job after step 4, the same command again: the straight run's step-6 bytes"
else
    not_ok "kill -9 of a ZeRO-1 Muon job: the rerun did not end on the straight run's bytes" "$killed.log"
fi
train ./train_gpt2_plain 1 12 "$TMP/plain_b12" || fatal "the plain replicated run, 12 sequences" "$TMP/plain_b12.log"
if awk 'NR == FNR { a[$1] = $2; next } { n++; d = $2 - a[$1]; if (d < 0) d = -d; if (d > 1e-5) bad = 1 }
        END { exit !(n == 6 && !bad) }' <(losses "$TMP/plain_b12") <(losses "$TMP/z1_np2"); then
    ok "ZeRO-1 np 2 x B 6 against the plain replicated optimizer at np 1 x B 12: 6 step losses within 1e-5"
else
    not_ok "ZeRO-1 np 2 drifts from the plain replicated optimizer at np 1" "$TMP/z1_np2.log"
fi
resume_from "$TMP/z1_np2" "$TMP/z1_np2_to_np3"
if train ./train_gpt2 3 4 "$TMP/z1_np2_to_np3" "${Z1[@]}" -y 1 && close "$TMP/z1_np2" "$TMP/z1_np2_to_np3"; then
    ok "ZeRO-1 resume np 2 -> np 3: steps 4-6 within 1e-5 of the straight run"
else
    not_ok "ZeRO-1 resume np 2 -> np 3 drifts from the straight run" "$TMP/z1_np2_to_np3.log"
fi
train ./train_gpt2 4 3 "$TMP/z1_np4" "${Z1[@]}" || fatal "the ZeRO-1 np 4 Muon run" "$TMP/z1_np4.log"
resume_from "$TMP/z1_np4" "$TMP/z1_np4_to_np1"
if train ./train_gpt2 1 12 "$TMP/z1_np4_to_np1" "${Z1[@]}" -y 1 && close "$TMP/z1_np4" "$TMP/z1_np4_to_np1"; then
    ok "ZeRO-1 resume np 4 -> np 1: steps 4-6 within 1e-5 of the straight run"
else
    not_ok "ZeRO-1 resume np 4 -> np 1 drifts from the straight run" "$TMP/z1_np4_to_np1.log"
fi
INV=("${Z1[@]}" --dp-invariant -d 768 -x 3)
train ./train_gpt2 2 3 "$TMP/inv_np2" "${INV[@]}" && train ./train_gpt2 4 3 "$TMP/inv_np4" "${INV[@]}" ||
    fatal "the --dp-invariant Muon runs" "$TMP/inv_np4.log"
if cmp -s "$TMP/inv_np2/checkpoint_00000003/model.bin" "$TMP/inv_np4/checkpoint_00000003/model.bin" &&
   cmp -s "$TMP/inv_np2/checkpoint_00000003/optimizer.bin" "$TMP/inv_np4/checkpoint_00000003/optimizer.bin"; then
    ok "--dp-invariant with Muon: np 2 x 2 micro-steps and np 4 x 1 (B 3) write the same checkpoint bytes"
else
    not_ok "--dp-invariant with Muon: np 2 and np 4 checkpoints differ"
fi

# ---- 4. the rules ------------------------------------------------------------------------
BIN=./train_gpt2
BASE=(-e "$TMP/m.bin" -i data/tinyshakespeare_train.bin -t 64 -b 1 -x 2 -v 0 -s 0)
resume_from "$TMP/straight" "$TMP/other"
expect_error resume_with_adamw 1 "--optimizer muon" "--optimizer adamw" -- -o "$TMP/other" -y 1 -n 3 -b 4 -z 0 -x 6 \
    -l 1e-2 -u 2 -q 0.1 -c 0.1
expect_error resume_momentum_changed 1 "--muon-momentum 0.95 -> 0.9" "--allow-resume-change" -- -o "$TMP/other" -y 1 \
    -n 3 -b 4 -z 0 -x 6 -l 1e-2 -u 2 -q 0.1 -c 0.1 --optimizer muon --muon-momentum 0.9
[ "$(ls "$TMP/other")" = "$(printf 'checkpoint_00000003\nmain.log')" ] && ok "the refused resumes wrote nothing" ||
    not_ok "a refused resume left files: $(ls "$TMP/other" | tr '\n' ' ')"
expect_error optimizer_choice 1 "--optimizer expects one of adamw|muon" -- --optimizer sgd
expect_error scale_choice 1 "--muon-scale expects one of" -- --optimizer muon --muon-scale rms
expect_error muon_flags_without_muon 1 "--muon-* flags" "--optimizer muon" -- --muon-momentum 0.9
expect_error muon_instances 2 "--dist-opt-instances" "Megatron" -- --optimizer muon -z 1 --dist-opt-instances 2
expect_error muon_ns_bf16_cpu 1 "--muon-ns-bf16" "fp32" -- --optimizer muon --muon-ns-bf16
done_testing
