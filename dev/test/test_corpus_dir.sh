#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# prepro_corpus owns its output directory (tools/prepro_corpus.c, tools/shard_writer.h):
#   - a second run into the same --out-dir is refused at once, naming the holder, and the
#     first one's corpus comes out whole;
#   - a kill -9 at any moment leaves either the complete corpus with its manifest, or no
#     file that the documented glob (NAME_train_*.bin, NAME_val_*.bin) picks up, or (only
#     inside the final renames) a manifest some of whose shards are still temporaries,
#     which the trainer refuses; the next run removes the leftovers, says so, and writes
#     the same corpus as a run that was never interrupted;
#   - -o removed and made again while a run writes: it stops, writing nothing into the new one;
#     -o removed with the run stopped (LLMC_TEST_STOP, dev/test/seams.c) before its commit,
#     and after it: exit 1 with the error each time (a corpus renamed into a removed
#     directory is lost, and the run says so);
#   - kill -9 at those two points: the next run completes (after the commit: it finds this
#     job's corpus complete and exits 0 saying there is nothing to do); a killed run of
#     another --name leaves temporaries that the next run into the directory removes;
#   - a full disk (a tmpfs in a private mount namespace, root only) failing the run in its
#     shards, and in the tokenizer file after them, and a file size limit (ulimit -f, any
#     user; SIGXFSZ would kill the run uncleaned): exit 1, nothing left but .lock, and the
#     next small run on the same disk succeeds;
#   - two corpora in one directory: the trainer refuses a glob that matches both.
# Stdin is a FIFO this script holds open, so that a run waits, lock taken, where the test wants.
# Exits 0 only if every check passes.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
source dev/test/data_checks.sh

build_or_exit prepro_corpus
[ -x ./train_gpt2 ] || fatal "./train_gpt2 is built (make train_gpt2)"
TOOL=(./prepro_corpus --encoder "$ENCODER" --merges "$MERGES" --progress 0 --threads 1 --shard-tokens 2000)
IN=$TMP/corpus.jsonl
"$PY" -c 'import json, sys
with open(sys.argv[1], "w") as f:
    for k in range(20000):
        f.write(json.dumps({"text": "line %d of the corpus, some words here" % k}) + "\n")' "$IN"

# The reference: the same corpus, never interrupted.
"${TOOL[@]}" --out-dir "$TMP/ref" "$IN" >/dev/null 2>"$TMP/ref.err" || fatal "the reference run" "$TMP/ref.err"
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
wait_for 20 grep -q "pid $A," "$TMP/busy/.lock" 2>/dev/null || not_ok "the first run took no lock naming its pid $A"
for who in B:corpus C:other; do
    "${TOOL[@]}" --out-dir "$TMP/busy" --name "${who#*:}" "$IN" >/dev/null 2>"$TMP/${who%%:*}.err"
    rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/${who%%:*}.err")" = 1 ] &&
       grep -q "^error: output directory '$TMP/busy' is in use by another job (host $(hostname), pid $A, started .*): one job per output directory" "$TMP/${who%%:*}.err"; then
        ok "a second run (--name ${who#*:}) into a directory in use: exit 1, '$(sed "s|$TMP/||" "$TMP/${who%%:*}.err" | cut -c1-120)...'"
    else
        not_ok "a second run (--name ${who#*:}) into a directory in use: exit $rc, $(head -3 "$TMP/${who%%:*}.err" | tr '\n' '|')"
    fi
done
cat "$IN" >&3
exec 3>&-
wait $A
rc=$?
if [ $rc -eq 0 ] && same_as_reference "$TMP/busy"; then
    ok "the first run, alone in its directory all along: exit 0, its $SHARDS shards and manifest whole"
else
    not_ok "the first run: exit $rc, $(head -3 "$TMP/a.err" | tr '\n' '|'), its files: $(ls "$TMP/busy" | head -5 | tr '\n' ' ')"
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
        ok "$1: the next run says '$(sed "s|$TMP/||" "$TMP/rerun.err" | head -1)', exit 0, the reference corpus"
    else
        not_ok "$1: the next run: exit $rc, $(head -2 "$TMP/rerun.err" | tr '\n' '|'), $(state "$2")"
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
    ok "kill -9 with $(ls "$TMP/k0" | grep -c '^corpus_train_') train shards written: nothing the glob picks up ($(ls "$TMP/k0" | grep -c '\.tmp$') temporaries)"
else
    not_ok "kill -9 with shards written: $s"
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
        *) not_ok "kill -9 at $k/11 of a run ($run_ms ms): $s"; bad_states=$((bad_states + 1)) ;;
    esac
done
summary="kill -9 at 12 moments of a ${run_ms} ms run: $(printf '%s\n' "${states[@]}" | sort | uniq -c | awk '{ $1 = $1 " x"; print }' | paste -sd, -)"
if [ $bad_states = 0 ]; then ok "$summary"; else not_ok "$summary"; fi

# The one window where the glob finds shards before the corpus is whole: killed between the
# manifest's rename and the last shard's (made here from the reference: two shards renamed back).
cp -r "$TMP/ref" "$TMP/commit"
for f in corpus_train_000020.bin corpus_train_000021.bin; do mv "$TMP/commit/$f" "$TMP/commit/$f.tmp"; done
./train_gpt2 -e d2 -b 2 -t 32 -x 1 -v 0 -s 0 -i "$TMP/commit/corpus_train_*.bin" >"$TMP/commit.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c '^error:' "$TMP/commit.log")" = 1 ] &&
   grep -q "^error: $TMP/commit/corpus_manifest.txt lists $TMP/commit/corpus_train_000020.bin, which matches .* but is missing: the corpus is not whole" "$TMP/commit.log"; then
    ok "an unfinished commit: the trainer refuses it (exit $rc, '$(grep ^error: "$TMP/commit.log" | sed "s|$TMP/||g" | cut -c1-110)...')"
else
    not_ok "an unfinished commit: the trainer: exit $rc, $(grep -E '^(error|step)' "$TMP/commit.log" | head -2 | tr '\n' '|')"
fi
rerun "an unfinished commit" "$TMP/commit"
grep -q "and the manifest and shards of the commit it did not finish" "$TMP/rerun.err" ||
    not_ok "an unfinished commit: the next run did not say it removed the commit's manifest and shards"

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
    ok "--out-dir removed and made again under a run: exit 1, '$(sed "s|$TMP/||" "$TMP/moved.err" | cut -c1-100)...', the new one left empty"
else
    not_ok "--out-dir removed and made again under a run: exit $rc, $(head -2 "$TMP/moved.err" | tr '\n' '|'), in it: $(ls -A "$TMP/moved" | head -3 | tr '\n' ' ')"
fi

# ---- stopped at a known place: removed, or killed --------------------------------------------
# at POINT NAME: a run in the background, stopped (LLMC_TEST_STOP) at POINT; sets A and pids.
at() {
    LLMC_TEST_STOP=$1:0:1 "${TOOL[@]}" --out-dir "$TMP/$2" "$IN" >"$TMP/$2.out" 2>"$TMP/$2.err" &
    A=$!
    pids=$(wait_stopped "$TMP/$2.err" 1) || not_ok "$2: the run did not stop at $1"
}
for point in corpus_commit corpus_done; do
    at $point "gone_$point"
    rm -rf "$TMP/gone_$point"
    kill -CONT $A
    wait $A
    rc=$?
    if [ $rc -eq 1 ] && [ ! -e "$TMP/gone_$point" ] && [ "$(grep -c 'error:' "$TMP/gone_$point.err")" = 1 ] &&
       grep -q "^error: output directory '$TMP/gone_$point' is no longer the one this job locked (it no longer exists)" "$TMP/gone_$point.err"; then
        ok "--out-dir removed at $point: exit 1, '$(grep error: "$TMP/gone_$point.err" | sed "s|$TMP/||" | cut -c1-100)...'"
    else
        not_ok "--out-dir removed at $point: exit $rc, $(grep -v '^test:' "$TMP/gone_$point.err" | head -2 | tr '\n' '|')"
    fi
    at $point "kill_$point"
    kill -9 $A
    wait $A 2>/dev/null
    if [ $point = corpus_commit ]; then
        rerun "kill -9 before the commit" "$TMP/kill_$point"
    else
        "${TOOL[@]}" --out-dir "$TMP/kill_$point" "$IN" >"$TMP/rerun.out" 2>"$TMP/rerun.err"
        rc=$?
        if [ $rc -eq 0 ] && same_as_reference "$TMP/kill_$point" && [ ! -s "$TMP/rerun.err" ] &&
           grep -q "^prepro_corpus: '$TMP/kill_$point' already holds corpus 'corpus' from this job (.*), complete: its manifest and $SHARDS shards; nothing to do$" "$TMP/rerun.out"; then
            ok "kill -9 after the commit: the next run finds this job's corpus complete, exit 0, nothing to do"
        else
            not_ok "kill -9 after the commit: the next run: exit $rc, $(cat "$TMP/rerun.out" "$TMP/rerun.err" | head -2 | tr '\n' '|')"
        fi
    fi
done
# Another name's killed run: its temporaries hold space the next run (any name) may need.
at corpus_commit other_dead && kill -9 $A && wait $A 2>/dev/null
mv "$TMP/other_dead" "$TMP/shared_dir"
"${TOOL[@]}" --out-dir "$TMP/shared_dir" --name other "$IN" >/dev/null 2>"$TMP/other.err"
rc=$?
if [ $rc -eq 0 ] && [ -z "$(ls "$TMP/shared_dir" | grep '\.tmp$')" ] &&
   grep -q "^prepro_corpus: removed what an interrupted run of corpus 'corpus' left in '$TMP/shared_dir': $SHARDS unfinished shards" "$TMP/other.err"; then
    ok "a killed run of corpus 'corpus': a run of 'other' into the directory removes its $SHARDS temporaries, saying so"
else
    not_ok "another name's leftovers: exit $rc, $(head -2 "$TMP/other.err" | tr '\n' '|'), left: $(ls "$TMP/shared_dir" | grep -c '\.tmp$') temporaries"
fi

# ---- two corpora in one directory: a glob over both is refused ------------------------------
"${TOOL[@]}" --out-dir "$TMP/shared_dir" --name third "$IN" >/dev/null 2>&1 || not_ok "a third corpus into the shared directory"
./train_gpt2 -e d2 -b 2 -t 32 -x 1 -v 0 -s 0 -i "$TMP/shared_dir/*_train_*.bin" >"$TMP/two.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c '^error:' "$TMP/two.log")" = 1 ] &&
   grep -q "^error: '$TMP/shared_dir/\*_train_\*.bin' matches shards of two corpora: .*other_train_000001.bin (listed in $TMP/shared_dir/other_manifest.txt) and .*third_train_000001.bin (listed in $TMP/shared_dir/third_manifest.txt)" "$TMP/two.log"; then
    ok "two corpora in one directory: the trainer refuses a glob over both (exit $rc)"
else
    not_ok "two corpora under one glob: exit $rc, $(grep -E '^(error|step)' "$TMP/two.log" | head -2 | tr '\n' '|')"
fi

# ---- a full disk, a file size limit ---------------------------------------------------------
# left DIR: what is in DIR besides .lock.
left() { ls -A "$1" 2>/dev/null | grep -v '^\.lock$' | tr '\n' ' '; }
SMALL=$TMP/small.jsonl
head -n 50 "$IN" >"$SMALL"
# ulimit -f 200 (KiB): the shards fit (2000 tokens each), the tokenizer file (363 KiB) does not.
(ulimit -f 200 && exec "${TOOL[@]}" --out-dir "$TMP/limited" "$IN") >/dev/null 2>"$TMP/limited.err"
rc=$?
if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/limited.err")" = 1 ] && grep -q "gpt2_tokenizer.bin.tmp: write failed: File too large" "$TMP/limited.err" &&
   [ -z "$(left "$TMP/limited")" ]; then
    ok "a file size limit (ulimit -f) at the tokenizer file: exit 1, '$(sed "s|$TMP/||" "$TMP/limited.err" | cut -c1-80)...', nothing left"
else
    not_ok "a file size limit: exit $rc, $(head -2 "$TMP/limited.err" | tr '\n' '|'), left: $(left "$TMP/limited")"
fi
if [ "$(id -u)" != 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
    skip "full disk" "needs root and unshare -m for a small tmpfs (not run here)"
else
    # 1100 KiB: the corpus's shards (110 files, 900 KiB on a tmpfs) fit, the tokenizer file
    # after them does not; 500 KiB: the shards themselves fail. After each, a small corpus
    # (2 shards and the tokenizer file, 380 KiB) on the same disk.
    for size in 1100 500; do
        mkdir -p "$TMP/fs$size"
        unshare -m --propagation private bash -c '
            fs=$1 in=$2 small=$3; shift 3
            mount -t tmpfs -o size='$size'k tmpfs "$fs" || exit 97
            "$@" --out-dir "$fs/out" "$in" >/dev/null 2>"$fs.err"
            echo $? >"$fs.rc"
            ls -A "$fs/out" | grep -v "^\.lock$" >"$fs.left"
            "$@" --out-dir "$fs/out" "$small" >/dev/null 2>"$fs.small.err"
            echo $? >"$fs.small.rc"' _ "$TMP/fs$size" "$IN" "$SMALL" "${TOOL[@]}"
        r=$TMP/fs$size
        if [ "$(cat "$r.rc")" = 1 ] && grep -q "No space left on device" "$r.err" && [ ! -s "$r.left" ] &&
           [ "$(cat "$r.small.rc")" = 0 ]; then
            ok "full disk ($size KiB): exit 1, '$(sed "s|$TMP/||" "$r.err" | cut -c1-70)...', nothing left; the next small run succeeds"
        else
            not_ok "full disk ($size KiB): exit $(cat "$r.rc"), $(head -1 "$r.err"), left: $(xargs <"$r.left"); the next run: exit $(cat "$r.small.rc"), $(head -1 "$r.small.err")"
        fi
    done
fi

done_testing
