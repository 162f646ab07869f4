#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# The GPT-2 124M recipe (scripts/pretrain_gpt2_124M.sh), end to end at CPU size: the same
# script with --cpu-smoke, so the same phases and trainer flags (-z 1 --shuffle -d -u -q
# -c -v -H 1 -n -nk -y 1, then hf_convert export), on 2 CPU ranks with a d1 model.
#
#   corpus   tinyshakespeare cut into documents (its blank lines), as JSON Lines compressed
#            by the zstd command; the script turns it into shards with prepro_corpus
#            (val first, several train shards)
#   kill     the first run's rank 1 stops itself in the save of step 8 (LLMC_TEST_STOP, as a
#            rank whose node hangs there), and the whole job is killed with SIGKILL, as a
#            scheduler would: checkpoint 4 is the newest complete one
#   resume   the same command again: it must reuse the shards, resume from step 4 (-y 1),
#            repeat steps 5..8 with the killed run's losses (to 1e-5), finish the 12 steps
#            with every step in main.log once and the loss fallen, keep 2 checkpoints (-nk 2)
#            whose state.txt holds the recipe's schedule, AdamW and --shuffle
#   evals    the val loss (-v) and the HellaSwag-format accuracy (-H 1, the shipped 40-item
#            set) at the end, in main.log and on stdout
#   export   the final checkpoint as model.safetensors + config.json; the oracle's
#            independent safetensors reader (dev/test/hf_reference.py) and transformers'
#            GPT2LMHeadModel (the pinned client, scripts/install_hf_client.sh) give the
#            logits of the checkpoint's model.bin (1e-5), and not those of checkpoint 8
#            (control)
#   again    a third run of the command: the run is already complete, exit 0
#   dry run  --dry-run prints the commands and runs none
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
t0=$SECONDS
RECIPE=scripts/pretrain_gpt2_124M.sh

# Built by run_tests.sh's build steps (make here would rewrite the build stamps).
for bin in ./train_gpt2 ./prepro_corpus ./hf_convert; do
    [ -x $bin ] || fatal "$bin is built"
done
[ -f data/tinyshakespeare_hellaswag.bin ] || fatal "data/ is there (make data)"
command -v zstd >/dev/null || fatal "the zstd command is there (scripts/install_deps.sh)"

note "corpus"
CORPUS=$TMP/tinyshakespeare.jsonl.zst
if $PY -c 'import json, sys
text = open("dev/data/tinyshakespeare/input.txt", encoding="utf-8").read()
for doc in (d for d in text.split("\n\n") if d.strip()):
    print(json.dumps({"text": doc}))' | zstd -q -o "$CORPUS" && zstd -q -t "$CORPUS"; then
    ok "$(zstd -dc "$CORPUS" | wc -l) documents in $CORPUS ($(stat -c %s "$CORPUS") bytes, zstd)"
else
    fatal "could not write the corpus"
fi
SHARDS=$TMP/shards RUN=$TMP/run
ARGS=(--cpu-smoke --no-build --corpus "$CORPUS" --shards "$SHARDS" --out "$RUN")

note "the first run: killed in the save of step 8"
LOG1=$TMP/first.log
LLMC_TEST_STOP=save:1:8 setsid bash $RECIPE "${ARGS[@]}" >"$LOG1" 2>&1 &
sid=$!
deadline=$((SECONDS + 90))
until grep -q "stops itself in the checkpoint save of step 8" "$LOG1" || ! kill -0 $sid 2>/dev/null || [ $SECONDS -ge $deadline ]; do
    sleep 0.1
done
stopped=0
grep -q "stops itself in the checkpoint save of step 8" "$LOG1" && stopped=1
kill_session $sid
wait $sid 2>/dev/null
rc1=$?
gone=$((SECONDS + 10))  # SIGKILLed processes take a moment to go
while [ -n "$(ps -s $sid -o pid= 2>/dev/null)" ] && [ $SECONDS -lt $gone ]; do sleep 0.05; done
left=$(ps -s $sid -o pid=,stat=,comm= 2>/dev/null | tr '\n' ' ')
if [ -z "$left" ]; then ok "no process of the killed job is left (mpirun and both ranks gone)"; else not_ok "processes of the killed job left: $left"; fi
t_first=$((SECONDS - t0))
if [ $stopped = 1 ] && [ $rc1 != 0 ]; then ok "rank 1 stopped in the save of step 8; the job was killed (exit $rc1)"
else not_ok "the first run was not caught in the save of step 8 (exit $rc1)" "$LOG1"; fi
if head -n 3 "$LOG1" | grep -q "NOT RUN ON A GPU. This recipe has never run on a GPU"; then
    ok "the script says first that it has never run on a GPU"
else
    not_ok "no NOT RUN ON A GPU notice at the top"
fi
M=$SHARDS/corpus_manifest.txt
if [ -f "$M" ] && indented $PY - "$M" <<'PYEOF'
import sys
rows = [l.split() for l in open(sys.argv[1])]
shards = [r for r in rows if r[0] == "shard"]
total = [r for r in rows if r[0] == "total"][0]
assert shards[0][1] == "val" and shards[0][5] == "corpus_val_000000.bin", shards[0]
train = [s for s in shards[1:] if s[1] == "train"]
assert len(train) == len(shards) - 1 >= 3, shards
assert all(int(s[2]) == 65536 for s in train[:-1]) and 0 < int(train[-1][2]) <= 65536, train
assert int(total[3]) == 16384 and sum(int(s[2]) for s in train) == int(total[4]), total
print(f"  ok   shards: val {shards[0][2]} tokens, then {len(train)} train shards of <= 65536 ({total[4]} tokens)")
PYEOF
then ok "the shards: val first, then several train shards"; else not_ok "the shards are not val first + several train shards" "$M"; fi
if [ -f "$RUN/checkpoint_00000004/manifest.txt" ] && [ ! -e "$RUN/checkpoint_00000008" ]; then
    ok "checkpoint 4 is complete, checkpoint 8 was never renamed into place"
else
    not_ok "expected checkpoint 4 and no checkpoint 8: $(cd "$RUN" 2>/dev/null && echo ./* ./.c*)"
fi
cp "$RUN/main.log" "$TMP/killed_main.log" 2>/dev/null || not_ok "the first run wrote no main.log"

note "the same command again: resumes and finishes"
LOG2=$TMP/resume.log
t1=$SECONDS
if bash $RECIPE "${ARGS[@]}" >"$LOG2" 2>&1; then ok "the rerun exited 0 ($((SECONDS - t1)) s)"
else not_ok "the rerun failed" "$LOG2"; fi
if grep -q "shards are there" "$LOG2" && ! grep -q "^+ ./prepro_corpus" "$LOG2"; then ok "the shards were reused, not remade"
else not_ok "the rerun did not reuse the shards"; fi
if grep -q "resumed from $RUN/checkpoint_00000004: step 4" "$LOG2" && grep -q "^step    5/12 " "$LOG2" &&
    ! grep -q "^step    [1-4]/12 " "$LOG2"; then
    ok "resumed from checkpoint 4 (-y 1) and went on with step 5"
else
    not_ok "the rerun did not resume at step 4"; grep -E "resum|^step" "$LOG2" | head -5
fi
if indented $PY - "$TMP/killed_main.log" "$RUN/main.log" <<'PYEOF'
import sys
def train(path):
    out = {}
    for line in open(path):
        f = dict(kv.split(":", 1) for kv in line.split())
        if "trl" in f:
            s = int(f["s"])
            assert s not in out, f"{path}: step {s} twice"
            out[s] = float(f["trl"])
    return out
killed, final = train(sys.argv[1]), train(sys.argv[2])
assert sorted(killed) == list(range(1, 9)), ("the killed run logged", sorted(killed))
assert sorted(final) == list(range(1, 13)), ("main.log after the resume holds", sorted(final))
worst = max(abs(final[s] - killed[s]) for s in range(5, 9))
assert worst <= 1e-5, f"steps 5..8 after the resume differ from the killed run's by {worst:g}"
assert all(final[s] == killed[s] for s in range(1, 5)), "steps 1..4 in main.log changed"
assert final[12] < final[1] - 0.1, f"the loss did not fall: {final[1]} -> {final[12]}"
print(f"  ok   steps 5..8 repeated after the resume equal the killed run's (max diff {worst:.1e} <= 1e-5); "
      f"main.log holds steps 1..12 once; loss {final[1]:.4f} -> {final[12]:.4f}")
PYEOF
then ok "the losses after the resume"; else not_ok "the losses after the resume"; fi

note "evals"
val=$(sed -n 's/^s:12 tel:\([0-9.]*\)$/\1/p' "$RUN/main.log")
val0=$(sed -n 's/^s:0 tel:\([0-9.]*\)$/\1/p' "$RUN/main.log")
if [ -n "$val" ] && [ -n "$val0" ] && awk -v a="$val0" -v b="$val" 'BEGIN { exit !(b < a) }' &&
    grep -q "^val loss $val" "$LOG2"; then
    ok "val loss (-v) at step 0 $val0 and at step 12 $val (main.log and stdout)"
else
    not_ok "no falling val loss at steps 0 and 12 (s:0 tel '$val0', s:12 tel '$val')"
fi
acc=$(sed -n 's/^s:12 eval:\([0-9.]*\)$/\1/p' "$RUN/main.log")
if [ -n "$acc" ] && grep -qE "^step 12: hellaswag accuracy $acc \([0-9]+/40\)$" "$LOG2"; then
    ok "HellaSwag-format eval (-H 1, 40 items) at step 12: $(sed -n 's/^step 12: hellaswag accuracy //p' "$LOG2")"
else
    not_ok "no -H 1 accuracy for step 12 (main.log '$acc')"
fi

note "checkpoints and the export"
kept=$(cd "$RUN" && for d in checkpoint_* .checkpoint_*; do [ -e "$d" ] && printf '%s ' "$d"; done)
if [ "$kept" = "checkpoint_00000008 checkpoint_00000012 " ]; then ok "-nk 2 kept: $kept(no temporary left)"
else not_ok "checkpoints left: '$kept', expected checkpoint_00000008 checkpoint_00000012"; fi
# What the trainer saved of the recipe's flags (the schedule, AdamW, the data order, ranks).
ST=$RUN/checkpoint_00000012/state.txt
want="step 12|ranks 2|B 2|T 64|grad_accum_steps 1|max_steps 12|warmup_steps 2|final_lr_fraction 0|shuffle 1|data_seed 42"
missing=$(tr '|' '\n' <<<"$want" | while read -r line; do grep -qx "$line" "$ST" 2>/dev/null || printf '[%s] ' "$line"; done)
if [ -z "$missing" ] && grep -qx "lr 0.000600000028" "$ST" && grep -qx "weight_decay 0.100000001" "$ST"; then
    ok "the final checkpoint saved the recipe's flags: --shuffle, -u 2 -q 0 -x 12, lr 6e-4, -c 0.1, 2 ranks x B 2 x T 64"
else
    not_ok "state.txt does not hold the recipe's flags: missing $missing" "$ST"
fi
HF=$RUN/hf
if [ -f "$HF/model.safetensors" ] && [ -f "$HF/config.json" ] && grep -q "^+ ./hf_convert export $RUN/checkpoint_00000012 $HF" "$LOG2" &&
    grep -q "^plan: .*; run $RUN; export $HF$" "$LOG2"; then
    ok "hf_convert exported checkpoint 12 to $HF, the folder the printed plan names"
else
    not_ok "no export in $HF" "$LOG2"
fi
hf_client || not_ok "the real client: scripts/install_hf_client.sh failed"
if "${HF_CHECK[@]}" --pair "$RUN/checkpoint_00000012/model.bin" "$HF" \
        --pair-mismatch "$RUN/checkpoint_00000008/model.bin" "$HF" >"$TMP/check.log" 2>&1; then
    ok "the oracle reads the export itself and transformers loads it: their logits equal the checkpoint's model.bin's (1e-5); checkpoint 8 does not match (control)"
else
    not_ok "the oracle's logits check of the export failed"
fi
sed 's/^/       | /' "$TMP/check.log"

note "a finished run, rerun; the dry run"
if bash $RECIPE "${ARGS[@]}" >"$TMP/again.log" 2>&1 && grep -q "is at step 12 = -x: the run is already complete" "$TMP/again.log" &&
    ! grep -q "^step " "$TMP/again.log"; then
    ok "a third run trains nothing: the run is already complete, exit 0"
else
    not_ok "rerunning the finished run" "$TMP/again.log"
fi
if bash $RECIPE "${ARGS[@]}" --out "$TMP/dry" --shards "$TMP/dry_shards" --dry-run >"$TMP/dry.log" 2>&1 &&
    grep -q "^+ env OMP_NUM_THREADS=1 mpirun .*-np 2 ./train_gpt2 .* -z 1 --shuffle .* -H 1 .* -y 1" "$TMP/dry.log" &&
    grep -q "^+ ./prepro_corpus " "$TMP/dry.log" && grep -q "^+ ./hf_convert export .* $TMP/dry/hf --overwrite$" "$TMP/dry.log" &&
    grep -q "^plan: .*; shards $TMP/dry_shards/corpus_\*; run $TMP/dry; export $TMP/dry/hf$" "$TMP/dry.log" &&
    [ ! -e "$TMP/dry" ] && [ ! -e "$TMP/dry_shards" ]; then
    ok "--dry-run prints prepro_corpus, the trainer and hf_convert, and runs none of them"
else
    not_ok "--dry-run" "$TMP/dry.log"
fi

# The 124M profile's plans (dry runs: nothing built or run): 8 nodes x 8 GPUs are 64 ranks
# under Slurm with one ZeRO-1 instance per node and -b 8 (524,288 tokens a step: 64 x 8 x
# 1024), validation 10,485,760 tokens = -m 1280 batches of 8 x 1024; one node passes no
# --dist-opt-instances and -m 160 (64 x 1024 each); a local mpirun cannot span nodes.
dry124() { bash $RECIPE --dry-run --out "$TMP/dry124" --shards "$TMP/dry124_shards" "$@" 2>&1; }
d8=$(dry124 --nodes 8 --gpus 8) d1=$(dry124 --gpus 8) dl=$(dry124 --nodes 2 --launcher local)
rc_local=$?
cmd8=$(grep "^+ .*train_gpt2cu\|^+ .*train.sbatch" <<<"$d8")
if grep -q "^plan: 64 ranks = 8 node(s) x 8 (slurm), 8 ZeRO-1 instance(s), d12, -b 8 -t 1024 x 1 micro-steps" <<<"$d8" &&
    grep -q "train.sbatch .* -b 8 .* -z 1 --dist-opt-instances 8 .* -m 1280 " <<<"$cmd8" &&
    grep -q "^+ env OMP_NUM_THREADS=[0-9]* mpirun .*-np 8 ./train_gpt2cu .* -b 64 .* -m 160 " <<<"$d1" &&
    ! grep -q -- "--dist-opt-instances" <<<"$d1" && [ $rc_local != 0 ] &&
    grep -q "error: --launcher local runs on this node only" <<<"$dl"; then
    ok "124M dry runs: 8 nodes x 8 GPUs plan 64 ranks, --dist-opt-instances 8, -b 8, -m 1280; 1 node none, -m 160"
else
    printf '%s\n' "$d8" "$d1" "$dl" >"$TMP/dry124.log"
    not_ok "124M dry runs (--nodes 8 --gpus 8; --gpus 8; --nodes 2 --launcher local)" "$TMP/dry124.log"
fi

# --corpus names a file with a blank (and a glob character) in its name: one input, that file.
cp "$CORPUS" "$TMP/my corpus[1].jsonl.zst"
if bash $RECIPE --cpu-smoke --no-build --corpus "$TMP/my corpus[1].jsonl.zst" --out "$TMP/dry2" --shards "$TMP/dry2_shards" \
    --dry-run >"$TMP/dry2.log" 2>&1 && grep -qF "corpus: 1 input(s): $TMP/my corpus[1].jsonl.zst" "$TMP/dry2.log"; then
    ok "--corpus 'my corpus[1].jsonl.zst': one input, the file of that name"
else
    not_ok "--corpus with a blank in its name" "$TMP/dry2.log"
fi

# The hostfile (scripts/multi_node/hostfile.sh, for launch.sh and the recipe): mixed slots,
# a node twice, a BOM before the first name, a slot count past any machine are one error each;
# slots= in a comment count for nothing; MPIRUN_ARGS are split on blanks and never expand.
H=$TMP/hosts
mkdir -p "$H"
printf 'a slots=8\nb slots=4\n' >"$H/mixed"
printf 'a slots=8\na slots=8\n' >"$H/twice"
printf '\xef\xbb\xbfa slots=8\n' >"$H/bom"
printf 'a slots=99999999999999999999\n' >"$H/huge"
printf '# a slots=16\na slots=2 # slots=16\nb slots=2\n' >"$H/comments"
launch() { DRY_RUN=1 TRAIN_BIN=./train_gpt2 bash scripts/multi_node/launch.sh "$@" 2>&1; }
for bad in mixed:"has slots=4, the nodes before it 8" twice:"node 'a' is listed twice" bom:"is not 'NAME slots=N'" \
           huge:"slots=99999999999999999999: give 1 to 1024"; do
    out=$(launch "$H/${bad%%:*}" -x 1); rc=$?
    if [ $rc != 0 ] && [ "$(grep -c 'error:' <<<"$out")" = 1 ] && grep -qF -- "${bad#*:}" <<<"$out"; then
        ok "hostfile ${bad%%:*}: refused: $(grep error: <<<"$out" | sed "s|$TMP/||")"
    else
        not_ok "hostfile ${bad%%:*}: exit $rc: $out"
    fi
done
mkdir -p "$H/star" && touch "$H/star/a_file"
repo=$PWD
out=$(cd "$H/star" && MPIRUN_ARGS='--mca x * --bind-to none' DRY_RUN=1 TRAIN_BIN=$repo/train_gpt2 \
    bash "$repo/scripts/multi_node/launch.sh" "$H/comments" -x 1 2>&1)
if grep -q -- "-np 4 .*ppr:2:node" <<<"$out" && grep -qF -- '--mca x \* --bind-to none' <<<"$out" && ! grep -q a_file <<<"$out"; then
    ok "hostfile comments: 2 nodes x slots=2 (slots= in comments ignored); MPIRUN_ARGS' '*' passed as '*'"
else
    not_ok "hostfile comments and MPIRUN_ARGS: $out"
fi

note "test_recipe: first run ${t_first} s, whole test $((SECONDS - t0)) s"
done_testing
