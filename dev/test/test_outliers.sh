#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# -sl / -sg: skip an update whose loss or grad norm is an outlier (run/outliers.h).
#
# A small model (vocab 1000) learns a repeating token pattern; at 0-based step 30 a test
# hook (dev/test/seams.c) plants an outlier (LLMC_TEST_GRAD_SPIKE: one gradient element
# set to 1e4; LLMC_TEST_LOSS_SPIKE: every target the last token id). With
# --outlier-window 16 and a threshold of 3:
#   - the step line and main.log say the update of step 31 was skipped, once, and the
#     logged z-score equals the one computed here from main.log's last 16 norms;
#   - the checkpoints before and after that step hold the same weights, m and v (byte for
#     byte); without the flag the same spike changes them (the control);
#   - at np 2 under ZeRO-1 both ranks skip (their parameters are identical at the end);
#   - a run resumed from step 20 skips the same step and logs the straight run's losses
#     (the windows are saved in the checkpoint; with empty ones nothing would be skipped).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
small_model "$TMP" || fatal "the small model (build, oracle)"
pattern_shard "$TMP/pattern.bin" || fatal "the pattern shard"

# -sl/-sg alone: the spike detector (run/spikes.h), which would catch these too, is off.
COMMON=(-e "$TMP/m.bin" -i "$TMP/pattern.bin" -b 2 -t 32 -v 0 -s 0 -l 1e-3 --outlier-window 16
        --spike-loss-factor 0 --spike-norm-factor 0)
run() {  # [SPIKE=grad|loss] run NAME NP ARGS...: with SPIKE, that outlier planted at step 30
    local name=$1 np=$2 hook=(); shift 2
    [ "${SPIKE:-}" = grad ] && hook=(LLMC_TEST_GRAD_SPIKE=30)
    [ "${SPIKE:-}" = loss ] && hook=(LLMC_TEST_LOSS_SPIKE=30)
    env "${hook[@]}" timeout 300 "${MPIRUN[@]}" -np "$np" ./train_gpt2 "${COMMON[@]}" -o "$TMP/out_$name" "$@" \
        >"$TMP/log_$name" 2>&1
}
# same_state NAME: the checkpoints after steps 30 and 31 hold the same weights, m and v.
same_state() {
    local a=$TMP/out_$1/checkpoint_00000030 b=$TMP/out_$1/checkpoint_00000031
    cmp -s "$a/model.bin" "$b/model.bin" && cmp -s <(tail -c +1025 "$a/optimizer.bin") <(tail -c +1025 "$b/optimizer.bin")
}
skips() { grep -c "update skipped" "$TMP/log_$1"; }

for spec in "grad:-sg 3" "loss:-sl 3"; do
    IFS=: read -r kind args <<<"$spec"
    # shellcheck disable=SC2086  # $args: the flags, split on purpose
    if SPIKE=$kind run "$kind" 1 -x 31 -n 1 -nk 2 $args && [ "$(grep -c "^step 31: update skipped" "$TMP/log_$kind")" = 1 ] &&
       [ "$(skips "$kind")" = 2 ] && same_state "$kind"; then
        ok "a $kind outlier at step 31: the update is skipped (weights, m, v unchanged), once"
    else not_ok "$kind outlier skip" "$TMP/log_$kind"; fi
done
if SPIKE=grad run control 1 -x 31 -n 1 -nk 2 && [ "$(skips control)" = 0 ] && ! same_state control; then
    ok "control: without -sg the same spike updates the weights"
else not_ok "control" "$TMP/log_control"; fi
if indented $PY - "$TMP/out_grad/main.log" <<'PYEOF'
import sys
norms, z_logged = {}, None
for line in open(sys.argv[1]):
    f = dict(x.split(":", 1) for x in line.split())
    if "norm" in f: norms[int(f["s"])] = float(f["norm"])
    if "skp" in f: z_logged = (int(f["s"]), float(f["zn"]))
assert z_logged and z_logged[0] == 31, z_logged
window = [norms[s] for s in range(15, 31)]
mean = sum(window) / 16
std = (sum((x - mean) ** 2 for x in window) / 16) ** 0.5
z = (norms[31] - mean) / std
assert abs(z - z_logged[1]) <= 1e-4 * abs(z), (z, z_logged)
print(f"z-score {z_logged[1]} (recomputed {z:.6g})")
PYEOF
then ok "the logged z-score is the norm's against the 16 before it"; else not_ok "z-score"; fi

if SPIKE=grad run zero1 2 -x 31 -n 1 -nk 2 -z 1 --bucket-size 20000 -sg 3 && [ "$(skips zero1)" = 2 ] &&
   same_state zero1 && grep -q "parameters identical on all 2 ranks: yes" "$TMP/log_zero1"; then
    ok "np 2, ZeRO-1: both ranks skip the same update"
else not_ok "np 2 ZeRO-1 skip" "$TMP/log_zero1"; fi

RESUME=(-x 36 -n 20 -sg 3)
mkdir -p "$TMP/out_resumed"
if SPIKE=grad run straight 1 "${RESUME[@]}" && cp -r "$TMP/out_straight/checkpoint_00000020" "$TMP/out_resumed/" &&
   SPIKE=grad run resumed 1 "${RESUME[@]}" -y 1 && [ "$(skips resumed)" = 2 ] &&
   diff <(grep -o "^s:[0-9]* trl:[^ ]* norm:[^ ]*" "$TMP/out_straight/main.log" | sed -n '21,$p') \
        <(grep -o "^s:[0-9]* trl:[^ ]* norm:[^ ]*" "$TMP/out_resumed/main.log") >"$TMP/diff"; then
    ok "resumed at step 20: the same skip at step 31 and the straight run's losses and norms"
else not_ok "resume with the windows" "$TMP/log_resumed"; diag "$(head -5 "$TMP/diff" 2>/dev/null)"; fi
done_testing
