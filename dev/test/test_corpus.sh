#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# Tests of prepro_corpus (tools/prepro_corpus.c): corpora this test makes itself
# (Unicode, emoji, newlines, empty texts, JSON escapes and surrogate pairs, a byte order
# mark, numbers beyond int64 and double in other fields) in every container (plain JSONL,
# zstd and gzip through their own command-line tools, text files, stdin), and damaged
# containers: a truncated or corrupt gzip member or zstd frame yields no token. The oracle for the ids is dev/test/bpe_reference.py (through check_corpus.py,
# which also checks names, sizes, headers and CRC32Cs with crc32c_reference.py); the
# documents it encodes are this script's Python strings, not the tool's parsing of them.
# Exits 0 only if every check passes.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
source dev/test/data_checks.sh

build_or_exit prepro_corpus
for tool in zstd gzip; do
    command -v $tool >/dev/null || fatal "the $tool command is there (scripts/install_deps.sh installs it)"
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
       json.dumps({"text": "good two"}), '{"text": 1e99999}']
with open(out + "/bad.jsonl", "wb") as f:
    for b in bad:
        f.write(b'{"text": "bad \xff byte"}\n' if b is None else b.encode() + b"\n")
open(out + "/bad_utf8.txt", "wb").write(b"line one\nline two\nbad \xc3\x28 here\n")
open(out + "/many_bad.jsonl", "w").write("{oops\n" * 25 + json.dumps({"text": "the one good"}) + "\n")
# A byte order mark before the first record (some Windows tools write one), and numbers
# beyond int64 and double in fields other than the text: the documents of first60.jsonl.
open(out + "/bom.jsonl", "w", encoding="utf-8").write("\ufeff" + open(out + "/first60.jsonl", encoding="utf-8").read())
open(out + "/bom.txt", "w", encoding="utf-8").write("\ufeff" + docs[350])
with open(out + "/numbers.jsonl", "w") as f:
    for k in range(60):
        big = ["1e99999", "-1e99999", "123456789012345678901234567890", "-98765432109876543210987654321.5e3"][k % 4]
        f.write('{"n": %s, "text": %s, "m": [%s, {"x": %s}]}\n' % (big, json.dumps(docs[k]), big, big))
# Four thousand lines, compressed below as four gzip members and four zstd frames.
trunc_docs = ["truncated corpus line %d: %s" % (k, " ".join(rng.choice(pieces) for _ in range(30))) for k in range(4000)]
with open(out + "/trunc.jsonl", "w") as f:
    for d in trunc_docs:
        f.write(json.dumps({"text": d}) + "\n")
EOF
zstd -q -19 "$C/b.jsonl" -o "$C/b.jsonl.zst" && rm "$C/b.jsonl"
zstd -q "$C/d2.txt" -o "$C/d2.txt.zst" && rm "$C/d2.txt"
# Damaged containers of four members (frames) of 1000 lines each, cut or corrupted inside
# the third: a member's checksum comes at its end, so only the first two can be verified.
# END[z,k] is where member k ends (the sizes of the tools' outputs added up).
split -l 1000 -d "$C/trunc.jsonl" "$C/part."
declare -A END START
for k in 0 1 2 3; do
    zstd -q -c "$C/part.0$k" >"$C/part.zst" && gzip -c "$C/part.0$k" >"$C/part.gz" || not_ok "compressing part $k"
    for z in zst gz; do
        cat "$C/part.$z" >>"$C/full.jsonl.$z"
        END[$z,$k]=$(stat -c %s "$C/full.jsonl.$z")
    done
done
head -n 2000 "$C/trunc.jsonl" >"$C/first2000.jsonl"
for z in zst gz; do
    START[$z]=${END[$z,1]}  # where the third member begins
    head -c $(((START[$z] + END[$z,2]) / 2)) "$C/full.jsonl.$z" >"$C/trunc.jsonl.$z"
    cp "$C/full.jsonl.$z" "$C/corrupt.jsonl.$z"
done
# The damage that once passed: 8 bytes overwritten in the middle of gzip member 3, one bit flipped in zstd frame 3.
printf 'XXXXXXXX' | dd of="$C/corrupt.jsonl.gz" bs=1 seek=$(((START[gz] + END[gz,2]) / 2)) conv=notrunc status=none
"$PY" -c 'import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 1]))' "$C/corrupt.jsonl.zst" \
    $(((START[zst] + END[zst,2]) / 2))
zstd -q --no-check -c "$C/first60.jsonl" >"$C/unchecked.jsonl.zst"
if ! zstd -t -q "$C/b.jsonl.zst" || zstd -t -q "$C/trunc.jsonl.zst" 2>/dev/null || gzip -t "$C/trunc.jsonl.gz" 2>/dev/null ||
   zstd -t -q "$C/corrupt.jsonl.zst" 2>/dev/null || gzip -t "$C/corrupt.jsonl.gz" 2>/dev/null || ! zstd -t -q "$C/full.jsonl.zst" ||
   ! gzip -t "$C/full.jsonl.gz"; then
    not_ok "test inputs: zstd/gzip do not judge the files as this test expects"
fi
INPUTS=("$C/a.jsonl" "$C/b.jsonl.zst" "$C/c.jsonl.gz" "$C/d1.txt" "$C/d2.txt.zst" -)
SHARD=2000 VAL=4500

# ---- 1. every container, ids against the oracle, thread counts ---------------------------
run_ok() {  # label out-dir args...: runs the tool, which must exit 0
    local label=$1 out=$2
    shift 2
    if "${TOOL[@]}" --out-dir "$out" "$@" >"$TMP/$label.out" 2>"$TMP/$label.err"; then return 0; fi
    not_ok "$label: exit $?: $(head -3 "$TMP/$label.err")"
    return 1
}
run_ok t1 "$TMP/t1" --threads 1 --shard-tokens $SHARD --val-tokens $VAL "${INPUTS[@]}" <"$C/e.jsonl"
# Many small batches (records longer than a batch too), four threads on two cores.
run_ok t4 "$TMP/t4" --threads 4 --batch-bytes 3000 --shard-tokens $SHARD --val-tokens $VAL "${INPUTS[@]}" <"$C/e.jsonl"
run_ok field "$TMP/field" --text-field body --shard-tokens 500 --val-tokens 700 "$C/field.jsonl"
run_ok first60 "$TMP/first60" --shard-tokens 500 --val-tokens 700 "$C/first60.jsonl"
if [ -s "$TMP/t1/corpus_manifest.txt" ] && diff -r -x .lock "$TMP/t1" "$TMP/t4" >/dev/null; then
    ok "--threads 1 and --threads 4 (3000-byte batches): $(ls "$TMP/t1" | wc -l) files byte-identical"
else
    not_ok "--threads 1 and --threads 4 outputs differ: $(diff -rq -x .lock "$TMP/t1" "$TMP/t4" 2>&1 | head -3)"
fi
if grep -q "^input 150 0 .* $C/a.jsonl$" "$TMP/t1/corpus_manifest.txt" && grep -q "^input 48 0 [0-9]* -$" "$TMP/t1/corpus_manifest.txt" &&
   grep -q "^documents 400 0$" "$TMP/t1/corpus_manifest.txt"; then
    ok "manifest: documents per input (150 from a.jsonl, 48 from stdin), 400 in all, no bad record"
else
    not_ok "manifest inputs: $(grep -E '^(input|documents)' "$TMP/t1/corpus_manifest.txt" | tr '\n' ';')"
fi
if cmp -s "$TMP/field/corpus_val_000000.bin" "$TMP/first60/corpus_val_000000.bin" &&
   diff <(cut -d' ' -f1-6 "$TMP/field/corpus_manifest.txt" | grep ^shard) <(cut -d' ' -f1-6 "$TMP/first60/corpus_manifest.txt" | grep ^shard) >/dev/null; then
    ok "--text-field body (with a decoy \"text\") gives the shards of the same documents under \"text\""
else
    not_ok "--text-field body differs from the same documents under \"text\""
fi

# A byte order mark is no part of the first record (or of a text file's document), and a
# number too large for int64 or double in another field leaves the text field readable:
# the same shards as without them.
same_shards() {  # label dir-a dir-b: byte-identical shards, listed alike in the manifests
    if [ -s "$2/corpus_manifest.txt" ] && diff <(cd "$2" && cksum *.bin) <(cd "$3" && cksum *.bin) >/dev/null &&
       diff <(grep ^shard "$2/corpus_manifest.txt") <(grep ^shard "$3/corpus_manifest.txt") >/dev/null; then
        ok "$1 ($(grep -c ^shard "$2/corpus_manifest.txt") shards)"
    else
        not_ok "$1: the shards differ: $(grep -E '^(shard|documents)' "$2/corpus_manifest.txt" "$3/corpus_manifest.txt" 2>&1 | tr '\n' '|' | cut -c1-300)"
    fi
}
run_ok bom "$TMP/bom" --shard-tokens 500 --val-tokens 700 "$C/bom.jsonl" && grep -q "^documents 60 0$" "$TMP/bom/corpus_manifest.txt" &&
    same_shards "a leading byte order mark: all 60 records kept, the shards of the file without it" "$TMP/bom" "$TMP/first60" ||
    not_ok "a leading byte order mark: $(grep ^documents "$TMP/bom/corpus_manifest.txt" 2>&1) $(head -2 "$TMP/bom.err")"
run_ok numbers "$TMP/numbers" --shard-tokens 500 --val-tokens 700 "$C/numbers.jsonl" &&
    grep -q "^documents 60 0$" "$TMP/numbers/corpus_manifest.txt" &&
    same_shards "1e99999 and 30-digit integers in other fields: all 60 records kept, the same shards" "$TMP/numbers" "$TMP/first60" ||
    not_ok "numbers beyond int64 and double: $(grep ^documents "$TMP/numbers/corpus_manifest.txt" 2>&1) $(head -2 "$TMP/numbers.err")"
run_ok bom_txt "$TMP/bom_txt" --val-tokens 10 "$C/bom.txt" && run_ok d1_txt "$TMP/d1_txt" --val-tokens 10 "$C/d1.txt" &&
    same_shards "a text file's byte order mark: the document without it" "$TMP/bom_txt" "$TMP/d1_txt"

# The default val split: a tenth of the corpus (checked by the oracle below), capped at one
# shard's worth: with 500-token shards the cap decides once 5000 tokens are held back, in
# mid-stream; a train split always remains.
run_ok default "$TMP/default" --text-field body --shard-tokens 100000 "$C/field.jsonl"
run_ok capped "$TMP/capped" --threads 2 --shard-tokens 500 "${INPUTS[@]}" <"$C/e.jsonl"
printf '{"text": "hi"}\n' >"$C/two_tokens.jsonl"
if run_ok two_tokens "$TMP/two" "$C/two_tokens.jsonl" && grep -q "^total 2 2 1 1$" "$TMP/two/corpus_manifest.txt"; then
    ok "a 2-token corpus: 1 val token, 1 train token"
else
    not_ok "a 2-token corpus: $(grep ^total "$TMP/two/corpus_manifest.txt" 2>/dev/null)"
fi

# ---- 2. bad records: FILE:LINE messages, skip counts them ---------------------------------
# With the truncated streams (--on-corrupt skip: each keeps the two members before its cut).
BAD_IN=("$C/bad.jsonl" "$C/trunc.jsonl.zst" "$C/trunc.jsonl.gz" "$C/bad_utf8.txt")
"${TOOL[@]}" --out-dir "$TMP/skip" --threads 2 --shard-tokens 3000 --val-tokens 100 --on-corrupt skip "${BAD_IN[@]}" \
    >"$TMP/skip.out" 2>"$TMP/skip.err"
rc=$?
expect_warning() {  # pattern label [ending]: one warning line (ending: "(skipped)", the default)
    local end=${3:-(skipped)}
    if grep -q -- "^warning: $1 $end$" "$TMP/skip.err"; then ok "skip: $2: '$(grep -- "^warning: $1" "$TMP/skip.err" | sed "s|$C/||")'"
    else not_ok "skip: $2: no warning '$1' in: $(sed "s|$C/||" "$TMP/skip.err" | tr '\n' '|')"; fi
}
B=$C/bad.jsonl
expect_warning "$B:2: invalid JSON: .*" "invalid JSON"
expect_warning "$B:3: invalid UTF-8 .*" "invalid UTF-8 in JSON"
expect_warning "$B:4: no \"text\" field" "missing field"
expect_warning "$B:5: field \"text\" is a number, not a string" "non-string field"
expect_warning "$B:6: invalid JSON: duplicate object key.*" "duplicate key"
expect_warning "$B:7: not a JSON object but an array" "not an object"
expect_warning "$B:8: invalid JSON: invalid Unicode '.uD800'.*" "lone surrogate escape"
expect_warning "$B:11: field \"text\" is a number, not a string" "a text field of 1e99999 is a number still"
expect_warning "$C/bad_utf8.txt:3: invalid UTF-8 (byte 0xC3)" "invalid UTF-8 in a text file, at its line"
for z in zst gz; do
    kind=$([ $z = zst ] && echo "zstd frame" || echo "gzip member")
    size=$(stat -c %s "$C/trunc.jsonl.$z")
    expect_warning "$C/trunc.jsonl.$z: truncated $kind starting at byte ${START[$z]} (the file ends at byte $size): dropped from byte ${START[$z]} on, unverified; kept the 2000 whole lines before it" \
        "truncated $kind 3 of 4" "(--on-corrupt skip)"
    if ! grep -q "^unverified ${START[$z]} $((size - START[$z])) $C/trunc.jsonl.$z$" "$TMP/skip/corpus_manifest.txt"; then
        not_ok "skip: the manifest has no 'unverified ${START[$z]} ...' line for trunc.jsonl.$z"
    fi
done
if [ $rc -eq 0 ] && grep -q "^prepro_corpus: 9 bad records skipped" "$TMP/skip.err" &&
   grep -q "^prepro_corpus: 2 inputs ended at a corrupt or truncated member: the unverified rest dropped" "$TMP/skip.err" &&
   [ "$(grep -c '^warning: .*(skipped)$' "$TMP/skip.err")" = 9 ] && grep -q "^documents 4002 9$" "$TMP/skip/corpus_manifest.txt"; then
    ok "skip: exit 0, 9 bad records counted and named; the truncated streams counted apart, their verified 2000 lines each kept"
else
    not_ok "skip: exit $rc, $(grep -E '^(documents|prepro)' "$TMP/skip/corpus_manifest.txt" "$TMP/skip.err" | tr '\n' '|')"
fi
# What was kept: the two good lines and each truncated stream's verified members: the same
# shards as those lines in plain JSONL (checked by the oracle below).
printf '{"text": "good one"}\n{"text": "good two"}\n' >"$C/good.jsonl"
run_ok kept "$TMP/kept" --shard-tokens 3000 --val-tokens 100 "$C/good.jsonl" "$C/first2000.jsonl" "$C/first2000.jsonl"
[ "$(ls "$TMP/skip" | wc -l)" -gt 10 ] || not_ok "skip: too few shards to compare ($(ls "$TMP/skip" | wc -l) files)"
same_shards "skip: the shards hold exactly the good records and the truncated streams' verified members" "$TMP/skip" "$TMP/kept"

# A corrupt member (its checksum fails at its end, after its bytes): by default one error
# naming the file and where the member starts, exit 1, no shard; --on-corrupt skip keeps
# the members before it, and nothing of it.
run_ok first2000 "$TMP/first2000" --shard-tokens 3000 --val-tokens 100 "$C/first2000.jsonl"
for z in zst gz; do
    kind=$([ $z = zst ] && echo "zstd frame" || echo "gzip member")
    f=$C/corrupt.jsonl.$z
    "${TOOL[@]}" --out-dir "$TMP/cstop_$z" --shard-tokens 3000 --val-tokens 100 "$f" >/dev/null 2>"$TMP/cstop_$z.err"
    rc=$?
    left=$(ls -A "$TMP/cstop_$z" 2>/dev/null | grep -v '^\.lock$' | tr '\n' ' ')
    if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/cstop_$z.err")" = 1 ] && [ -z "$left" ] &&
       grep -q "^error: $f: corrupt $kind starting at byte ${START[$z]} (.*): it cannot be verified from there on, so no shard is written" "$TMP/cstop_$z.err"; then
        ok "corrupt $kind 3 of 4: exit 1, '$(sed "s|$C/||" "$TMP/cstop_$z.err" | cut -c1-120)...', nothing left"
    else
        not_ok "corrupt $kind 3 of 4: exit $rc, '$(head -3 "$TMP/cstop_$z.err" | tr '\n' '|')', left: $left"
    fi
    if run_ok "cskip_$z" "$TMP/cskip_$z" --shard-tokens 3000 --val-tokens 100 --on-corrupt skip "$f" &&
       grep -q "^unverified ${START[$z]} $(($(stat -c %s "$f") - START[$z])) $f$" "$TMP/cskip_$z/corpus_manifest.txt" &&
       grep -q "^documents 2000 0$" "$TMP/cskip_$z/corpus_manifest.txt"; then
        same_shards "corrupt $kind 3 of 4, --on-corrupt skip: exactly its 2000 verified lines, the rest counted unverified" \
            "$TMP/cskip_$z" "$TMP/first2000"
    else
        not_ok "corrupt $kind, --on-corrupt skip: $(grep -E '^(unverified|documents)' "$TMP/cskip_$z/corpus_manifest.txt" 2>&1 | tr '\n' '|')"
    fi
done
# A zstd frame without a checksum cannot be verified: said, and read.
if run_ok unchecked "$TMP/unchecked" --shard-tokens 500 --val-tokens 700 "$C/unchecked.jsonl.zst" &&
   grep -q "^warning: $C/unchecked.jsonl.zst: 1 zstd frame without a checksum: corruption inside it cannot be detected" "$TMP/unchecked.err"; then
    same_shards "a zstd frame without a checksum: a warning, and its records" "$TMP/unchecked" "$TMP/first60"
else
    not_ok "a zstd frame without a checksum: no warning: $(cat "$TMP/unchecked.err")"
fi
"${TOOL[@]}" --out-dir "$TMP/many" "$C/many_bad.jsonl" >/dev/null 2>"$TMP/many.err"
if [ "$(grep -c '(skipped)$' "$TMP/many.err")" = 20 ] && grep -q "^warning: more bad records: counted, not shown$" "$TMP/many.err" &&
   grep -q "^prepro_corpus: 25 bad records skipped" "$TMP/many.err"; then
    ok "skip: 25 bad records: 20 warnings, one line for the rest, all 25 counted"
else
    not_ok "skip: 25 bad records: $(tail -3 "$TMP/many.err" | tr '\n' '|')"
fi

# ---- 3. the oracle: ids, shard sizes, val first, manifest CRC32Cs ---------------------------
if "$PY" dev/test/check_corpus.py --encoder "$ENCODER" --merges "$MERGES" \
    --case "$C/docs.json" "$TMP/t1" $SHARD $VAL \
    --case "$C/field_docs.json" "$TMP/field" 500 700 \
    --case "$C/field_docs.json" "$TMP/default" 100000 default \
    --case "$C/docs.json" "$TMP/capped" 500 default >"$TMP/check.log" 2>&1; then
    sed 's/^/  ok   /' "$TMP/check.log"
else
    not_ok "check_corpus.py" "$TMP/check.log"
fi

# ---- 4. the trainer reads the shards -------------------------------------------------------
if [ -x ./train_gpt2 ]; then
    if ./train_gpt2 -i "$TMP/t1/*train*.bin" -j "$TMP/t1/*val*.bin" -e d2 -b 2 -t 64 -x 2 -v 2 -m 2 -s 0 \
        --tokenizer "$TMP/t1/gpt2_tokenizer.bin" >"$TMP/train.log" 2>&1 && grep -q "^step *2/2" "$TMP/train.log" &&
        grep -qi "val" "$TMP/train.log"; then
        ok "train_gpt2 -i '$(basename "$TMP")/t1/*train*.bin' -j '*val*.bin' -e d2: 2 steps and a validation"
    else
        tail -5 "$TMP/train.log"; not_ok "train_gpt2 on the shards"
    fi
    # Samples decode with the corpus's own tokenizer beside the train shards when --tokenizer
    # is not given: a marked one (token i reads "{i}") there, the real one in data/.
    mkdir -p "$TMP/marked" && cp "$TMP/t1"/corpus_* "$TMP/marked/"
    $PY - "$TMP/marked/gpt2_tokenizer.bin" <<'PYEOF'
import struct, sys
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256I", 20240328, 2, 50257, 50256, *([0] * 252)))
    for i in range(50257):
        b = ("{%d}" % i).encode()
        f.write(bytes([len(b)]) + b)
PYEOF
    sample() {  # sample [FLAGS...]: the sample's text of a 1-step run on $TMP/marked
        ./train_gpt2 -i "$TMP/marked/corpus_train_*.bin" -j "$TMP/marked/corpus_val_*.bin" -e d2 -b 2 -t 64 -x 1 -v 0 \
            -s 1 -g 8 "$@" 2>&1 | sed -n '/^generating:/{n;n;p}'
    }
    beside=$(sample) explicit=$(sample --tokenizer data/gpt2_tokenizer.bin)
    mv "$TMP/marked/gpt2_tokenizer.bin" "$TMP/marked_tokenizer.bin"
    fallback=$(sample)
    if [[ $beside =~ ^(\{[0-9]+\})+$ ]] && [[ $explicit != *"{"* ]] && [ -n "$explicit" ] && [ "$fallback" = "$explicit" ]; then
        ok "samples decode with gpt2_tokenizer.bin beside the train shards ('${beside:0:30}...'); --tokenizer wins; without it, data/'s"
    else
        not_ok "the tokenizer beside the shards: beside '$beside', --tokenizer '$explicit', none there '$fallback'"
    fi
    # A dangling link there, or a --tokenizer that is not there: one error each, no silent fall-back.
    ln -s "$TMP/nowhere.bin" "$TMP/marked/gpt2_tokenizer.bin"
    check_match "a dangling gpt2_tokenizer.bin link beside the shards: an error" \
        "^error: .*marked/gpt2_tokenizer.bin, the corpus's tokenizer beside its shards, cannot be read \(a link to a missing file" \
        <(./train_gpt2 -i "$TMP/marked/corpus_train_*.bin" -j "$TMP/marked/corpus_val_*.bin" -e d2 -b 2 -t 64 -x 1 -v 0 -s 1 2>&1)
    rm "$TMP/marked/gpt2_tokenizer.bin"
    check_match "a --tokenizer that is not there: an error" "^error: --tokenizer '$TMP/nowhere.bin': No such file" \
        <(./train_gpt2 -e d2 -b 2 -t 64 -x 1 -v 0 -s 1 --tokenizer "$TMP/nowhere.bin" 2>&1)
    # A pattern that matches nothing: the message says what the folder holds (here a val
    # shard alone), not the tinyshakespeare advice, which is for the default paths only.
    mkdir -p "$TMP/val_only" && cp "$TMP/t1/corpus_val_000000.bin" "$TMP/val_only/"
    ./train_gpt2 -i "$TMP/val_only/corpus_train_*.bin" -e d2 -b 2 -t 64 -x 1 >"$TMP/none.log" 2>&1
    if grep -q "^error: no token shard matches '.*/val_only/corpus_train_\*.bin': '.*/val_only' holds 1 other .bin file (corpus_val_000000.bin)$" "$TMP/none.log" &&
       ! grep -q "make data" "$TMP/none.log"; then
        ok "train_gpt2 on a folder without train shards: '$(grep ^error: "$TMP/none.log" | sed "s|$TMP/||g")'"
    else
        not_ok "train_gpt2 on a folder without train shards: $(head -3 "$TMP/none.log")"
    fi
else
    not_ok "./train_gpt2 is not built (make train_gpt2)"
fi

# ---- 5. stop: one error line, exit 1, no shard left ----------------------------------------
expect_stop() {  # label pattern args...
    local label=$1 pattern=$2 rc
    shift 2
    rm -rf "$TMP/stop"
    "${TOOL[@]}" --out-dir "$TMP/stop" --on-error stop --shard-tokens 300 --val-tokens 300 "$@" >/dev/null 2>"$TMP/stop.err"
    rc=$?
    local left
    left=$(ls -A "$TMP/stop" 2>/dev/null | grep -v '^gpt2_tokenizer.bin$' | grep -v '^\.lock$')
    if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/stop.err")" = 1 ] && grep -q -- "^error: $pattern" "$TMP/stop.err" && [ -z "$left" ]; then
        ok "stop: $label: exit 1, '$(sed "s|$C/||" "$TMP/stop.err")', nothing left"
    else
        not_ok "stop: $label: exit $rc, stderr '$(head -3 "$TMP/stop.err" | tr '\n' '|')', left: $left"
    fi
}
# a.jsonl first, so that shards were complete before the bad record
expect_stop "invalid JSON after 10+ shards" "$C/bad.jsonl:2: invalid JSON" "$C/a.jsonl" "$C/bad.jsonl"
expect_stop "truncated zstd" "$C/trunc.jsonl.zst: truncated zstd frame starting at byte ${START[zst]} " "$C/trunc.jsonl.zst"
expect_stop "truncated gzip" "$C/trunc.jsonl.gz: truncated gzip member starting at byte ${START[gz]} " "$C/trunc.jsonl.gz"
expect_stop "invalid UTF-8 in a text file" "$C/bad_utf8.txt:3: invalid UTF-8" "$C/a.jsonl" "$C/bad_utf8.txt"
printf '{"text": "x"}\n{"text": 1}\n' | expect_stop "stdin" "<stdin>:2: field \"text\" is a number" -

# ---- 6. unusable inputs and outputs: one error, exit 1 -------------------------------------
tool_refuses() {  # label pattern args...
    local label=$1 pattern=$2 rc
    shift 2
    "${TOOL[@]}" "$@" >/dev/null 2>"$TMP/err.txt" </dev/null
    rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l <"$TMP/err.txt")" = 1 ] && grep -q -- "$pattern" "$TMP/err.txt"; then
        ok "$label: exit 1, '$(sed "s|$TMP/||g" "$TMP/err.txt" | cut -c1-110)'"
    else
        not_ok "$label: exit $rc, stderr: $(head -3 "$TMP/err.txt")"
    fi
}
tool_refuses "missing input" "cannot read input '$C/nope.jsonl': No such file" --out-dir "$TMP/e1" "$C/a.jsonl" "$C/nope.jsonl"
chmod 000 "$C/first60.jsonl"
if [ "$(id -u)" = 0 ]; then
    note "unreadable file: root reads anything; checked as a directory instead"
    mkdir "$C/dir.jsonl"
    tool_refuses "input is a directory" "input '$C/dir.jsonl' is a directory" --out-dir "$TMP/e1" "$C/dir.jsonl"
else
    tool_refuses "unreadable input" "Permission denied" --out-dir "$TMP/e1" "$C/first60.jsonl"
fi
chmod 644 "$C/first60.jsonl"
tool_refuses "unknown format" "cannot tell its format" --out-dir "$TMP/e1" "$C/docs.json"
# Missing parents of --out-dir are made (as mkdir -p); a parent that is a file is an error.
if "${TOOL[@]}" --out-dir "$TMP/no/such/dir" "$C/first60.jsonl" >/dev/null 2>"$TMP/err.txt" &&
    [ -f "$TMP/no/such/dir/corpus_manifest.txt" ]; then
    ok "missing parents of --out-dir are created: $TMP/no/such/dir holds the corpus"
else
    not_ok "--out-dir with missing parents: $(head -3 "$TMP/err.txt")"
fi
touch "$TMP/a_file"
tool_refuses "an --out-dir parent that is a file" "cannot create directory '$TMP/a_file/x' for --out-dir '$TMP/a_file/x/y': Not a directory" \
    --out-dir "$TMP/a_file/x/y" "$C/a.jsonl"
tool_refuses "existing corpus of the name" "already holds a corpus named 'corpus', complete (corpus_manifest.txt and [0-9]* shards), prepared from other inputs or settings" --out-dir "$TMP/first60" "$C/first60.jsonl"
tool_refuses "bad --on-error" "--on-error wants skip or stop" --out-dir "$TMP/e1" --on-error maybe "$C/a.jsonl"
tool_refuses "--name .." "--name '..': want a plain file name prefix" --out-dir "$TMP/e1" --name .. "$C/a.jsonl"
tool_refuses "--name with a slash" "--name 'x/y': want a plain file name prefix" --out-dir "$TMP/e1" --name x/y "$C/a.jsonl"
tool_refuses "stdin given twice" "- is given twice: standard input can be read once" --out-dir "$TMP/e1" - "$C/a.jsonl" -
printf '\n \n\n' >"$C/blank.jsonl"
tool_refuses "no documents" "no documents" --out-dir "$TMP/e2" "$C/blank.jsonl"
printf '{"text": ""}\n' >"$C/one_token.jsonl"
tool_refuses "a 1-token corpus" "the corpus holds 1 token: too few for a val and a train split" --out-dir "$TMP/e1" \
    "$C/one_token.jsonl"
tool_refuses "--val-tokens of the whole corpus" "--val-tokens 100000 takes all [0-9]* tokens of the corpus: no train split" \
    --out-dir "$TMP/e1" --shard-tokens 300 --val-tokens 100000 "$C/first60.jsonl"
if [ -e "$TMP/e1" ] && [ -n "$(ls -A "$TMP/e1" | grep -v '^\.lock$')" ]; then not_ok "a refused run left files in $TMP/e1: $(ls "$TMP/e1")"; fi

# A full disk (a 64 KiB tmpfs in a private mount namespace, root only): one error naming
# the file, exit 1, and neither the shard's temporary nor the shards before it left.
if [ "$(id -u)" != 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
    skip "full_disk" "needs root and unshare -m for a small tmpfs (not run here)"
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
        ok "full disk: exit 1, '$(sed "s|$TMP/||g" "$TMP/fs.err" | cut -c1-100)', no shard left"
    else
        not_ok "full disk: exit $rc, stderr '$(cat "$TMP/fs.err" 2>/dev/null)', left: $(tr '\n' ' ' <"$TMP/fs.left" 2>/dev/null)"
    fi
fi

# A .gz input swapped after the verifier passed it, while the reader was still on the input
# before it (stopped as it is about to open this one: LLMC_TEST_STOP=corpus_input:0:1; a
# 300 KB first input read 4 KB a batch, each tokenized before the next is read, gives the
# verifier, which reads ahead on its own thread, the time): renamed over, or rewritten in
# place. Exit 1 naming the input, and no corpus committed.
mkdir -p "$TMP/swap"
$PY - "$TMP/swap" <<'PYEOF'
import gzip, json, sys
out = sys.argv[1]
with open(out + "/big.jsonl", "w") as f:
    for k in range(1500):
        f.write(json.dumps({"text": "the first input, long enough to keep the reader busy, line %d. " % k * 3}) + "\n")
for name, word in (("a", "verified"), ("b", "swapped in")):
    with open("%s/%s.jsonl.gz" % (out, name), "wb") as f:
        f.write(gzip.compress("".join(json.dumps({"text": "%s %d" % (word, k)}) + "\n" for k in range(50)).encode()))
PYEOF
for how in renamed rewritten; do
    cp "$TMP/swap/a.jsonl.gz" "$TMP/swap/in_$how.jsonl.gz"
    LLMC_TEST_STOP=corpus_input:0:1 "${TOOL[@]}" --threads 1 --batch-bytes 4096 --shard-tokens 100000 --val-tokens 0 \
        --out-dir "$TMP/swap/out_$how" \
        "$TMP/swap/big.jsonl" "$TMP/swap/in_$how.jsonl.gz" >/dev/null 2>"$TMP/swap/$how.err" &
    pid=$!
    if wait_stopped "$TMP/swap/$how.err" 1 >/dev/null; then
        if [ $how = renamed ]; then cp "$TMP/swap/b.jsonl.gz" "$TMP/swap/b_copy.gz" && mv "$TMP/swap/b_copy.gz" "$TMP/swap/in_$how.jsonl.gz"
        else cat "$TMP/swap/b.jsonl.gz" >"$TMP/swap/in_$how.jsonl.gz"; fi
        kill -CONT $pid
    fi
    wait $pid
    rc=$?
    if [ $rc = 1 ] && grep -q "^error: input '.*in_$how.jsonl.gz' changed after it was verified" "$TMP/swap/$how.err" &&
        [ -z "$(ls "$TMP/swap/out_$how" 2>/dev/null | grep -v '^\.lock$')" ]; then
        ok "input $how after its verification: exit 1, $(grep '^error:' "$TMP/swap/$how.err" | sed "s|$TMP/||g" | cut -c1-120), nothing committed"
    else
        not_ok "input $how after its verification: exit $rc, left: $(ls "$TMP/swap/out_$how" 2>/dev/null | tr '\n' ' ')" "$TMP/swap/$how.err"
    fi
done
# "--" ends the options: an input named -x.jsonl after it is an input.
cp "$TMP/swap/big.jsonl" "$TMP/swap/-x.jsonl"
check "-- then an input named -x.jsonl: read as an input" bash -c 'cd "$1" && shift && "$@" --out-dir out_dash -- -x.jsonl' \
    _ "$TMP/swap" "$PWD/prepro_corpus" --encoder "$ENCODER" --merges "$MERGES" --progress 0
# An input name holding a newline would start a line of the manifest: refused.
mkdir -p "$TMP/nl" && nl_name="$TMP/nl/x"$'\n'"shard train 1 1026 0 y.bin .jsonl" && cp "$TMP/swap/big.jsonl" "$nl_name"
"${TOOL[@]}" --out-dir "$TMP/nl/out" "$nl_name" >/dev/null 2>"$TMP/nl.err"
rc=$?
if [ $rc = 1 ] && grep -q "holds a control character (byte 10" "$TMP/nl.err" && [ ! -e "$TMP/nl/out/corpus_manifest.txt" ]; then
    ok "an input name with a newline: refused ($(cut -c1-60 "$TMP/nl.err" | head -1)...)"
else
    not_ok "an input name with a newline: exit $rc" "$TMP/nl.err"
fi

done_testing
