#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# The HellaSwag-style eval (-H 1; run/eval.h) of ./train_gpt2:
#   1. the small set prepro_text builds from tinyshakespeare, read by an independent Python
#      reader (dev/test/hellaswag_oracle.py): every context + right completion is in the
#      text, and the Python writer reproduces the C tool's file byte for byte;
#   2. every item's 4 completion losses against the PyTorch oracle within 1e-5, the
#      predictions and the accuracy exactly, at np 1 (B 4) and np 2 (B 3: an item's rows
#      split over forwards); the accuracy line on stdout and "s:0 eval:A" in main.log;
#   3. a planted set (one item the random model gets wrong, its right completion at each
#      of the 4 places, labelled so): 0/4 at step 0, 4/4 after 10 steps on that item's
#      text (-a 1), which a wrong argmin or label check cannot pass; the run is resumed
#      from a checkpoint at step 5 and main.log holds each eval once;
#   4. bad files: missing, wrong magic, truncated, an item longer than -t, label 4, and
#      llm.c's "-h 1": one error each, exit 1, also at np 2.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
BIN=./train_gpt2
source dev/test/expect_error.sh   # TMP and the bad-input fixtures
[ -x $BIN ] && [ -x ./prepro_text ] || fatal "$BIN and ./prepro_text are built"
DATA_DIR=${LLMC_DATA_DIR:-dev/data}
t0=$SECONDS

# ---- 1. the small set and the oracle's files ----
./prepro_text --input "$DATA_DIR/tinyshakespeare/input.txt" --out-dir "$TMP/data" >"$TMP/prepro.log" 2>&1 ||
    fatal "prepro_text" "$TMP/prepro.log"
SET=$TMP/data/tinyshakespeare_hellaswag.bin
if timeout 120 $PY dev/test/hellaswag_oracle.py prepare --eval "$SET" --out-dir "$TMP" \
    --encoder "$DATA_DIR/gpt2/encoder.json" --input "$DATA_DIR/tinyshakespeare/input.txt" >"$TMP/oracle.log" 2>&1; then
    ok "$(head -n 1 "$TMP/oracle.log" | cut -c 19-)"
else
    fatal "the oracle prepares the set" "$TMP/oracle.log"
fi
ORACLE_ACC=$(sed -n 's/^hellaswag_oracle: random model accuracy \([0-9.]*\) (\([0-9/]*\)).*/\1 (\2)/p' "$TMP/oracle.log")

# ---- 2. against the oracle, np 1 and np 2 ----
RUN=(-e "$TMP/model.bin" -i "$TMP/planted_train.bin" -t 64 -x 0 -v 0 -s 0 -H 1 --hellaswag-file "$SET")
for np in 1 2; do
    b=$((np == 1 ? 4 : 3))
    log=$TMP/eval_np$np.log
    if [ $np = 1 ]; then
        timeout 120 $BIN "${RUN[@]}" -b $b --hellaswag-dump "$TMP/dump_np$np.txt" -o "$TMP/out_np$np" >"$log" 2>&1
    else
        timeout 120 "${MPIRUN[@]}" -np $np $BIN "${RUN[@]}" -b $b --hellaswag-dump "$TMP/dump_np$np.txt" >"$log" 2>&1
    fi
    rc=$?
    line=$(grep '^step 0: hellaswag accuracy' "$log")
    if [ $rc = 0 ] && res=$(dev/test/hellaswag_compare.sh "$TMP/dump_np$np.txt" "$TMP/oracle_dump.txt" 1e-5 40) && [ "$line" = "step 0: hellaswag accuracy $ORACLE_ACC" ]; then
        ok "np $np, B $b: $res; '$line' as the oracle"
    else
        not_ok "np $np, B $b (exit $rc): ${res:-no dump}; '$line', oracle accuracy $ORACLE_ACC" "$log"
    fi
done
want_log="s:0 eval:${ORACLE_ACC%% *}"
if grep -qx "$want_log" "$TMP/out_np1/main.log"; then ok "main.log: '$want_log'"; else not_ok "main.log lacks '$want_log'" "$TMP/out_np1/main.log"; fi

# ---- 3. the planted set: the label and argmin logic; a resume logs each eval once ----
# 5 steps with a checkpoint, then a resume to step 10 (-y 1): main.log must hold the evals
# of steps 0, 5 (dropped and logged again by the resumed run) and 10, once each.
# (At -l 1e-2 on one batch, step 3's grad norm is 19.5x the median before it: a spike that
# the detector would skip at every later step, the batch being the same; its norm check is
# off here, run/spikes.h.)
PLANTED=(-e "$TMP/model.bin" -i "$TMP/planted_train.bin" -j "$TMP/planted_train.bin" --allow-train-val-overlap -m 1 -b 1 -t 64 -a 1 -l 1e-2
         -v 5 -s 0 -n 5 -H 1 --hellaswag-file "$TMP/planted.bin" -o "$TMP/planted" --spike-norm-factor 0)
timeout 120 $BIN "${PLANTED[@]}" -x 5 >"$TMP/planted.log" 2>&1 &&
    timeout 120 $BIN "${PLANTED[@]}" -x 10 -y 1 >>"$TMP/planted.log" 2>&1
rc=$?
evals=$(grep ' eval:' "$TMP/planted/main.log" | tr '\n' ' ')
if [ $rc = 0 ] && [[ $evals =~ ^s:0\ eval:0.0000\ s:5\ eval:[01].[0-9]{4}\ s:10\ eval:1.0000\ $ ]]; then
    ok "planted item: $evals(0/4 untrained, 4/4 after overfitting its right completion; resumed at 5)"
else
    not_ok "planted item (exit $rc): main.log has '$evals', expected 's:0 eval:0.0000 s:5 eval:A s:10 eval:1.0000'" "$TMP/planted.log"
fi

# ---- 4. bad files ----
BASE=("${RUN[@]}" -b 4)
expect_error missing 1 "$TMP/nope.bin" "does not exist" "hellaswag.py" -- --hellaswag-file "$TMP/nope.bin"
expect_error bad_magic 1 "bad_magic.bin" "bad magic 20240520" -- --hellaswag-file "$TMP/bad_magic.bin"
expect_error truncated 1 "bad_cut.bin" "truncated: item 39" -- --hellaswag-file "$TMP/bad_cut.bin"
expect_error too_long 1 "bad_long.bin" "item 5" "-t is 64" -- --hellaswag-file "$TMP/bad_long.bin"
expect_error bad_label 2 "bad_label.bin" "item 3: label 4" -- --hellaswag-file "$TMP/bad_label.bin"
# llm.c's spelling, -h 1, runs the same eval (a bare -h is the help).
timeout 120 $BIN "${RUN[@]/#-H/-h}" -b 4 --hellaswag-dump "$TMP/dump_h.txt" >"$TMP/eval_h.log" 2>&1
if cmp -s "$TMP/dump_h.txt" "$TMP/dump_np1.txt"; then ok "-h 1 (llm.c's flag) is -H 1"
else not_ok "-h 1 did not run the eval as -H 1" "$TMP/eval_h.log"; fi

note "test_hellaswag: $((SECONDS - t0)) s"
done_testing
