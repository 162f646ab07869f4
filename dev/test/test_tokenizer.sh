#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# Tests of the C data pipeline: GPT-2 BPE (tools/bpe.h), prepro_text, the tokenizer file
# and its decoder (run/tokenizer.h). The oracle is dev/test/bpe_reference.py, an
# independent Python BPE; expected ids below are GPT-2's published ones.
# Inputs: $LLMC_DATA_DIR (default <repo>/dev/data)/{gpt2/encoder.json,gpt2/vocab.bpe,
# tinyshakespeare/input.txt}. Exits 0 only if every check passes.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
source dev/test/data_checks.sh
SHAKESPEARE=$DATA_DIR/tinyshakespeare/input.txt
SAMPLE=$ROOT/dev/test/data/utf8_sample.txt
CC_FLAGS="-std=c11 -D_DEFAULT_SOURCE -O3 -march=native -Wall -Wextra -Wno-unused-parameter -Wno-unused-function -fopenmp -I."

for f in "$ENCODER" "$MERGES" "$SHAKESPEARE"; do
    [ -f "$f" ] || fatal "missing input $f (docs/data.md, 'The inputs in the repository', says where it comes from)"
done

build_or_exit prepro_text
TOOL=(./prepro_text --encoder "$ENCODER" --merges "$MERGES")

# 1. Known GPT-2 ids (from GPT-2's vocabulary, not from this code).
expect_ids() {  # text expected-ids
    local got
    got=$(printf '%s' "$1" | "${TOOL[@]}" --encode-stdin)
    if [ "$got" = "$2" ]; then ok "encode $(printf '%q' "$1") -> $2"; else not_ok "encode $(printf '%q' "$1") -> '$got', want '$2'"; fi
}
expect_ids "Hello world" "15496 995"
expect_ids " the" "262"
expect_ids $'\n' "198"
expect_ids $'\n\n' "628"
expect_ids " " "220"

# 2. Lossless: decode(encode(text)) == text.
for f in "$SHAKESPEARE" "$SAMPLE"; do
    if out=$("${TOOL[@]}" --roundtrip "$f"); then ok "$out"; else not_ok "$out"; fi
done

# 3. Identical ids (and pre-token boundaries) to the independent Python BPE.
compare_with_oracle() {  # file label
    local t0 t1
    t0=$(date +%s.%N)
    "${TOOL[@]}" --encode-stdin <"$1" >"$TMP/c.txt" || { not_ok "$2: C encoder failed"; return; }
    t1=$(date +%s.%N)
    "$PY" dev/test/bpe_reference.py --encoder "$ENCODER" --merges "$MERGES" "$1" >"$TMP/py.txt" ||
        { not_ok "$2: oracle failed"; return; }
    local n
    n=$(wc -w <"$TMP/py.txt")
    if [ "$n" -gt 0 ] && cmp -s "$TMP/c.txt" "$TMP/py.txt"; then
        ok "$2: $n ids identical to bpe_reference.py (C encoder: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s incl. loading)"
    else
        not_ok "$2: ids differ from bpe_reference.py (C $(wc -w <"$TMP/c.txt"), Python $n)"
    fi
}
./prepro_text --pretokens-stdin <"$SAMPLE" >"$TMP/c_pre.txt"
"$PY" dev/test/bpe_reference.py --pretokens --encoder "$ENCODER" --merges "$MERGES" "$SAMPLE" >"$TMP/py_pre.txt"
if [ -s "$TMP/py_pre.txt" ] && cmp -s "$TMP/c_pre.txt" "$TMP/py_pre.txt"; then
    ok "utf8_sample: $(wc -w <"$TMP/py_pre.txt") pre-tokens identical to Python's re engine"
else
    not_ok "utf8_sample: pre-token boundaries differ from Python's re engine"
fi
compare_with_oracle "$SAMPLE" "utf8_sample"

# Short edge cases, each its own text (so each has its own end, where \s+(?!\S) differs),
# NUL-separated; both tools handle every record alone and print one line per record.
"$PY" - "$TMP/edge.bin" <<'EOF'
import random
import sys
cases = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "a  ", "a\n\n", "a \n", "a\t ", " a", "  a", "   a",
    "a  b", "a \t b", "x\t\ty", "x \u3000y", "x\u3000\u3000y", "end\u3000", "\u00a0\u00a0x", "x\u2028", "x\u0085 y",
    "a\r\n\r\nb", "a\r\n", "\x0b\x0c x", "\x1c\x1d a", "a\x1fb", "a \x1c!", "x\x1f\x1f!", "'s", "'", "''", "'re'", "'RE", "x'll", " 's",
    "  's", "?'s", "don't", "I'M", "it's's", "'ve'd", "\u2019s", "123abc456", " 123", "  123", "1 2  3",
    "\u0663.\u0661\u0664", " \u0661\u0662", "\u00b2!", "\u2167.", "x\u00bd", "\u0e51\u0e52\u0e3f", "\U0001d7d8!",
    "a\u0301\u0301b", "e\u0301.", "\u0915\u094d\u0937", "\u00df123", "\u0130stanbul", "\U00010400\U00010401",
    "\U0001F642\U0001F642 \U0001F642", " \U0001F468\u200d\U0001F469\u200d\U0001F467", "x\U0001F1EF\U0001F1F5",
    "<|endoftext|>", "a<|endoftext|>b", "!!! ???", " !", "  !", "\t!", "$100", "100%", "...", "\ufeffbom",
    "\u200b", "a\u200bb", "\U000E0041", "\U0010FFFD", "\ud7ff\ue000", "Z\u0308\u0308",
]
# Long pre-tokens exercise the heap merge far from the cache's comfort zone.
rng = random.Random(2)
cases += ["a" * 3001, "ab" * 1500, "!" * 999, "1" * 2000, " " * 500 + "x", "\u00e9" * 777,
          "".join(rng.choice("etaoinshrdlu") for _ in range(4000))]
open(sys.argv[1], "wb").write(b"".join(c.encode("utf-8") + b"\0" for c in cases))
EOF
for mode in pretokens encode; do
    if [ $mode = pretokens ]; then c_flag=--pretokens-stdin; py_flag=--pretokens; else c_flag=--encode-stdin; py_flag=; fi
    "${TOOL[@]}" $c_flag --records <"$TMP/edge.bin" >"$TMP/c_edge.txt"
    "$PY" dev/test/bpe_reference.py $py_flag --records --encoder "$ENCODER" --merges "$MERGES" "$TMP/edge.bin" >"$TMP/py_edge.txt"
    if [ "$(wc -l <"$TMP/py_edge.txt")" -gt 50 ] && cmp -s "$TMP/c_edge.txt" "$TMP/py_edge.txt"; then
        ok "edge cases: $(wc -l <"$TMP/py_edge.txt") texts, $mode identical to the oracle"
    else
        not_ok "edge cases: $mode differ from the oracle (first differing record: line $(cmp "$TMP/c_edge.txt" "$TMP/py_edge.txt" | awk '{print $NF}'))"
    fi
done
compare_with_oracle "$SHAKESPEARE" "tinyshakespeare"

# 4. prepro_text's shards and tokenizer file.
if "${TOOL[@]}" --input "$SHAKESPEARE" --out-dir "$TMP/out" --name ts --val-tokens 32768 >"$TMP/prepro.log" 2>&1; then
    ok "prepro_text: $(head -1 "$TMP/prepro.log")"
    if "$PY" dev/test/check_shards.py --encoder "$ENCODER" --merges "$MERGES" --input "$SHAKESPEARE" \
        --val "$TMP/out/ts_val.bin" --train "$TMP/out/ts_train.bin" --val-tokens 32768 >"$TMP/check.log" 2>&1; then
        ok "$(tail -1 "$TMP/check.log")"
    else
        not_ok "check_shards.py" "$TMP/check.log"
    fi
    if gcc $CC_FLAGS dev/test/test_tokenizer_file.c -o "$TMP/test_tokenizer_file" build/run/librun.a -lm &&
        "$TMP/test_tokenizer_file" "$TMP/out/gpt2_tokenizer.bin" "$TMP/out/ts_val.bin" "$TMP/out/ts_train.bin" \
            "$SHAKESPEARE" >"$TMP/tf.log" 2>"$TMP/tf.err"; then
        ok "$(sed -n 's/^ok [0-9]* - //p' "$TMP/tf.log")"
    else
        diag "$(cat "$TMP/tf.log")"; not_ok "test_tokenizer_file" "$TMP/tf.err"
    fi
    if ls "$TMP/out" | grep -q '\.tmp$'; then not_ok "temporary files left in the output dir"; fi
else
    not_ok "prepro_text did not run" "$TMP/prepro.log"
fi

# 5. Bad input: one message, exit status 1, never a crash.
tool_refuses() {  # label pattern command...
    local label=$1 pattern=$2 rc
    shift 2
    "$@" >"$TMP/err.out" 2>"$TMP/err.txt"
    rc=$?
    if [ "$rc" -eq 1 ] && grep -q -- "$pattern" "$TMP/err.txt"; then
        ok "$label: exit 1, '$(head -1 "$TMP/err.txt" | cut -c1-90)'"
    else
        not_ok "$label: exit $rc, stderr: $(head -2 "$TMP/err.txt")"
    fi
}
tool_refuses "missing input" "char-rnn" "${TOOL[@]}" --input "$TMP/nope.txt" --out-dir "$TMP/out2"
tool_refuses "missing encoder" "encoder.json" ./prepro_text --encoder "$TMP/nope.json" --merges "$MERGES" --encode-stdin
head -c 5000 "$ENCODER" >"$TMP/truncated.json"
tool_refuses "truncated encoder.json" "truncated.json" ./prepro_text --encoder "$TMP/truncated.json" --merges "$MERGES" --encode-stdin
printf 'version 0\nnot-a-token zz\n' >"$TMP/bad.bpe"
tool_refuses "bad vocab.bpe" "bad.bpe" ./prepro_text --encoder "$ENCODER" --merges "$TMP/bad.bpe" --encode-stdin
tool_refuses "bad --val-tokens" "val-tokens" ./prepro_text --val-tokens -5
printf 'garbage!' >"$TMP/bad_tok.bin"; head -c 2000 /dev/zero >>"$TMP/bad_tok.bin"
cat >"$TMP/bad_magic.c" <<'EOF'
#include "run/tokenizer.h"
int main(int argc, char** argv) { Tokenizer t; tokenizer_init(&t, argv[1]); return 0; }
EOF
if gcc $CC_FLAGS "$TMP/bad_magic.c" -o "$TMP/bad_magic" build/run/librun.a -lm 2>"$TMP/cc.err"; then
    tool_refuses "tokenizer file with bad magic" "magic" "$TMP/bad_magic" "$TMP/bad_tok.bin"
else
    not_ok "bad-magic probe did not compile" "$TMP/cc.err"
fi

done_testing
