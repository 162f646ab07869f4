#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# --skip-batches A-B (run/skip_batches.h): the steps from A on read what the straight run's
# steps from B+1 on read, at any rank count, with --shuffle and in file order, across an
# epoch; the skip is recorded in checkpoints, so a resume continues it and a requeued job
# that repeats the flag does not skip twice; a resume past step A without it is refused.
#
# test_shuffle.sh's three shards of random tokens (21, 18 and 28 rows of T=32; with 4 rows a
# step the --shuffle epoch is 16 steps). Every run writes the rows it reads
# (LLMC_TEST_DATA_TRACE, "epoch shard row" per row and rank).
#   S   np 1, -b 4, 22 steps, --shuffle, checkpoints every 6        the straight run
#   K   np 2, -b 2, --shuffle --skip-batches 5-10, 14 steps         steps 5-14 = S's 11-20 (an epoch boundary)
#   SF  np 1, -b 4, file order, 9 steps; KF np 2 -b 1 -d 128 (2 micro-steps) --skip-batches 2-4: steps 2-6 = SF's 5-9
#   R   np 1 for 3 steps, then resumed at np 2 with K's flags: K's rows and losses (2e-5), the
#       range in checkpoints 6 on; the same command again with -x 16: no second skip, steps
#       15-16 = S's 21-22
# and refusals: a resume from S's checkpoint 6 (no skip) naming steps 5-10; one from R's
# checkpoint 12 naming 6-8, inside its 5-10; a range past one epoch of the data; bad values.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
[ -x ./test_crc32c ] || fatal "./test_crc32c is built"
small_model "$TMP" || fatal "the small model (build, oracle)"
random_shards "$TMP" || fatal "the random shards"

COMMON=(-e "$TMP/m.bin" -i "$TMP/shard_*.bin" -t 32 -d 128 -v 0 -s 0 -l 1e-3 -z 1 --seed 5)
run() {  # run NAME NP ARGS...: one training run with its row trace, output in $TMP/out_NAME
    local name=$1 np=$2; shift 2
    LLMC_TEST_DATA_TRACE="$TMP/trace_$name" timeout 300 "${MPIRUN[@]}" -np "$np" ./train_gpt2 "${COMMON[@]}" \
        -o "$TMP/out_$name" "$@" >>"$TMP/log_$name" 2>&1
}
ran() {  # ran NAME NP ARGS...: run, and its check
    local name=$1 np=$2; shift 2
    if run "$name" "$np" "$@"; then ok "run $name (np $np, $*)"; else not_ok "run $name (np $np, $*)" "$TMP/log_$name"; fi
}
ran S 1 -b 4 -x 22 -n 6 --shuffle
ran K 2 -b 2 -x 14 --shuffle --skip-batches 5-10
ran SF 1 -b 4 -x 9
ran KF 2 -b 1 -x 6 --skip-batches 2-4
ran R 1 -b 4 -x 3 -n 3 --shuffle
ran R 2 -b 2 -x 14 -n 3 -y 1 --shuffle --skip-batches 5-10
cp "$TMP/log_R" "$TMP/log_R_first"
: >"$TMP/log_R"
ran R 2 -b 2 -x 16 -n 3 -y 1 --shuffle --skip-batches 5-10  # a requeued job: the same flag, a later checkpoint

# The rows each step read and the losses, against the straight runs'.
if indented $PY - "$TMP" <<'PYEOF'
import sys
w = sys.argv[1]
def reads(name, rank):
    return [tuple(map(int, l.split())) for l in open(f"{w}/trace_{name}.rank{rank}")]
def steps(name, ranks, per_rank, skip=0, first=1):
    """{step: set of (epoch, shard, row)}: each rank's trace (past its first skip rows) in
    steps of per_rank rows."""
    traces = [reads(name, r)[skip if r == 0 else 0:] for r in range(ranks)]
    return {first + k: {x for t in traces for x in t[k * per_rank:(k + 1) * per_rank]}
            for k in range(len(traces[-1]) // per_rank)}
def losses(name):
    return {int(l.split()[0][2:]): float(l.split()[1][4:]) for l in open(f"{w}/out_{name}/main.log") if " trl:" in l}
def expect(what, got, want):
    if got != want:
        print(f"FAIL {what}: {got} != {want}")
        sys.exit(1)
    print(f"  ok   {what}")
S, K = steps("S", 1, 4), steps("K", 2, 2)
expect("S read 22 steps of 4 distinct rows", sorted(len(r) for r in S.values()), [4] * 22)
expect("K steps 1-4 read S's steps 1-4", [K[s] for s in range(1, 5)], [S[s] for s in range(1, 5)])
expect("K steps 5-14 read S's steps 11-20 (np 2, --shuffle, across the epoch boundary)",
       [K[s] for s in range(5, 15)], [S[s] for s in range(11, 21)])
assert len({e for s in range(11, 21) for e, _, _ in S[s]}) == 2, "the skip did not cross an epoch"
SF, KF = steps("SF", 1, 4), steps("KF", 2, 2)
expect("KF (file order, np 2 x 2 micro-steps) steps 1, 2-6 read SF's 1, 5-9", [KF[s] for s in range(1, 7)],
       [SF[1]] + [SF[s] for s in range(5, 10)])
# R's first run (np 1, 3 steps) wrote 12 rows to rank 0's trace; the resumed runs appended.
resumed = steps("R", 2, 2, skip=12, first=4)
expect("R resumed at step 3 on np 2: steps 4-14 read K's", [resumed[s] for s in range(4, 15)],
       [K[s] for s in range(4, 15)])
expect("R requeued with the same flag from checkpoint 14: steps 15-16 read S's 21-22, no second skip",
       [resumed[s] for s in (15, 16)], [S[21], S[22]])
lk, lr = losses("K"), losses("R")
worst = max(abs(lk[s] - lr[s]) for s in range(1, 15))
if worst > 2e-5:
    print(f"FAIL R's losses against K's: max difference {worst:.2e} > 2e-5")
    sys.exit(1)
print(f"  ok   R's losses equal K's, steps 1-14 (max difference {worst:.1e}, within 2e-5)")
PYEOF
then ok "the rows and losses of the skipping runs"; else not_ok "the rows and losses of the skipping runs"; fi

# The record: checkpoints from 6 on hold the range, 3 none; the requeued run said nothing.
rec() { sed -n 's/^skipped_batches //p' "$TMP/out_R/checkpoint_$(printf %08d "$1")/state.txt"; }
if [ "$(rec 3)" = none ] && [ "$(rec 6)" = 5-10 ] && [ "$(rec 16)" = 5-10 ] &&
    [ "$(grep -c '^data: --skip-batches 5-10: moved past 6 optimizer steps of data (768 tokens)' "$TMP/log_R_first")" = 1 ] &&
    [ "$(grep -c '^data: --skip-batches' "$TMP/log_R")" = 0 ]; then
    ok "state.txt: skipped_batches none at step 3, 5-10 at 6 and 16; one skip line, none in the requeued run"
else
    not_ok "the record: checkpoint 3 '$(rec 3)', 6 '$(rec 6)', 16 '$(rec 16)'" "$TMP/log_R"
fi

# A checkpoint of an earlier version (no skipped_batches line) resumes, as having skipped none.
mkdir -p "$TMP/out_old" && cp -r "$TMP/out_S/checkpoint_00000006" "$TMP/out_old/"
ck=$TMP/out_old/checkpoint_00000006
sed -i '/^skipped_batches /d' "$ck/state.txt"
./test_crc32c "$ck/model.bin" "$ck/optimizer.bin" "$ck/state.txt" | awk '{ n = split($3, p, "/"); print p[n], $2, $1 }' >"$ck/manifest.txt"
if run old 1 -b 4 -x 8 -n 8 -y 1 --shuffle --skip-batches 7-8 && grep -q '^resumed from' "$TMP/log_old" &&
    [ "$(sed -n 's/^skipped_batches //p' "$TMP/out_old/checkpoint_00000008/state.txt")" = 7-8 ]; then
    ok "a checkpoint without skipped_batches resumes; --skip-batches 7-8 after it is recorded"
else
    not_ok "resume from a checkpoint without skipped_batches" "$TMP/log_old"
fi

# refused NAME KEYWORD ARGS...: one error line naming KEYWORD, exit 1.
refused() {
    local name=$1 keyword=$2; shift 2
    timeout 60 ./train_gpt2 "${COMMON[@]}" -b 4 "$@" >"$TMP/$name.log" 2>&1
    local rc=$?
    if [ $rc = 1 ] && [ "$(grep -c '^error: ' "$TMP/$name.log")" = 1 ] && grep -qF -- "$keyword" "$TMP/$name.log"; then
        ok "$name: $(grep '^error: ' "$TMP/$name.log" | sed "s|$TMP/||g" | cut -c1-150)"
    else
        not_ok "$name: exit $rc, not one error naming '$keyword'" "$TMP/$name.log"
    fi
}
mkdir -p "$TMP/out_Q" && cp -r "$TMP/out_S/checkpoint_00000006" "$TMP/out_Q/"
refused resume_past_the_range "--skip-batches 5-10: $TMP/out_Q/checkpoint_00000006 is at step 6, past step 5, and the run that saved it did not skip those batches" \
    -x 12 -y 1 --shuffle --skip-batches 5-10 -o "$TMP/out_Q"
refused range_zero "--skip-batches expects A-B or A" -x 5 --skip-batches 0-2
refused range_reversed "got '6-5'" -x 8 --skip-batches 6-5
refused range_text "got '3-x'" -x 8 --skip-batches 3-x
refused with_overfit "-a 1 trains on one batch only" -x 8 -a 1 --skip-batches 2
refused beyond_the_run "the run ends at step 8 (-x), before step 9" -x 8 --skip-batches 9-12
refused past_the_data "more than one epoch of -i holds" -x 8 --skip-batches 1-2147483647
# A part of the range that R's checkpoints record: named as inside it, not as "did not skip".
mkdir -p "$TMP/out_P" && cp -r "$TMP/out_R/checkpoint_00000012" "$TMP/out_P/" 2>/dev/null
refused subrange_of_skipped "--skip-batches 6-8 lies inside 5-10, which the run that saved" \
    -x 16 -y 1 --shuffle --skip-batches 6-8 -o "$TMP/out_P"

done_testing
