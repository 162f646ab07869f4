#!/usr/bin/env bash
# Tests of prepro_corpus (tools/prepro_corpus.c): corpora this test makes itself
# (Unicode, emoji, newlines, empty texts, JSON escapes and surrogate pairs) in every
# container (plain JSONL, zstd and gzip through their own command-line tools, text files,
# stdin). The oracle for the ids is dev/test/bpe_reference.py (through check_corpus.py,
# which also checks names, sizes, headers and CRC32Cs with crc32c_reference.py); the
# documents it encodes are this script's Python strings, not the tool's parsing of them.
# Exits 0 only if every check passes.
set -u
cd "$(dirname "$0")/../.." || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

source dev/test/data_checks.sh

build_or_exit test_corpus prepro_corpus
for tool in zstd gzip; do
    if ! command -v $tool >/dev/null; then
        echo "FAIL test_corpus: the $tool command is missing (scripts/install_deps.sh installs it)"
        exit 1
    fi
done
TOOL=(./prepro_corpus --encoder "$ENCODER" --merges "$MERGES" --progress 0)
C=$TMP/in

# ---- the corpora -----------------------------------------------------------------------
# docs.json: every good document in input order; the files split them among the containers.
mkdir -p "$C"
"$PY" - "$C" <<'EOF'
import gzip, json, random, sys
out = sys.argv[1]
rng = random.Random(7)
pieces = ["Hello world", "caf\u00e9", "na\u00efve \u00fcber", "Stra\u00dfe", "\u4e2d\u6587\u6587\u672c", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
          "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\U0001F642", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\U0001F1EF\U0001F1F5",
          "\n", "\n\n", "\t", "  ", "don't", "I'M", "123 456", "<|endoftext|>", "\"quoted\"", "back\\slash",
          "\u2028", "\u00a0", "e\u0301", "\U00010400", "$100", "!!!", "\r\n"]
docs = []
for i in range(400):
    if i % 37 == 5:
        docs.append("")                     # empty text: a document of <|endoftext|> alone
    elif i % 53 == 7:
        docs.append(" \n\n ")
    elif i == 11:
        docs.append("nul \u0000 inside")   # valid JSON (\u0000), valid UTF-8
    else:
        docs.append(" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))))
def line(k, doc):
    # Escapes (\u00e9, surrogate pairs for emoji) on every other line, raw UTF-8 on the rest;
    # the text field anywhere among others, a decoy "text" inside a nested object.
    obj = {"id": k, "meta": {"text": "not this", "n": [1, 2.5, None, True]}, "text": doc} if k % 3 else {"text": doc, "id": k}
    return json.dumps(obj, ensure_ascii=(k % 2 == 0)) + ("\r\n" if k % 10 == 3 else "\n")
def jsonl(path, lo, hi, blank_every=0):
    with open(path, "w", encoding="utf-8", newline="") as f:
        for k in range(lo, hi):
            f.write(line(k, docs[k]))
            if blank_every and k % blank_every == 0:
                f.write("\n")               # blank lines hold no record
jsonl(out + "/a.jsonl", 0, 150, blank_every=25)
jsonl(out + "/b.jsonl", 150, 250)            # -> b.jsonl.zst by the zstd command
with open(out + "/c.jsonl.gz", "wb") as f:  # two gzip members, one after the other
    for lo, hi in ((250, 300), (300, 350)):
        f.write(gzip.compress("".join(line(k, docs[k]) for k in range(lo, hi)).encode("utf-8")))
for k, name in ((350, "d1.txt"), (351, "d2.txt")):
    docs[k] = "A text file\nwith lines \u00e9\U0001F642\n\nand a blank one.\n" * (k - 348)
    open(out + "/" + name, "w", encoding="utf-8", newline="").write(docs[k])
jsonl(out + "/e.jsonl", 352, 400)            # stdin
json.dump(docs, open(out + "/docs.json", "w"))
# The same documents under another field name, with a decoy "text".
with open(out + "/field.jsonl", "w") as f:
    for k in range(0, 60):
        f.write(json.dumps({"text": "decoy", "body": docs[k]}) + "\n")
json.dump(docs[:60], open(out + "/field_docs.json", "w"))
json.dump(docs[:60], open(out + "/first60.json", "w"))
jsonl(out + "/first60.jsonl", 0, 60)

# Bad records, one kind a line (line numbers matter: the messages name them).
bad = [json.dumps({"text": "good one"}), '{"text": "unterminated', None, json.dumps({"title": "no text"}),
       '{"text": 42}', '{"text": "a", "text": "b"}', '["text"]', '{"text": "\\ud800 lone surrogate"}', "",
       json.dumps({"text": "good two"})]
with open(out + "/bad.jsonl", "wb") as f:
    for b in bad:
        f.write(b'{"text": "bad \xff byte"}\n' if b is None else b.encode() + b"\n")
open(out + "/bad_utf8.txt", "wb").write(b"line one\nline two\nbad \xc3\x28 here\n")
open(out + "/many_bad.jsonl", "w").write("{oops\n" * 25 + json.dumps({"text": "the one good"}) + "\n")
# Long enough that a cut in the middle leaves whole lines before it.
# zstd decodes in blocks of up to 128 KiB: about 1 MB, so that half the file holds whole blocks.
trunc_docs = ["truncated corpus line %d: %s" % (k, " ".join(rng.choice(pieces) for _ in range(30))) for k in range(4000)]
with open(out + "/trunc.jsonl", "w") as f:
    for d in trunc_docs:
        f.write(json.dumps({"text": d}) + "\n")
EOF
zstd -q -19 "$C/b.jsonl" -o "$C/b.jsonl.zst" && rm "$C/b.jsonl"
zstd -q "$C/d2.txt" -o "$C/d2.txt.zst" && rm "$C/d2.txt"
zstd -q "$C/trunc.jsonl" -o "$C/full.jsonl.zst"
gzip -c "$C/trunc.jsonl" >"$C/full.jsonl.gz"
head -c $(($(stat -c %s "$C/full.jsonl.zst") / 2)) "$C/full.jsonl.zst" >"$C/trunc.jsonl.zst"
head -c $(($(stat -c %s "$C/full.jsonl.gz") / 2)) "$C/full.jsonl.gz" >"$C/trunc.jsonl.gz"
if ! zstd -t -q "$C/b.jsonl.zst" || zstd -t -q "$C/trunc.jsonl.zst" 2>/dev/null || gzip -t "$C/trunc.jsonl.gz" 2>/dev/null; then
    fail "test inputs: zstd/gzip do not judge the files as this test expects"
fi
INPUTS=("$C/a.jsonl" "$C/b.jsonl.zst" "$C/c.jsonl.gz" "$C/d1.txt" "$C/d2.txt.zst" -)
SHARD=2000 VAL=4500

# ---- 1. every container, ids against the oracle, thread counts ---------------------------
run_ok() {  # label out-dir args...: runs the tool, which must exit 0
    local label=$1 out=$2
    shift 2
    if "${TOOL[@]}" --out-dir "$out" "$@" >"$TMP/$label.out" 2>"$TMP/$label.err"; then return 0; fi
    fail "$label: exit $?: $(head -3 "$TMP/$label.err")"
    return 1
}
run_ok t1 "$TMP/t1" --threads 1 --shard-tokens $SHARD --val-tokens $VAL "${INPUTS[@]}" <"$C/e.jsonl"
# Many small batches (records longer than a batch too), four threads on two cores.
run_ok t4 "$TMP/t4" --threads 4 --batch-bytes 3000 --shard-tokens $SHARD --val-tokens $VAL "${INPUTS[@]}" <"$C/e.jsonl"
run_ok field "$TMP/field" --text-field body --shard-tokens 500 --val-tokens 700 "$C/field.jsonl"
run_ok first60 "$TMP/first60" --shard-tokens 500 --val-tokens 700 "$C/first60.jsonl"
if [ -s "$TMP/t1/corpus_manifest.txt" ] && diff -r "$TMP/t1" "$TMP/t4" >/dev/null; then
    pass "--threads 1 and --threads 4 (3000-byte batches): $(ls "$TMP/t1" | wc -l) files byte-identical"
else
    fail "--threads 1 and --threads 4 outputs differ: $(diff -rq "$TMP/t1" "$TMP/t4" 2>&1 | head -3)"
fi
if grep -q "^input 150 0 .* $C/a.jsonl$" "$TMP/t1/corpus_manifest.txt" && grep -q "^input 48 0 [0-9]* -$" "$TMP/t1/corpus_manifest.txt" &&
   grep -q "^documents 400 0$" "$TMP/t1/corpus_manifest.txt"; then
    pass "manifest: documents per input (150 from a.jsonl, 48 from stdin), 400 in all, no bad record"
else
    fail "manifest inputs: $(grep -E '^(input|documents)' "$TMP/t1/corpus_manifest.txt" | tr '\n' ';')"
fi
if cmp -s "$TMP/field/corpus_val_000000.bin" "$TMP/first60/corpus_val_000000.bin" &&
   diff <(cut -d' ' -f1-6 "$TMP/field/corpus_manifest.txt" | grep ^shard) <(cut -d' ' -f1-6 "$TMP/first60/corpus_manifest.txt" | grep ^shard) >/dev/null; then
    pass "--text-field body (with a decoy \"text\") gives the shards of the same documents under \"text\""
else
    fail "--text-field body differs from the same documents under \"text\""
fi

# The default val split: a tenth of the corpus (checked by the oracle below), capped at one
# shard's worth: with 500-token shards the cap decides once 5000 tokens are held back, in
# mid-stream; a train split always remains.
run_ok default "$TMP/default" --text-field body --shard-tokens 100000 "$C/field.jsonl"
run_ok capped "$TMP/capped" --threads 2 --shard-tokens 500 "${INPUTS[@]}" <"$C/e.jsonl"
printf '{"text": "hi"}\n' >"$C/two_tokens.jsonl"
if run_ok two_tokens "$TMP/two" "$C/two_tokens.jsonl" && grep -q "^total 2 2 1 1$" "$TMP/two/corpus_manifest.txt"; then
    pass "a 2-token corpus: 1 val token, 1 train token"
else
    fail "a 2-token corpus: $(grep ^total "$TMP/two/corpus_manifest.txt" 2>/dev/null)"
fi

# ---- 2. bad records: FILE:LINE messages, skip counts them ---------------------------------
BAD_IN=("$C/bad.jsonl" "$C/trunc.jsonl.zst" "$C/trunc.jsonl.gz" "$C/bad_utf8.txt")
"${TOOL[@]}" --out-dir "$TMP/skip" --threads 2 --shard-tokens 3000 --val-tokens 100 "${BAD_IN[@]}" >"$TMP/skip.out" 2>"$TMP/skip.err"
rc=$?
expect_warning() {  # pattern label
    if grep -q -- "^warning: $1 (skipped)$" "$TMP/skip.err"; then pass "skip: $2: '$(grep -- "^warning: $1" "$TMP/skip.err" | sed "s|$C/||")'"
    else fail "skip: $2: no warning '$1' in: $(sed "s|$C/||" "$TMP/skip.err" | tr '\n' '|')"; fi
}
B=$C/bad.jsonl
expect_warning "$B:2: invalid JSON: .*" "invalid JSON"
expect_warning "$B:3: invalid UTF-8 .*" "invalid UTF-8 in JSON"
expect_warning "$B:4: no \"text\" field" "missing field"
expect_warning "$B:5: field \"text\" is a number, not a string" "non-string field"
expect_warning "$B:6: invalid JSON: duplicate object key.*" "duplicate key"
expect_warning "$B:7: not a JSON object but an array" "not an object"
expect_warning "$B:8: invalid JSON: invalid Unicode '.uD800'.*" "lone surrogate escape"
expect_warning "$C/trunc.jsonl.zst:[0-9]*: truncated zstd frame" "truncated zstd frame"
expect_warning "$C/trunc.jsonl.gz:[0-9]*: truncated gzip stream" "truncated gzip stream"
expect_warning "$C/bad_utf8.txt:3: invalid UTF-8 (byte 0xC3)" "invalid UTF-8 in a text file, at its line"
zline=$(sed -n "s|^warning: $C/trunc.jsonl.zst:\([0-9]*\): .*|\1|p" "$TMP/skip.err")
gline=$(sed -n "s|^warning: $C/trunc.jsonl.gz:\([0-9]*\): .*|\1|p" "$TMP/skip.err")
if [ $rc -eq 0 ] && grep -q "^prepro_corpus: 10 bad records skipped" "$TMP/skip.err" &&
   [ "$(grep -c '^warning: .*(skipped)$' "$TMP/skip.err")" = 10 ] && grep -q "^documents $((2 + zline - 1 + gline - 1)) 10$" "$TMP/skip/corpus_manifest.txt" &&
   [ "${zline:-0}" -gt 100 ] && [ "${zline:-9999}" -lt 4000 ] && [ "${gline:-0}" -gt 100 ] && [ "${gline:-9999}" -lt 4000 ]; then
    pass "skip: exit 0, 10 bad records counted and named; the truncated streams kept their $((zline - 1)) and $((gline - 1)) whole lines"
else
    fail "skip: exit $rc, zstd line '$zline', gzip line '$gline', $(grep -E '^(documents|prepro)' "$TMP/skip/corpus_manifest.txt" "$TMP/skip.err" | tr '\n' '|')"
fi
# What was kept: the two good lines and each truncated stream's whole lines (the line it
# reached is lost): the same shards as those lines in plain JSONL (checked by the oracle below).
printf '{"text": "good one"}\n{"text": "good two"}\n' >"$C/good.jsonl"
head -n $((${zline:-1} - 1)) "$C/trunc.jsonl" >"$C/zkept.jsonl"
head -n $((${gline:-1} - 1)) "$C/trunc.jsonl" >"$C/gkept.jsonl"
run_ok kept "$TMP/kept" --shard-tokens 3000 --val-tokens 100 "$C/good.jsonl" "$C/zkept.jsonl" "$C/gkept.jsonl"
if [ -s "$TMP/kept/corpus_manifest.txt" ] && [ "$(ls "$TMP/skip" | wc -l)" -gt 10 ] &&
   diff <(cd "$TMP/skip" && cksum *.bin) <(cd "$TMP/kept" && cksum *.bin) >/dev/null &&
   diff <(grep ^shard "$TMP/skip/corpus_manifest.txt") <(grep ^shard "$TMP/kept/corpus_manifest.txt") >/dev/null; then
    pass "skip: the shards hold exactly the good records and the truncated streams' whole lines ($(ls "$TMP/skip" | grep -c bin) shards)"
else
    fail "skip: the shards differ from those of the good records alone"
fi
"${TOOL[@]}" --out-dir "$TMP/many" "$C/many_bad.jsonl" >/dev/null 2>"$TMP/many.err"
if [ "$(grep -c '(skipped)$' "$TMP/many.err")" = 20 ] && grep -q "^warning: more bad records: counted, not shown$" "$TMP/many.err" &&
   grep -q "^prepro_corpus: 25 bad records skipped" "$TMP/many.err"; then
    pass "skip: 25 bad records: 20 warnings, one line for the rest, all 25 counted"
else
    fail "skip: 25 bad records: $(tail -3 "$TMP/many.err" | tr '\n' '|')"
fi

# ---- 3. the oracle: ids, shard sizes, val first, manifest CRC32Cs ---------------------------
if "$PY" dev/test/check_corpus.py --encoder "$ENCODER" --merges "$MERGES" \
    --case "$C/docs.json" "$TMP/t1" $SHARD $VAL \
    --case "$C/field_docs.json" "$TMP/field" 500 700 \
    --case "$C/field_docs.json" "$TMP/default" 100000 default \
    --case "$C/docs.json" "$TMP/capped" 500 default >"$TMP/check.log" 2>&1; then
    sed 's/^/  ok   /' "$TMP/check.log"
else
    cat "$TMP/check.log"; fail "check_corpus.py"
fi

# ---- 4. the trainer reads the shards -------------------------------------------------------
if [ -x ./train_gpt2 ]; then
    if ./train_gpt2 -i "$TMP/t1/*train*.bin" -j "$TMP/t1/*val*.bin" -e d2 -b 2 -t 64 -x 2 -v 2 -m 2 -s 0 \
        --tokenizer "$TMP/t1/gpt2_tokenizer.bin" >"$TMP/train.log" 2>&1 && grep -q "^step *2/2" "$TMP/train.log" &&
        grep -qi "val" "$TMP/train.log"; then
        pass "train_gpt2 -i '$(basename "$TMP")/t1/*train*.bin' -j '*val*.bin' -e d2: 2 steps and a validation"
    else
        tail -5 "$TMP/train.log"; fail "train_gpt2 on the shards"
    fi
    # A pattern that matches nothing: the message says what the folder holds (here a val
    # shard alone), not the tinyshakespeare advice, which is for the default paths only.
    mkdir -p "$TMP/val_only" && cp "$TMP/t1/corpus_val_000000.bin" "$TMP/val_only/"
    ./train_gpt2 -i "$TMP/val_only/corpus_train_*.bin" -e d2 -b 2 -t 64 -x 1 >"$TMP/none.log" 2>&1
    if grep -q "^error: no token shard matches '.*/val_only/corpus_train_\*.bin': '.*/val_only' holds 1 other .bin file (corpus_val_000000.bin)$" "$TMP/none.log" &&
       ! grep -q "make data" "$TMP/none.log"; then
        pass "train_gpt2 on a folder without train shards: '$(grep ^error: "$TMP/none.log" | sed "s|$TMP/||g")'"
    else
        fail "train_gpt2 on a folder without train shards: $(head -3 "$TMP/none.log")"
    fi
else
    fail "./train_gpt2 is not built (make train_gpt2)"
fi

# ---- 5. stop: one error line, exit 1, no shard left ----------------------------------------
expect_stop() {  # label pattern args...
    local label=$1 pattern=$2 rc
    shift 2
    rm -rf "$TMP/stop"
    "${TOOL[@]}" --out-dir "$TMP/stop" --on-error stop --shard-tokens 300 --val-tokens 300 "$@" >/dev/null 2>"$TMP/stop.err"
    rc=$?
    local left
    left=$(ls -A "$TMP/stop" 2>/dev/null | grep -v '^gpt2_tokenizer.bin$')
    if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/stop.err")" = 1 ] && grep -q -- "^error: $pattern" "$TMP/stop.err" && [ -z "$left" ]; then
        pass "stop: $label: exit 1, '$(sed "s|$C/||" "$TMP/stop.err")', nothing left"
    else
        fail "stop: $label: exit $rc, stderr '$(head -3 "$TMP/stop.err" | tr '\n' '|')', left: $left"
    fi
}
# a.jsonl first, so that shards were complete before the bad record
expect_stop "invalid JSON after 10+ shards" "$C/bad.jsonl:2: invalid JSON" "$C/a.jsonl" "$C/bad.jsonl"
expect_stop "truncated zstd" "$C/trunc.jsonl.zst:[0-9]*: truncated zstd frame" "$C/trunc.jsonl.zst"
expect_stop "truncated gzip" "$C/trunc.jsonl.gz:[0-9]*: truncated gzip stream" "$C/trunc.jsonl.gz"
expect_stop "invalid UTF-8 in a text file" "$C/bad_utf8.txt:3: invalid UTF-8" "$C/a.jsonl" "$C/bad_utf8.txt"
printf '{"text": "x"}\n{"text": 1}\n' | expect_stop "stdin" "<stdin>:2: field \"text\" is a number" -

# ---- 6. unusable inputs and outputs: one error, exit 1 -------------------------------------
expect_error() {  # label pattern args...
    local label=$1 pattern=$2 rc
    shift 2
    "${TOOL[@]}" "$@" >/dev/null 2>"$TMP/err.txt" </dev/null
    rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/err.txt")" = 1 ] && grep -q -- "$pattern" "$TMP/err.txt"; then
        pass "$label: exit 1, '$(sed "s|$TMP/||g" "$TMP/err.txt" | cut -c1-110)'"
    else
        fail "$label: exit $rc, stderr: $(head -3 "$TMP/err.txt")"
    fi
}
expect_error "missing input" "cannot read input '$C/nope.jsonl': No such file" --out-dir "$TMP/e1" "$C/a.jsonl" "$C/nope.jsonl"
chmod 000 "$C/first60.jsonl"
if [ "$(id -u)" = 0 ]; then
    echo "  (unreadable file: root reads anything; checked as a directory instead)"
    mkdir "$C/dir.jsonl"
    expect_error "input is a directory" "input '$C/dir.jsonl' is a directory" --out-dir "$TMP/e1" "$C/dir.jsonl"
else
    expect_error "unreadable input" "Permission denied" --out-dir "$TMP/e1" "$C/first60.jsonl"
fi
chmod 644 "$C/first60.jsonl"
expect_error "unknown format" "cannot tell its format" --out-dir "$TMP/e1" "$C/docs.json"
expect_error "missing output parent dir" "cannot create output directory '$TMP/no/such'" --out-dir "$TMP/no/such" "$C/a.jsonl"
expect_error "existing shards of the name" "already holds 'corpus_.*' of a corpus named 'corpus'" --out-dir "$TMP/first60" "$C/first60.jsonl"
expect_error "bad --on-error" "--on-error wants skip or stop" --out-dir "$TMP/e1" --on-error maybe "$C/a.jsonl"
printf '\n \n\n' >"$C/blank.jsonl"
expect_error "no documents" "no documents" --out-dir "$TMP/e2" "$C/blank.jsonl"
printf '{"text": ""}\n' >"$C/one_token.jsonl"
expect_error "a 1-token corpus" "the corpus holds 1 token: too few for a val and a train split" --out-dir "$TMP/e1" \
    "$C/one_token.jsonl"
expect_error "--val-tokens of the whole corpus" "--val-tokens 100000 takes all [0-9]* tokens of the corpus: no train split" \
    --out-dir "$TMP/e1" --shard-tokens 300 --val-tokens 100000 "$C/first60.jsonl"
if [ -e "$TMP/e1" ] && [ -n "$(ls -A "$TMP/e1")" ]; then fail "a refused run left files in $TMP/e1: $(ls "$TMP/e1")"; fi

# A full disk (a 64 KiB tmpfs in a private mount namespace, root only): one error naming
# the file, exit 1, and neither the shard's temporary nor the shards before it left.
if [ "$(id -u)" != 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
    echo "SKIPPED full_disk: needs root and unshare -m for a small tmpfs (not run here)"
else
    unshare -m --propagation private bash -c '
        fs=$1; shift
        mkdir -p "$fs" && mount -t tmpfs -o size=64k tmpfs "$fs" || exit 97
        "$@" --out-dir "$fs/out" >/dev/null 2>"$fs.err"
        rc=$?
        ls -A "$fs/out" >"$fs.left"
        exit $rc' _ "$TMP/fs" "${TOOL[@]}" --shard-tokens 4000 --val-tokens 0 "$C/trunc.jsonl" >/dev/null 2>&1
    rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/fs.err")" = 1 ] && grep -q "No space left on device" "$TMP/fs.err" &&
       ! grep -q '\.bin' "$TMP/fs.left"; then
        pass "full disk: exit 1, '$(sed "s|$TMP/||g" "$TMP/fs.err" | cut -c1-100)', no shard left"
    else
        fail "full disk: exit $rc, stderr '$(cat "$TMP/fs.err" 2>/dev/null)', left: $(tr '\n' ' ' <"$TMP/fs.left" 2>/dev/null)"
    fi
fi

verdict test_corpus
