#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=fast,full
# Non-finite steps are caught by default (run/step.h's update gate, run/run.c's
# stop, run/checkpoint_io.h's finite checks). A small model (vocab 1000) learns a repeating
# token pattern; a test build's seams (run/seams.h) plant the faults.
#
#   diverged     a NaN in a gradient at every step from step 6 (LLMC_TEST_PLANT_NAN=5+), -x 12
#                -n 2 -nk 2, the default --max-nonfinite-steps 3: steps 6-9 are skipped (step
#                line and main.log), the job stops after step 9 with one error naming the
#                steps and the grad norm, exit 1 on every rank; left on disk: checkpoints 6
#                and 8, both finite and holding the same state (a skipped update changes
#                nothing), and 4, the newest that a good step (5) measured, which -nk keeps
#                besides its newest 2 (run/spikes.h); -y 1 resumes from 8, its step 9 has the diverged run's loss (the
#                same weights and batch), and finishes; resumed with the NaN still planted, it stops
#                after step 9 (the count of non-finite steps goes on from the checkpoint's 3). At
#                np 1 and 2, ZeRO-1 and replicated
#                (zero1/'s -z 0, and the trainer's own optimizer: train_gpt2_plain)
#   nan_loss     a NaN loss alone (LLMC_TEST_NAN_LOSS=5+; the gradients finite): the error
#                names the loss; one such step skips its update exactly as a NaN gradient
#                does (the same final weights), unlike a clean run
#   stop_at_once --max-nonfinite-steps 0 stops at the first non-finite step
#   v_overflow   --grad-clip 0 and a gradient of 1e20 (LLMC_TEST_GRAD_SPIKE=2:1e20) that the
#                spike detector lets through (--spike-norm-factor 0): AdamW's v overflows; the next checkpoint is refused naming it, the earlier one stays
#                (-nk 1 removes nothing), no temporary is left
#   old_window   a checkpoint whose outlier windows hold NaN and inf (as an older build saved
#                them): -y 1 warns once per window and resumes
#   old_nan      a checkpoint whose model.bin holds a NaN (an older build's, after its run had
#                diverged): -y 1 refuses it naming the tensor and the element
# Each case is a row of that name (diverged: diverged NAME, e.g. np2_zero1). The fast tier
# runs the diverged case alone, at np 2 ZeRO-1 and np 1 with train_gpt2_plain.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
fast_rows np2_zero1 np1_plain
small_model "$TMP" || fatal "the small model (build, oracle)"
pattern_shard "$TMP/pattern.bin" || fatal "the pattern shard"

COMMON=(-e "$TMP/m.bin" -i "$TMP/pattern.bin" -b 2 -t 32 -v 0 -s 0 -l 1e-3)
run() {  # [ENV=value ...] run LOG OUT NP BIN ARGS...: output in $TMP/LOG, -o $TMP/OUT
    local log=$1 out=$2 np=$3 bin=$4
    shift 4
    timeout 300 "${MPIRUN[@]}" -np "$np" "$bin" "${COMMON[@]}" -o "$TMP/$out" "$@" >"$TMP/$log" 2>&1
}
# finite FILE...: every float after the 1024-byte header is finite.
finite() {
    $PY - "$@" <<'PYEOF'
import array, math, sys
for path in sys.argv[1:]:
    a = array.array("f", open(path, "rb").read()[1024:])
    assert all(math.isfinite(x) for x in a), path
PYEOF
}
# one_error LOG KEYWORD...: exactly one `error:` line, holding every keyword; no rank but 0 spoke.
one_error() {
    local log=$1 keyword
    shift
    [ "$(grep -c 'error:' "$log")" = 1 ] && ! grep -q '^\[rank [1-9]' "$log" || return 1
    for keyword in "$@"; do grep 'error:' "$log" | grep -qF -- "$keyword" || return 1; done
}
loss_at() { grep -E "^step +$2/" "$1" | sed -E 's/.*\| loss ([^ ]+) .*/\1/'; }
ckpt() { echo "$TMP/$1/checkpoint_$(printf %08d "$2")"; }
checkpoints() { (cd "$TMP/$1" && ls -A | grep checkpoint | tr '\n' ' '); }
same_state() {  # OUT STEP_A STEP_B: the same weights, m and v
    cmp -s "$(ckpt "$1" "$2")/model.bin" "$(ckpt "$1" "$3")/model.bin" &&
        cmp -s <(tail -c +1025 "$(ckpt "$1" "$2")/optimizer.bin") <(tail -c +1025 "$(ckpt "$1" "$3")/optimizer.bin")
}

# diverged NAME NP BIN ARGS...: the row NAME
diverged() {
    local name=$1 np=$2 bin=$3 rc
    shift 3
    selected "$name" || return 0
    local log=$TMP/log_$name out=out_$name
    LLMC_TEST_PLANT_NAN=5+ run "log_$name" "$out" "$np" "$bin" -x 12 -n 2 -nk 2 "$@"
    rc=$?
    if [ $rc = 1 ] && one_error "$log" "non-finite grad norm" "in 4 steps in a row, 6 to 9, more than --max-nonfinite-steps 3" \
           "the weights are those after step 5" "-y 1 resumes from the newest checkpoint, step 8" &&
       [ "$(grep -cE '^step +[6-9]/12 .*\| update skipped \(non-finite grad norm\)$' "$log")" = 4 ] &&
       ! grep -qE '^step +10/' "$log" &&
       [ "$(grep -cE '^s:[6-9] skp:1 zl:nan zn:nan nf:norm$' "$TMP/$out/main.log")" = 4 ]; then
        ok "$name: steps 6-9 skipped, then one error naming them and the grad norm (exit 1)"
    else not_ok "$name: the stop (exit $rc)" "$log"; return; fi
    if [ "$(checkpoints "$out")" = "checkpoint_00000004 checkpoint_00000006 checkpoint_00000008 " ] &&
       finite "$(ckpt "$out" 6)"/{model,optimizer}.bin "$(ckpt "$out" 8)"/{model,optimizer}.bin && same_state "$out" 6 8; then
        ok "$name: -nk 2 kept checkpoints 6 and 8, finite, the same state, and 4, the last one a good step measured"
    else not_ok "$name: the checkpoints left: $(checkpoints "$out")"; fi
    # Diverging again after the resume: checkpoint 8 came after 3 non-finite steps (6-8), so
    # step 9 non-finite is the 4th in a row and stops at once, as the straight run did
    # (counted from 0 after the resume it would run on to step 12, 4 more).
    LLMC_TEST_PLANT_NAN=5+ run "log_${name}_again" "$out" "$np" "$bin" -x 12 -n 2 -nk 2 -y 1 "$@"
    rc=$?
    if [ $rc = 1 ] && grep -q "^resumed from $(ckpt "$out" 8): step 8" "$TMP/log_${name}_again" &&
       one_error "$TMP/log_${name}_again" "in 4 steps in a row, 6 to 9, more than --max-nonfinite-steps 3" \
           "the weights are those after step 5" && ! grep -qE '^step +10/' "$TMP/log_${name}_again" &&
       [ "$(checkpoints "$out")" = "checkpoint_00000004 checkpoint_00000006 checkpoint_00000008 " ]; then
        ok "$name: resumed from 8 and diverging again, it stops after step 9 (4 in a row across the resume)"
    else not_ok "$name: the resume that diverges again (exit $rc)" "$TMP/log_${name}_again"; fi
    if run "log_${name}_resumed" "$out" "$np" "$bin" -x 12 -n 2 -nk 2 -y 1 "$@" &&
       grep -q "^resumed from $(ckpt "$out" 8): step 8" "$TMP/log_${name}_resumed" &&
       [ -n "$(loss_at "$log" 9)" ] && [ "$(loss_at "$log" 9)" = "$(loss_at "$TMP/log_${name}_resumed" 9)" ] &&
       grep -qE '^step +12/12 ' "$TMP/log_${name}_resumed" && finite "$(ckpt "$out" 12)/model.bin"; then
        ok "$name: -y 1 resumes from step 8 (step 9's loss is the diverged run's) and finishes"
    else not_ok "$name: the resume" "$TMP/log_${name}_resumed"; fi
}

[ -x ./train_gpt2_plain ] || make -s train_gpt2_plain >/dev/null || fatal "build train_gpt2_plain"
diverged np2_zero1 2 ./train_gpt2 -z 1 --bucket-size 20000
diverged np1_plain 1 ./train_gpt2_plain
diverged np1_zero1 1 ./train_gpt2 -z 1
diverged np2_zero1_replicated 2 ./train_gpt2 -z 0
diverged np2_plain 2 ./train_gpt2_plain

# A NaN loss alone: the gradients stay finite, so only the loss check can skip the update.
if selected nan_loss; then
    LLMC_TEST_NAN_LOSS=5+ run log_nan_loss out_nan_loss 2 ./train_gpt2 -z 1 -x 12
    if [ $? = 1 ] && one_error "$TMP/log_nan_loss" "non-finite loss (loss nan, grad norm " "in 4 steps in a row, 6 to 9" &&
       [ "$(grep -c 'update skipped (non-finite loss)$' "$TMP/log_nan_loss")" = 4 ] &&
       [ "$(grep -cE '^s:[6-9] skp:1 zl:nan zn:nan nf:loss$' "$TMP/out_nan_loss/main.log")" = 4 ]; then
        ok "a NaN loss with finite gradients: skipped, and the stop names the loss"
    else not_ok "NaN loss" "$TMP/log_nan_loss"; fi
fi
if selected nan_loss_once; then
    ONCE=(1 ./train_gpt2 -z 1 -x 8 -n 8)
    run log_clean out_clean "${ONCE[@]}" || not_ok "clean run" "$TMP/log_clean"
    LLMC_TEST_NAN_LOSS=5 run log_nan_loss_once out_nan_loss_once "${ONCE[@]}" || not_ok "NaN loss run" "$TMP/log_nan_loss_once"
    LLMC_TEST_PLANT_NAN=5 run log_nan_grad_once out_nan_grad_once "${ONCE[@]}" || not_ok "NaN grad run" "$TMP/log_nan_grad_once"
    if cmp -s "$(ckpt out_nan_loss_once 8)/model.bin" "$(ckpt out_nan_grad_once 8)/model.bin" &&
       ! cmp -s "$(ckpt out_nan_loss_once 8)/model.bin" "$(ckpt out_clean 8)/model.bin" &&
       [ "$(grep -c 'update skipped' "$TMP/log_nan_loss_once")" = 2 ]; then
        ok "one NaN loss skips its update as a NaN gradient does (the same weights after step 8; a clean run differs)"
    else not_ok "one NaN loss" "$TMP/log_nan_loss_once"; fi
fi

if selected stop_at_once; then
    LLMC_TEST_PLANT_NAN=5 run log_at_once out_at_once 2 ./train_gpt2 -z 1 -x 12 --max-nonfinite-steps 0
    if [ $? = 1 ] && one_error "$TMP/log_at_once" "non-finite grad norm (loss " "at step 6, more than --max-nonfinite-steps 0" \
           "no checkpoint to resume from" && ! grep -qE '^step +7/' "$TMP/log_at_once"; then
        ok "--max-nonfinite-steps 0 stops at the first non-finite step"
    else not_ok "--max-nonfinite-steps 0" "$TMP/log_at_once"; fi
fi

# AdamW's v overflows on a gradient of 1e20 that --grad-clip 0 lets through (its norm and the
# loss are finite, and with --spike-norm-factor 0 not a spike, so the step is applied): the
# save of step 4 refuses it.
if selected v_overflow; then
    LLMC_TEST_GRAD_SPIKE=2:1e20 run log_v out_v 2 ./train_gpt2 -z 1 -x 6 -n 2 -nk 1 --grad-clip 0 --spike-norm-factor 0
    if [ $? = 1 ] && one_error "$TMP/log_v" "checkpoint of step 4 not saved: element 0 of h0.qkvb in AdamW's v is not finite" \
           "the earlier checkpoints are kept" && [ "$(checkpoints out_v)" = "checkpoint_00000002 " ] &&
       finite "$(ckpt out_v 2)"/{model,optimizer}.bin; then
        ok "a non-finite AdamW v is never saved: step 4's checkpoint refused, step 2's kept, no temporary"
    else not_ok "v overflow: left $(checkpoints out_v)" "$TMP/log_v"; fi
fi

# Checkpoints as an older build wrote them after a run diverged (the np 1 run's last, of step
# 12, edited, its manifest refreshed with ./test_crc32c).
if selected old_window old_nan; then
    [ -x ./test_crc32c ] || make -s test_crc32c >/dev/null || fatal "build test_crc32c"
fi
refresh_manifest() {
    ./test_crc32c "$1/model.bin" "$1/optimizer.bin" "$1/state.txt" |
        awk '{ n = split($3, part, "/"); print part[n], $2, $1 }' >"$1/manifest.txt"
}
old_checkpoint() {  # old_checkpoint OUT: a copy of out_np1_zero1's checkpoint of step 12 in OUT
    mkdir -p "$TMP/$1" && cp -r "$(ckpt out_np1_zero1 12)" "$TMP/$1/" && ckpt "$1" 12
}
if selected old_window; then
    d=$(old_checkpoint out_old_window) &&
        sed -i -E 's/^(loss_window [0-9]+:[0-9]+),[^,]+/\1,nan/; s/^(norm_window [0-9]+:[0-9]+),[^,]+,[^,]+/\1,inf,-nan/' "$d/state.txt" &&
        refresh_manifest "$d"
    if run log_old_window out_old_window 1 ./train_gpt2 -z 1 -x 14 -y 1 && grep -q "^resumed from $d" "$TMP/log_old_window" &&
       [ "$(grep -c '^warning: .*state.txt: field loss_window holds 1 non-finite values' "$TMP/log_old_window")" = 1 ] &&
       [ "$(grep -c '^warning: .*state.txt: field norm_window holds 2 non-finite values' "$TMP/log_old_window")" = 1 ] &&
       ! grep -q 'error:' "$TMP/log_old_window"; then
        ok "a window with NaN and inf from an older build: one warning per window, and the run resumes"
    else not_ok "old window" "$TMP/log_old_window"; fi
fi
if selected old_nan; then
    d=$(old_checkpoint out_old_nan) && printf '\x00\x00\xc0\x7f' | dd of="$d/model.bin" bs=1 seek=$((1024 + 4 * 5)) conv=notrunc 2>/dev/null &&
        refresh_manifest "$d"
    run log_old_nan out_old_nan 2 ./train_gpt2 -z 1 -x 14 -y 1 -b 1  # the saved run's tokens per step
    if [ $? = 1 ] && one_error "$TMP/log_old_nan" "$d/model.bin: element 5 of wte in the master weights is not finite" \
           "move $d away" && ! grep -qE '^step ' "$TMP/log_old_nan"; then
        ok "a checkpoint holding a NaN weight (an older build's) is refused at -y 1, naming it"
    else not_ok "old NaN checkpoint" "$TMP/log_old_nan"; fi
fi

done_testing
