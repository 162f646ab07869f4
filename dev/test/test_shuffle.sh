#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# --shuffle: the train data's order per epoch from --seed, and resumes that read exactly the
# rows the straight run read, at another rank count (the same global batch).
#
# Three shards of random tokens (700, 600 and 900 tokens: 21, 18 and 28 rows of T=32, so
# with 4 rows a step they give 5, 4 and 7 steps, 64 rows: the epoch is 16 steps). Every
# run writes the rows it reads (LLMC_TEST_DATA_TRACE, "epoch shard row" per row and rank).
#   A  np 1, -b 4, 20 steps from scratch, checkpoints every 6 steps
#   B  np 2, -b 2      resumed from A's checkpoint at step 12
#   C  np 4, -b 1      resumed from it too
#   D  np 2, -b 1, 2 micro-steps (-d 128) resumed from it too
#   F  np 1, -b 4 without --shuffle (file order)
# Asserts: A reads, per epoch and shard, distinct rows (the whole steps that fit), not in
# file order, in another order in epoch 2, and F reads in file order; B, C and D read, step
# by step, exactly A's rows (every rank its own, none twice), and their losses equal A's
# (to 2e-5: only the order of the sums over ranks differs); the epoch boundary at step 17
# is printed and logged once; a resume that changes --shuffle or its --seed is refused.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
small_model "$TMP" || fatal "the small model (build, oracle)"
random_shards "$TMP" || fatal "the random shards"

COMMON=(-e "$TMP/m.bin" -i "$TMP/shard_*.bin" -t 32 -x 20 -v 0 -s 0 -l 1e-3 -z 1 --seed 5)
run() {  # run NAME NP OUT ARGS...: one training run with its row trace
    local name=$1 np=$2 out=$3; shift 3
    LLMC_TEST_DATA_TRACE="$TMP/trace_$name" timeout 300 "${MPIRUN[@]}" -np "$np" ./train_gpt2 "${COMMON[@]}" \
        -o "$out" "$@" >"$TMP/log_$name" 2>&1
}
resume_from_a() {  # resume_from_a NAME NP ARGS...: from A's checkpoint at step 12
    local name=$1 np=$2; shift 2
    mkdir -p "$TMP/out_$name"
    cp -r "$TMP/out_A/checkpoint_00000012" "$TMP/out_A/main.log" "$TMP/out_$name/"
    run "$name" "$np" "$TMP/out_$name" -y 1 "$@"
}

if run A 1 "$TMP/out_A" -b 4 -n 6 --shuffle; then ok "straight run A (np 1, -b 4, --shuffle)"
else not_ok "straight run A" "$TMP/log_A"; fi
for spec in "B 2 -b 2" "C 4 -b 1" "D 2 -b 1 -d 128"; do
    read -r name np args <<<"$spec"
    # shellcheck disable=SC2086  # $args: the flags, split on purpose
    if resume_from_a "$name" "$np" --shuffle $args; then ok "run $name resumed at step 12 (np $np, $args)"
    else not_ok "run $name" "$TMP/log_$name"; fi
done
if run F 1 "$TMP/out_F" -b 4 -x 6; then ok "run F (np 1, file order)"; else not_ok "run F" "$TMP/log_F"; fi

# The rows each step read, and the losses, against A's.
if indented $PY - "$TMP" <<'PYEOF'
import sys
w = sys.argv[1]
def reads(name, rank):
    return [tuple(map(int, l.split())) for l in open(f"{w}/trace_{name}.rank{rank}")]
def steps(name, ranks, rows_per_rank, first_step):
    per_rank = [reads(name, r) for r in range(ranks)]
    out = {}
    for k in range(len(per_rank[0]) // rows_per_rank):
        rows = [x for r in per_rank for x in r[k * rows_per_rank:(k + 1) * rows_per_rank]]
        assert len(set(rows)) == len(rows), (name, "a row read twice in step", first_step + k)
        out[first_step + k] = set(rows)
    return out
def losses(name):
    return {int(l.split()[0][2:]): float(l.split()[1][4:]) for l in open(f"{w}/out_{name}/main.log")
            if " trl:" in l}
a = steps("A", 1, 4, 1)
assert sorted(a) == list(range(1, 21)), sorted(a)
# Per epoch and shard: distinct rows, as many as the whole steps that fit (20, 16, 28 of 21, 18, 28).
seq = reads("A", 0)
for epoch in (0,):
    for shard, used in ((0, 20), (1, 16), (2, 28)):
        rows = [r for e, s, r in seq if e == epoch and s == shard]
        assert len(rows) == used and len(set(rows)) == used, (epoch, shard, len(rows), len(set(rows)))
        assert rows != sorted(rows), ("epoch 0 reads shard", shard, "in file order")
assert {e for e, s, r in seq[:64]} == {0} and {e for e, s, r in seq[64:]} == {1}, "epoch 1 should begin at row 64"
s1 = seq[64][1]
e0 = [r for e, s, r in seq if e == 0 and s == s1][:16]
e1 = [r for e, s, r in seq if e == 1 and s == s1]
assert e1 != e0[:len(e1)], "epoch 2 reads its first shard in epoch 1's order"
f = reads("F", 0)
assert f == [(0, 0, r) for r in range(20)] + [(0, 1, r) for r in range(4)], ("file order", f)
la = losses("A")
for name, ranks, rows in (("B", 2, 2), ("C", 4, 1), ("D", 2, 2)):
    got = steps(name, ranks, rows, 13)
    assert sorted(got) == list(range(13, 21)), (name, sorted(got))
    for s in got:
        assert got[s] == a[s], (name, "step", s, "read other rows than the straight run")
    lg = losses(name)
    for s in range(13, 21):
        assert abs(lg[s] - la[s]) <= 2e-5 * abs(la[s]), (name, s, lg[s], la[s])
print("steps 13..20 read the straight run's rows at np 2, 4 and 2 x 2 micro-steps; losses equal")
PYEOF
then ok "resumed runs read exactly the straight run's rows, step by step; shuffled per epoch; F in file order"
else not_ok "row traces"; fi

if [ "$(grep -c "^epoch 2 of the train data began with step 17$" "$TMP/log_A")" = 1 ] &&
   [ "$(grep -c "^s:17 epoch:1$" "$TMP/out_A/main.log")" = 1 ] &&
   [ "$(grep -c "epoch:" "$TMP/out_B/main.log")" = 1 ]; then
    ok "the epoch boundary is printed and logged once (also after a resume)"
else not_ok "epoch boundary" "$TMP/out_A/main.log"; fi

for spec in "shuffle:--shuffle 1 -> 0:-b 4" "seed:--seed (which sets the --shuffle order) 5 -> 6:-b 4 --shuffle --seed 6"; do
    IFS=: read -r name want args <<<"$spec"
    # shellcheck disable=SC2086  # $args: the flags, split on purpose
    resume_from_a "refused_$name" 1 $args
    rc=$?
    if [ $rc -ne 0 ] && [ "$(grep -c "^error: resume: .*$want" "$TMP/log_refused_$name")" = 1 ]; then
        ok "a resume that changes --$name is refused"
    else not_ok "resume changing --$name (rc=$rc)" "$TMP/log_refused_$name"; fi
done
done_testing
