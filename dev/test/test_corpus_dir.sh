#!/usr/bin/env bash
# prepro_corpus owns its output directory (tools/prepro_corpus.c, tools/shard_writer.h):
#   - a second run into the same --out-dir is refused at once, naming the holder, and the
#     first one's corpus comes out whole;
#   - a kill -9 at any moment leaves either the complete corpus with its manifest, or no
#     file that the documented glob (NAME_train_*.bin, NAME_val_*.bin) picks up, or (only
#     inside the final renames) a manifest some of whose shards are still temporaries,
#     which the trainer refuses; the next run removes the leftovers, says so, and writes
#     the same corpus as a run that was never interrupted;
#   - -o removed and made again while a run writes: it stops, writing nothing into the new one.
# Stdin is a FIFO this script holds open, so that a run waits, lock taken, where the test wants.
# Exits 0 only if every check passes.
set -u
cd "$(dirname "$0")/../.." || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

source dev/test/data_checks.sh

build_or_exit test_corpus_dir prepro_corpus
[ -x ./train_gpt2 ] || { echo "FAIL test_corpus_dir: ./train_gpt2 is not built (make train_gpt2)"; exit 1; }
TOOL=(./prepro_corpus --encoder "$ENCODER" --merges "$MERGES" --progress 0 --threads 1 --shard-tokens 2000)
IN=$TMP/corpus.jsonl
"$PY" -c 'import json, sys
with open(sys.argv[1], "w") as f:
    for k in range(20000):
        f.write(json.dumps({"text": "line %d of the corpus, some words here" % k}) + "\n")' "$IN"

# The reference: the same corpus, never interrupted.
"${TOOL[@]}" --out-dir "$TMP/ref" "$IN" >/dev/null 2>"$TMP/ref.err" || { cat "$TMP/ref.err"; echo "FAIL test_corpus_dir: the reference run"; exit 1; }
SHARDS=$(grep -c ^shard "$TMP/ref/corpus_manifest.txt")
same_as_reference() {  # dir: the reference's shards, byte for byte, as its manifest lists them, and nothing else of the corpus
    [ -d "$1" ] && diff <(cd "$TMP/ref" && ls corpus_*.bin* | xargs cksum) <(cd "$1" && ls corpus_*.bin* | xargs cksum) >/dev/null &&
        diff <(grep ^shard "$TMP/ref/corpus_manifest.txt") <(grep ^shard "$1/corpus_manifest.txt") >/dev/null
}

# ---- a second run into a directory in use --------------------------------------------------
# A waits for its input (the FIFO) holding the lock; B tries the same directory and name, C
# another name there. Then A gets its input and must come out whole.
feed() {  # fifo: opened read-write on fd 3 so that the reader's open does not block
    rm -f "$1" && mkfifo "$1" && exec 3<>"$1"
}
wait_for() {  # seconds command...: polls until the command succeeds
    local n=$(($1 * 10)); shift
    while [ $n -gt 0 ]; do "$@" && return 0; sleep 0.1; n=$((n - 1)); done
    return 1
}
files_at_least() { [ "$(ls "$1" 2>/dev/null | grep -c "$2")" -ge "$3" ]; }  # dir pattern count
feed "$TMP/fifo"
"${TOOL[@]}" --out-dir "$TMP/busy" - <"$TMP/fifo" 3>&- >"$TMP/a.out" 2>"$TMP/a.err" &
A=$!
wait_for 20 grep -q "pid $A," "$TMP/busy/.lock" 2>/dev/null || fail "the first run took no lock naming its pid $A"
for who in B:corpus C:other; do
    "${TOOL[@]}" --out-dir "$TMP/busy" --name "${who#*:}" "$IN" >/dev/null 2>"$TMP/${who%%:*}.err"
    rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/${who%%:*}.err")" = 1 ] &&
       grep -q "^error: output directory '$TMP/busy' is in use by another job (host $(hostname), pid $A, started .*): one job per output directory" "$TMP/${who%%:*}.err"; then
        pass "a second run (--name ${who#*:}) into a directory in use: exit 1, '$(sed "s|$TMP/||" "$TMP/${who%%:*}.err" | cut -c1-120)...'"
    else
        fail "a second run (--name ${who#*:}) into a directory in use: exit $rc, $(head -3 "$TMP/${who%%:*}.err" | tr '\n' '|')"
    fi
done
cat "$IN" >&3
exec 3>&-
wait $A
rc=$?
if [ $rc -eq 0 ] && same_as_reference "$TMP/busy"; then
    pass "the first run, alone in its directory all along: exit 0, its $SHARDS shards and manifest whole"
else
    fail "the first run: exit $rc, $(head -3 "$TMP/a.err" | tr '\n' '|'), its files: $(ls "$TMP/busy" | head -5 | tr '\n' ' ')"
fi

# ---- kill -9 ---------------------------------------------------------------------------------
# state DIR: what a killed run left, by what the glob and the manifest say.
state() {
    local d=$1 globbed
    [ -d "$d" ] || { echo nothing; return; }
    globbed=$(cd "$d" && ls corpus_train_*.bin corpus_val_*.bin 2>/dev/null | wc -l)
    if [ ! -f "$d/corpus_manifest.txt" ]; then
        [ "$globbed" = 0 ] && echo nothing || echo "$globbed shards without a manifest"
    elif same_as_reference "$d"; then
        echo complete
    elif [ "$(cd "$d" && ls corpus_*.bin.tmp 2>/dev/null | wc -l)" -gt 0 ] &&
         [ "$(($(cd "$d" && ls corpus_*.bin.tmp | wc -l) + globbed))" = "$SHARDS" ]; then
        echo "unfinished commit"
    else
        echo "a manifest with other shards: $(ls "$d" | head -5 | tr '\n' ' ')"
    fi
}
# The next run: exit 0, the reference corpus, and a word about what it removed.
rerun() {  # label dir
    "${TOOL[@]}" --out-dir "$2" "$IN" >/dev/null 2>"$TMP/rerun.err"
    local rc=$?
    if [ $rc -eq 0 ] && same_as_reference "$2" &&
       grep -q "^prepro_corpus: removed what an interrupted run of corpus 'corpus' left in '$2': [0-9]* unfinished shard" "$TMP/rerun.err"; then
        pass "$1: the next run says '$(sed "s|$TMP/||" "$TMP/rerun.err" | head -1)', exit 0, the reference corpus"
    else
        fail "$1: the next run: exit $rc, $(head -2 "$TMP/rerun.err" | tr '\n' '|'), $(state "$2")"
    fi
}
# Deterministic: killed with shards complete and the input half read (small batches, so
# that the records read so far are written).
feed "$TMP/fifo"
"${TOOL[@]}" --batch-bytes 65536 --out-dir "$TMP/k0" - <"$TMP/fifo" 3>&- >/dev/null 2>&1 &
A=$!
head -n 10000 "$IN" >&3
wait_for 30 files_at_least "$TMP/k0" '^corpus_train_' 5
kill -9 $A
wait $A 2>/dev/null
exec 3>&-
s=$(state "$TMP/k0")
if [ "$s" = nothing ]; then
    pass "kill -9 with $(ls "$TMP/k0" | grep -c '^corpus_train_') train shards written: nothing the glob picks up ($(ls "$TMP/k0" | grep -c '\.tmp$') temporaries)"
else
    fail "kill -9 with shards written: $s"
fi
rerun "kill -9 with shards written" "$TMP/k0"

# At moments spread over a run (its length measured first): each leaves an allowed state.
t0=$(date +%s%N)
"${TOOL[@]}" --out-dir "$TMP/timed" "$IN" >/dev/null 2>&1
run_ms=$((($(date +%s%N) - t0) / 1000000))
states=() bad_states=0
for k in 1 2 3 4 5 6 7 8 9 10 11 12; do
    d=$TMP/k$k
    "${TOOL[@]}" --out-dir "$d" "$IN" >/dev/null 2>&1 &
    A=$!
    sleep "$(awk -v ms=$run_ms -v k=$k 'BEGIN { printf "%.3f", ms * k / 11 / 1000 }')"
    kill -9 $A 2>/dev/null
    wait $A 2>/dev/null
    s=$(state "$d")
    states+=("$s")
    case "$s" in
        nothing) [ -n "$(ls -A "$d" 2>/dev/null | grep -v '^\.lock$')" ] && rerun "kill -9 at $k/11 of a run" "$d" ;;
        complete|"unfinished commit") ;;
        *) fail "kill -9 at $k/11 of a run ($run_ms ms): $s"; bad_states=$((bad_states + 1)) ;;
    esac
done
summary="kill -9 at 12 moments of a ${run_ms} ms run: $(printf '%s\n' "${states[@]}" | sort | uniq -c | awk '{ $1 = $1 " x"; print }' | paste -sd, -)"
if [ $bad_states = 0 ]; then pass "$summary"; else fail "$summary"; fi

# The one window where the glob finds shards before the corpus is whole: killed between the
# manifest's rename and the last shard's (made here from the reference: two shards renamed back).
cp -r "$TMP/ref" "$TMP/commit"
for f in corpus_train_000020.bin corpus_train_000021.bin; do mv "$TMP/commit/$f" "$TMP/commit/$f.tmp"; done
./train_gpt2 -e d2 -b 2 -t 32 -x 1 -v 0 -s 0 -i "$TMP/commit/corpus_train_*.bin" >"$TMP/commit.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c '^error:' "$TMP/commit.log")" = 1 ] &&
   grep -q "^error: $TMP/commit/corpus_manifest.txt lists $TMP/commit/corpus_train_000020.bin, which matches .* but is missing: the corpus is not whole" "$TMP/commit.log"; then
    pass "an unfinished commit: the trainer refuses it (exit $rc, '$(grep ^error: "$TMP/commit.log" | sed "s|$TMP/||g" | cut -c1-110)...')"
else
    fail "an unfinished commit: the trainer: exit $rc, $(grep -E '^(error|step)' "$TMP/commit.log" | head -2 | tr '\n' '|')"
fi
rerun "an unfinished commit" "$TMP/commit"
grep -q "and the manifest and shards of the commit it did not finish" "$TMP/rerun.err" ||
    fail "an unfinished commit: the next run did not say it removed the commit's manifest and shards"

# ---- -o removed and made again under a run -------------------------------------------------
feed "$TMP/fifo"
"${TOOL[@]}" --out-dir "$TMP/moved" - <"$TMP/fifo" 3>&- >/dev/null 2>"$TMP/moved.err" &
A=$!
wait_for 20 grep -q "pid $A," "$TMP/moved/.lock" 2>/dev/null
rm -rf "$TMP/moved" && mkdir "$TMP/moved"
cat "$IN" >&3
exec 3>&-
wait $A
rc=$?
if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/moved.err")" = 1 ] && [ -z "$(ls -A "$TMP/moved")" ] &&
   grep -q "^error: output directory '$TMP/moved' is no longer the one this job locked" "$TMP/moved.err"; then
    pass "--out-dir removed and made again under a run: exit 1, '$(sed "s|$TMP/||" "$TMP/moved.err" | cut -c1-100)...', the new one left empty"
else
    fail "--out-dir removed and made again under a run: exit $rc, $(head -2 "$TMP/moved.err" | tr '\n' '|'), in it: $(ls -A "$TMP/moved" | head -3 | tr '\n' ' ')"
fi

verdict test_corpus_dir
