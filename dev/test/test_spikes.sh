#!/usr/bin/env bash
# test: timeout=240 lane=cpu tier=fast,full
# The loss-spike detector (run/spikes.h), on by default, on the demo's model (-e d2, B=4,
# T=64, tinyshakespeare):
#   l10_stops     -l 10 -u 10 at np 2: step 1's update (lr 1.0) blows the model up, steps 2-5
#                 spike and are skipped, and the run stops after step 5 with one error on
#                 every rank (exit 1), saying no checkpoint predates the spikes
#   named         -l 10 -u 100 -n 1 -nk 1: steps 3-6 spike; the error names checkpoint 1, the
#                 last one a good step measured; -nk 1 has kept it beside the newest (5);
#                 resumed from 5 (in mid-streak), step 6 stops it again at once;
#                 the documented recovery (move 5 out, -y 1 --allow-resume-change with a
#                 lower -l) resumes from 1 and trains on without a spike
#   one_spike     a grad-norm spike planted at step 5 (LLMC_TEST_GRAD_SPIKE=4:1e3): that
#                 update alone is skipped (checkpoints 4 and 5 hold the same weights), the run
#                 goes on and finishes (exit 0)
#   demo_clean    the demo's settings (-l 1e-3 -u 10 -q 0.1 -c 0.1), 8 steps: no spike
#   reference     each run's main.log replayed by dev/test/spike_reference.py (an independent
#                 Python re-implementation of the rule): the same spike steps, what spiked,
#                 the ratios, the stop; the re-implementation itself checked on a hand-worked
#                 sequence
#   bad_factor    --spike-loss-factor 1 is refused (a factor must be 0 or above 1)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
fast_rows l10_stops l10_stops/2 one_spike bad_factor/1
make -s train_gpt2 USE_ZERO1=1 >/dev/null || fatal "build"

BIN=./train_gpt2
BASE=(-e d2 -i data/tinyshakespeare_train.bin -b 4 -t 64 -v 0 -s 0)
DEFAULTS=(2 10 16 3)  # --spike-loss-factor, --spike-norm-factor, --spike-window, --max-spike-steps
run() {  # [ENV=value ...] run LOG OUT NP ARGS...: output in $TMP/LOG.log, -o $TMP/OUT
    local log=$1 out=$2 np=$3
    shift 3
    timeout 120 "${MPIRUN[@]}" -np "$np" $BIN "${BASE[@]}" -o "$TMP/$out" "$@" >"$TMP/$log.log" 2>&1
}
checkpoints() { (cd "$TMP/$1" && ls -d checkpoint_* | tr '\n' ' '); }
# replayed NAME: the Python rule agrees with the trainer over NAME's main.log.
replayed() { check "$1: main.log replayed by spike_reference.py agrees" $PY dev/test/spike_reference.py check \
    "$TMP/$1/main.log" "${DEFAULTS[@]}"; }

if selected l10_stops; then
    expect_error l10_stops 2 "loss spike: 4 spike steps in 4 steps in a row, 2 to 5, more than --max-spike-steps 3" \
        "no checkpoint holds weights from before the spikes began" -- -l 10 -u 10 -x 20 -o "$TMP/l10"
    check_match "l10_stops: step 2 was skipped as a spike" '^step +2/20 .*\| update skipped \(loss( and grad norm)? spike\)$' \
        "$TMP/l10_stops.np2.log"
    replayed l10
fi

if selected named; then
    run named named 1 -l 10 -u 100 -x 40 -n 1 -nk 1
    rc=$?
    if [ $rc = 1 ] && [ "$(grep -c 'error:' "$TMP/named.log")" = 1 ] &&
       grep 'error:' "$TMP/named.log" | grep -qF "in 4 steps in a row, 3 to 6, more than --max-spike-steps 3" &&
       grep 'error:' "$TMP/named.log" | grep -qF "the last checkpoint before the spikes began is $TMP/named/checkpoint_00000001" &&
       [ "$(checkpoints named)" = "checkpoint_00000001 checkpoint_00000005 " ] &&
       grep -qx 'spike_vouched_checkpoint 1' "$TMP/named/checkpoint_00000005/state.txt" &&
       grep -qx 'spike_streak_steps 3' "$TMP/named/checkpoint_00000005/state.txt"; then
        ok "named: stops after step 6 naming checkpoint 1, which -nk 1 kept beside 5 (exit 1)"
    else not_ok "named: the stop (exit $rc; left $(checkpoints named))" "$TMP/named.log"; fi
    replayed named
    # Resumed from 5, saved in mid-streak (3 spikes), step 6 spikes again: the 4th stops at
    # once, as in the straight run (the streak and the history come from state.txt).
    run named_again named 1 -l 10 -u 100 -x 40 -n 1 -nk 1 -y 1
    rc=$?
    if [ $rc = 1 ] && grep -q "^resumed from $TMP/named/checkpoint_00000005: step 5" "$TMP/named_again.log" &&
       grep 'error:' "$TMP/named_again.log" | grep -qF "in 4 steps in a row, 3 to 6, more than --max-spike-steps 3" &&
       grep -qF "checkpoint_00000001" <(grep 'error:' "$TMP/named_again.log") && ! grep -qE '^step +7/' "$TMP/named_again.log"; then
        ok "named: resumed in mid-streak from 5, step 6 stops it again (the streak and history were saved)"
    else not_ok "named: the resume in mid-streak (exit $rc)" "$TMP/named_again.log"; fi
    mkdir -p "$TMP/moved" && mv "$TMP/named/checkpoint_00000005" "$TMP/moved/"
    if run named_resumed named 1 -l 1e-3 -u 100 -x 6 -n 3 -y 1 --allow-resume-change &&
       grep -q "^resumed from $TMP/named/checkpoint_00000001: step 1" "$TMP/named_resumed.log" &&
       grep -qE '^step +6/6 ' "$TMP/named_resumed.log" && ! grep -q 'update skipped' "$TMP/named_resumed.log"; then
        ok "named: the recovery resumes from checkpoint 1 with a lower -l and trains on without a spike"
    else not_ok "named: the recovery" "$TMP/named_resumed.log"; fi
fi

if selected one_spike; then
    same_weights() { cmp -s "$TMP/one_spike/checkpoint_0000000$1/model.bin" "$TMP/one_spike/checkpoint_0000000$2/model.bin"; }
    if LLMC_TEST_GRAD_SPIKE=4:1e3 run one_spike one_spike 1 -l 1e-3 -u 10 -q 0.1 -c 0.1 -x 6 -n 1 -nk 3 &&
       [ "$(grep -c 'update skipped' "$TMP/one_spike.log")" = 2 ] &&
       grep -qE '^step +5/6 .*\| update skipped \(grad norm spike\)$' "$TMP/one_spike.log" &&
       grep -q '^step 5: update skipped: grad norm spike: .* 1 of the 1 steps of this streak spiked' "$TMP/one_spike.log" &&
       grep -qx 's:5 skp:1 zl:nan zn:nan spk:norm rl:[0-9.e+-]* rn:[0-9.e+-]*' "$TMP/one_spike/main.log" &&
       same_weights 4 5 && ! same_weights 5 6; then
        ok "one_spike: step 5's update alone is skipped (weights after 4 and 5 equal), step 6 trains, exit 0"
    else not_ok "one_spike" "$TMP/one_spike.log"; fi
    replayed one_spike
fi

if selected demo_clean; then
    if run demo_clean demo_clean 1 -l 1e-3 -u 10 -q 0.1 -c 0.1 -x 8 && ! grep -q 'update skipped' "$TMP/demo_clean.log"; then
        ok "demo_clean: 8 steps of the demo's settings, no spike"
    else not_ok "demo_clean" "$TMP/demo_clean.log"; fi
    replayed demo_clean
fi

# The re-implementation on a sequence worked by hand (F 2, G 10, W 3, N 1):
#   step 1  loss 10  norm 1     no history: good           history L {10}      N {1}
#   step 2  loss 8   norm 2     8/10, 2/1: good                    {10,8}        {1,2}
#   step 3  loss 9   norm 30    median N 1.5: 30/1.5 = 20 > 10: a norm spike (1 in the streak)
#   step 4  loss 20  norm 2     median L 9: 20/9 = 2.22 > 2: a loss spike (2 > N 1): stop
if selected reference; then
    printf 's:%s trl:%s norm:%s lr:1e-3 ms:1\n' 1 10 1 2 8 2 3 9 30 4 20 2 >"$TMP/hand.log"
    printf 's:3 skp:1 zl:nan zn:nan spk:norm rl:%s rn:%s\ns:4 skp:1 zl:nan zn:nan spk:loss rl:%s rn:%s\n' \
        "$(echo '9/9' | bc -l)" 20 "$(echo '20/9' | bc -l)" "$(echo '2/1.5' | bc -l)" >>"$TMP/hand.log"
    check "reference: the hand-worked sequence (a norm spike at 3, a loss spike at 4, stop at 4)" \
        $PY dev/test/spike_reference.py check "$TMP/hand.log" 2 10 3 1
    check_match "reference: it stops at step 4" '^stop 4$' <($PY dev/test/spike_reference.py check "$TMP/hand.log" 2 10 3 1)
fi

expect_error bad_factor 1 "--spike-loss-factor 1: use 0 (off) or a factor above 1" -- --spike-loss-factor 1 -x 1
done_testing
