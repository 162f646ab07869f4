#!/usr/bin/env bash
# The failure cases of long runs and corpora as a user sees them, in two built trees: for
# each case and tree the exit code, the first error or warning line, and what is left on
# disk. Evidence for a note, not a test: it prints, it never judges.
#   dev/bench/failure_cases_before_after.sh BEFORE_TREE AFTER_TREE [CASE ...]   (CASE: 1 .. 11; all by default)
# Each tree needs train_gpt2 (USE_ZERO1=1), prepro_corpus and hf_convert built (a tree of
# this version as a test build, TEST_SEAMS=1, for its fault hooks: dev/test/seams.c). The oracle
# (the after tree's dev/test/gpt2_oracle.py, Debian's python3 with torch) makes the small
# model; TOKENS (default AFTER/data/tinyshakespeare_train.bin, `make data`) feeds case 11.
# The trees differ in their fault hooks: the before tree plants a NaN gradient with its flag
# --test-plant-nan STEP (one step), the after tree with LLMC_TEST_PLANT_NAN=STEP[+] (+: every
# step from STEP on).
set -u
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
BEFORE=$(cd "$1" && pwd) AFTER=$(cd "$2" && pwd) || exit 2
shift 2
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(1 2 3 4 5 6 7 8 9 10 11)
TOKENS=${TOKENS:-$AFTER/data/tinyshakespeare_train.bin}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=${LLMC_PYTHON:-/usr/bin/python3}
MPIRUN=(mpirun --oversubscribe -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
W=$(mktemp -d /tmp/failure_cases.XXXXXX)
trap 'rm -rf "$W"' EXIT
ENC=(--encoder "$AFTER/dev/data/gpt2/encoder.json" --merges "$AFTER/dev/data/gpt2/vocab.bpe")

# ---- what is reported ------------------------------------------------------------------
say() { echo "  $*"; }
# first LOG: the first error or crash line, else the first warning (200 characters), $W shortened;
# the after tree's notice that a shard without a manifest is unverified is passed over.
first() {
    { grep -m1 -iE 'error|abort|overflow|refus|not a window|fatal|killed|terminated' "$1" ||
        grep -v 'without a manifest beside it' "$1" | grep -m1 -iE 'warning|skipped|unverified|removed'; } |
        sed "s|$W/||g" | cut -c1-200
}
# result NAME RC LOG: one line of the exit code and the first message.
result() { say "$1: exit $2 | $(first "$3")"; }
# ls_dir DIR: its entries (hidden ones too), or that it is gone.
ls_dir() { [ -d "$1" ] && (cd "$1" && ls -A | tr '\n' ' ') || echo "(no directory)"; }
# nonfinite FILE...: how many floats are non-finite after the 1024-byte header.
nonfinite() {
    $PY - "$@" <<'EOF'
import array, math, sys
for p in sys.argv[1:]:
    a = array.array("f", open(p, "rb").read()[1024:])
    bad = sum(1 for x in a if not math.isfinite(x))
    print("%s: %d of %d non-finite" % (p.split("/")[-2], bad, len(a)), end="; ")
print()
EOF
}
# manifest_check DIR [INPUT.jsonl]: the manifest's shards against the files (missing ones, strays),
# its documents line, and with INPUT how many decoded documents are not one of INPUT's texts.
manifest_check() {
    $PY - "$@" "$AFTER/dev/data/gpt2/encoder.json" <<'EOF'
import glob, json, os, struct, sys
d, enc = sys.argv[1], sys.argv[-1]
m = os.path.join(d, "corpus_manifest.txt")
shards = sorted(glob.glob(d + "/corpus_val_*.bin") + glob.glob(d + "/corpus_train_*.bin"))
out = ["%d shards by the glob" % len(shards)]
if os.path.exists(m):
    lines = [l.split() for l in open(m)]
    listed = [f[-1] for f in lines if f and f[0] == "shard"]
    missing = [n for n in listed if not os.path.exists(os.path.join(d, n))]
    strays = set(os.path.basename(p) for p in shards) - set(listed)
    out += ["manifest lists %d (%d missing, %d not listed)" % (len(listed), len(missing), len(strays)),
            "manifest '%s'" % " ".join(next((f for f in lines if f and f[0] == "documents"), ["?"]))]
else:
    out.append("no manifest")
if len(sys.argv) > 3 and shards:
    texts = set(json.loads(l)["text"] for l in open(sys.argv[2]))
    # GPT-2's byte-level BPE decoded: token string -> bytes through the inverse byte map
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs: bs.append(b); cs.append(256 + n); n += 1
    dec = {chr(c): b for b, c in zip(bs, cs)}
    vocab = {v: k for k, v in json.load(open(enc)).items()}
    toks = []
    for p in shards:
        raw = open(p, "rb").read()
        toks += struct.unpack("<%dH" % ((len(raw) - 1024) // 2), raw[1024:])
    docs, cur = [], []
    for t in toks + [50256]:
        if t == 50256:
            if cur: docs.append(bytes(dec[c] for tok in cur for c in vocab[tok]).decode("utf-8", "replace"))
            cur = []
        else: cur.append(t)
    out.append("%d documents decoded, %d of them not an input text" % (len(docs), sum(1 for x in docs if x not in texts)))
print("; ".join(out))
EOF
}
side_banner() { echo "-- $1"; }
for_sides() {  # FUNCTION: runs it for before and after, T the tree
    for side in before after; do
        T=$([ $side = before ] && echo "$BEFORE" || echo "$AFTER")
        side_banner $side
        "$1" $side
    done
}

# ---- inputs ------------------------------------------------------------------------------
(cd "$AFTER" && $PY dev/test/gpt2_oracle.py make --out-model "$W/m.bin" --out-state "$W/s.bin" --vocab 1000 \
    --max-seq 32 --seq 32 --steps 1 >/dev/null) || { echo "the oracle could not make the model"; exit 1; }
$PY - "$W/pattern.bin" <<'EOF'
import struct, sys
n = 8192
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *((i * 7) % 50 for i in range(n))))
EOF
$PY -c 'import json, sys
with open(sys.argv[1], "w") as f:
    for k in range(20000):
        f.write(json.dumps({"text": "line %d of the corpus, some words here" % k}) + "\n")' "$W/corpus.jsonl"
SMALL=(-e "$W/m.bin" -i "$W/pattern.bin" -b 2 -t 32 -v 0 -s 0 -l 1e-3)
train() { timeout --kill-after=5 300 "$T/train_gpt2" "$@"; }
prepro() { timeout --kill-after=5 300 "$T/prepro_corpus" "${ENC[@]}" --progress 0 --threads 1 --shard-tokens 2000 "$@"; }

# ---- the cases ---------------------------------------------------------------------------
case1() {  # a run that diverges: NaN gradients from step 6 of 12, -n 2 -nk 2; then -y 1
    local o=$W/c1_$1 rc
    if [ "$1" = before ]; then train "${SMALL[@]}" -x 12 -n 2 -nk 2 -o "$o" --test-plant-nan 5 >"$o.log" 2>&1
    else LLMC_TEST_PLANT_NAN=5+ train "${SMALL[@]}" -x 12 -n 2 -nk 2 -o "$o" >"$o.log" 2>&1; fi
    rc=$?
    result "diverged run" $rc "$o.log"
    say "last step line: $(grep -E '^step ' "$o.log" | tail -n 1 | cut -c1-120)"
    say "left: $(ls_dir "$o")"
    say "$(nonfinite "$o"/checkpoint_*/model.bin)"
    train "${SMALL[@]}" -x 12 -n 2 -nk 2 -o "$o" -y 1 >"$o.resume.log" 2>&1
    rc=$?
    result "-y 1" $rc "$o.resume.log"
    say "resume: $(grep -m1 '^resumed from' "$o.resume.log" | sed "s|$W/||g"), last step: $(grep -E '^step ' "$o.resume.log" | tail -n 1 | cut -c1-60)"
    if [ "$1" = after ]; then  # one NaN gradient alone (what the before tree's flag plants)
        LLMC_TEST_PLANT_NAN=5 train "${SMALL[@]}" -x 12 -n 2 -nk 2 -o "$o.once" >"$o.once.log" 2>&1
        rc=$?
        result "one NaN gradient at step 6" $rc "$o.once.log"
        say "$(nonfinite "$o.once"/checkpoint_*/model.bin)"
    fi
}
case2() {  # a model file holding a NaN weight
    cp "$W/m.bin" "$W/nan.bin" && printf '\x00\x00\xc0\x7f' | dd of="$W/nan.bin" bs=1 seek=$((1024 + 4 * 7)) conv=notrunc status=none
    train -e "$W/nan.bin" -i "$W/pattern.bin" -b 2 -t 32 -v 0 -s 0 -x 4 >"$W/c2_$1.log" 2>&1
    result "-e nan.bin -x 4" $? "$W/c2_$1.log"
    say "last step line: $(grep -E '^step ' "$W/c2_$1.log" | tail -n 1 | cut -c1-100)"
}
case3() {  # hf_convert import of a safetensors holding a NaN (made by the after tree's export)
    [ -f "$W/st/model.safetensors" ] || {
        "$AFTER/hf_convert" export "$W/m.bin" "$W/st" >/dev/null 2>&1 || { say "export failed"; return; }
        $PY - "$W/st/model.safetensors" <<'EOF'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
name, t = min(((k, v) for k, v in h.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0])
b[8 + n + t["data_offsets"][0] + 4 * 7: 8 + n + t["data_offsets"][0] + 4 * 8] = struct.pack("<f", float("nan"))
open(p, "wb").write(b); print("NaN planted in", name, "element 7")
EOF
    }
    timeout 120 "$T/hf_convert" import "$W/st" "$W/c3_$1.bin" >"$W/c3_$1.log" 2>&1
    result "hf_convert import" $? "$W/c3_$1.log"
    say "left: $([ -e "$W/c3_$1.bin" ] && nonfinite "$W/c3_$1.bin" | sed 's/^[^:]*:/c3.bin:/' || echo 'no .bin written')"
}
case4() {  # a corrupt .gz (8 bytes overwritten mid-file) and .zst (one byte flipped)
    if [ ! -f "$W/c.jsonl.zst" ]; then
        gzip -n -c "$W/corpus.jsonl" >"$W/c.jsonl.gz" && zstd -q -c "$W/corpus.jsonl" >"$W/c.jsonl.zst"
        printf 'XXXXXXXX' | dd of="$W/c.jsonl.gz" bs=1 seek=$(($(stat -c %s "$W/c.jsonl.gz") / 2)) conv=notrunc status=none
        $PY -c 'import sys, os
p = sys.argv[1]; k = os.path.getsize(p) // 2
f = open(p, "r+b"); f.seek(k); b = f.read(1); f.seek(k); f.write(bytes([b[0] ^ 1]))' "$W/c.jsonl.zst"
    fi
    local z
    for z in gz zst; do
        prepro --out-dir "$W/c4_${z}_$1" "$W/c.jsonl.$z" >"$W/c4_${z}_$1.log" 2>&1
        result "$z" $? "$W/c4_${z}_$1.log"
        say "left: $(manifest_check "$W/c4_${z}_$1" "$W/corpus.jsonl")"
    done
}
case5() {  # two runs into one --out-dir at once; a kill -9 mid-run, then the trainer on the glob
    local d=$W/c5_$1 a rc_a rc_b
    head -n 5000 "$W/corpus.jsonl" >"$W/first5000.jsonl"
    sed 's/of the corpus/of ANOTHER corpus/' "$W/corpus.jsonl" >"$W/other.jsonl"
    # A (5000 lines on stdin) starts and waits for its input; B (20000 other lines) runs to
    # its end meanwhile; then A gets its input.
    rm -f "$W/fifo" && mkfifo "$W/fifo" && exec 3<>"$W/fifo"
    prepro --out-dir "$d" - <"$W/fifo" 3>&- >"$d.a.log" 2>&1 &
    a=$!
    sleep 2
    prepro --out-dir "$d" "$W/other.jsonl" >"$d.b.log" 2>&1
    rc_b=$?
    cat "$W/first5000.jsonl" >&3
    exec 3>&-
    wait $a
    rc_a=$?
    result "run A (5000 lines on stdin, started first)" $rc_a "$d.a.log"
    result "run B (20000 other lines, while A waits)" $rc_b "$d.b.log"
    say "left: $(manifest_check "$d" "$W/first5000.jsonl")"
    train -e d1 -i "$d/corpus_train_*.bin" -b 1 -t 32 -x 2 -v 0 -s 0 >"$d.train.log" 2>&1
    result "trainer on -i 'corpus_train_*.bin'" $? "$d.train.log"
    # kill -9 once 30 files are in the directory (small batches, so that shards come early)
    local k=$W/c5k_$1
    [ -f "$W/big.jsonl" ] || for a in 1 2 3 4 5 6 7 8 9 10; do cat "$W/corpus.jsonl"; done >"$W/big.jsonl"
    "$T/prepro_corpus" "${ENC[@]}" --progress 0 --threads 1 --shard-tokens 2000 --batch-bytes 65536 \
        --out-dir "$k" "$W/big.jsonl" >"$k.log" 2>&1 &
    a=$!  # prepro_corpus itself
    while kill -0 $a 2>/dev/null && [ "$(ls -A "$k" 2>/dev/null | wc -l)" -lt 30 ]; do sleep 0.05; done
    kill -9 $a
    wait $a 2>/dev/null
    say "kill -9 with 30 files there: left: $(manifest_check "$k"); other files: $(find "$k" -mindepth 1 -maxdepth 1 -printf '%f\n' | grep -v '^corpus_train_[0-9]*\.bin$' | sed 's/[0-9]\{6\}/N/' | sort | uniq -c | xargs)"
    train -e d1 -i "$k/corpus_train_*.bin" -b 1 -t 32 -x 2 -v 0 -s 0 >"$k.train.log" 2>&1
    result "trainer on -i 'corpus_train_*.bin'" $? "$k.train.log"
    prepro --out-dir "$k" "$W/first5000.jsonl" >"$k.rerun.log" 2>&1
    result "the next prepro_corpus run into it" $? "$k.rerun.log"
}
case6() {  # a shard changed, or one added, after the manifest was written
    local d=$W/c6_$1
    prepro --out-dir "$d" "$W/corpus.jsonl" >/dev/null 2>&1 || { say "the corpus run failed"; return; }
    cp -r "$d" "$d.added" && cp "$d/corpus_train_000001.bin" "$d.added/corpus_train_000999.bin"
    $PY -c 'import sys
f = open(sys.argv[1], "r+b"); f.seek(2000); b = f.read(1); f.seek(2000); f.write(bytes([b[0] ^ 1]))' "$d/corpus_train_000001.bin"
    train -e d1 -i "$d/corpus_train_*.bin" -b 1 -t 32 -x 2 -v 0 -s 0 >"$d.log" 2>&1
    result "a byte of shard 1 (the first read) flipped" $? "$d.log"
    train -e d1 -i "$d.added/corpus_train_*.bin" -b 1 -t 32 -x 2 -v 0 -s 0 >"$d.added.log" 2>&1
    result "a shard added (a copy of shard 1)" $? "$d.added.log"
}
long_path() {  # DIR LENGTH: DIR followed by /ddd... parts of up to 60 characters, LENGTH in all
    "$PY" -c 'import sys; d, n = sys.argv[1], int(sys.argv[2])
while len(d) < n: d += "/" + "d" * max(1, min(59, n - len(d) - 1))
print(d)' "$1" "$2"
}
case7() {  # a 250-character -o, a checkpoint save at step 1, at np 1 and np 2
    local np o
    for np in 1 2; do
        o=$(long_path "$W/c7_${1}_$np" 250)
        mkdir -p "$(dirname "$o")"  # a deep scratch directory that exists; the run makes the last part
        timeout --kill-after=5 300 "${MPIRUN[@]}" -np $np "$T/train_gpt2" "${SMALL[@]}" -x 2 -n 1 -o "$o" >"$W/c7_${1}_$np.log" 2>&1
        result "np $np, -o of ${#o} characters, -x 2 -n 1" $? "$W/c7_${1}_$np.log"
        say "left: $(ls_dir "$o")"
    done
}
lines_reach() {  # FILE N PID: waits (up to 10 s) until FILE holds N lines or PID has ended
    local deadline=$((SECONDS + 10))
    until [ "$(cat "$1" 2>/dev/null | wc -l)" -ge "$2" ] || ! kill -0 "$3" 2>/dev/null || [ $SECONDS -ge $deadline ]; do
        sleep 0.02
    done
}
case8() {  # rm -rf of -o during a run; a second job on the same -o
    local o=$W/c8_$1 pid rc first second
    train "${SMALL[@]}" -x 2000 -n 1000 -o "$o" >"$o.log" 2>&1 &
    pid=$!
    lines_reach "$o/main.log" 3 $pid
    rm -rf "$o"
    wait $pid
    result "rm -rf of -o at step 3 of 2000" $? "$o.log"
    say "left: $(ls_dir "$o")"
    o=$W/c8s_$1
    train "${SMALL[@]}" -x 3000 -n 10 -l 1e-3 -o "$o" >"$o.first.log" 2>&1 &
    first=$!
    lines_reach "$o/main.log" 3 $first
    kill -STOP $first
    rm -rf "$o"
    train "${SMALL[@]}" -x 40 -n 10 -l 2e-4 -o "$o" >"$o.second.log" 2>&1 &
    second=$!
    lines_reach "$o/main.log" 1 $second
    kill -CONT $first
    wait $first
    result "first job (-l 1e-3, stopped while -o was removed)" $? "$o.first.log"
    wait $second
    result "second job (-l 2e-4)" $? "$o.second.log"
    say "checkpoints' lr: $(cat "$o"/checkpoint_*/state.txt 2>/dev/null | awk '$1 == "lr" { print $2 }' | sort | uniq -c | xargs);" \
        "main.log: $(wc -l <"$o/main.log") lines; first job's log says saved: $(grep -ci 'checkpoint.*saved\|saved.*checkpoint' "$o.first.log")"
}
case9() {  # a full disk during a save: a dead .checkpoint_*.tmp, then requeued resumes
    # In a private mount namespace (root): K steps saved on a roomy tmpfs; the tmpfs shrunk to
    # one more checkpoint but 16 KiB; a resume to K+1 (its save fails); the same again (a
    # requeue, disk still full); 40 KiB freed and the same again.
    local K=1000 r=$W/c9_$1
    mkdir -p "$r/fs"
    cat >"$r/full.sh" <<'EOF'
fs=$1 r=$2 bin=$3 K=$4; shift 4
out=$fs/out
mount -t tmpfs -o size=64m tmpfs "$fs" || exit 97
timeout 120 "$bin" "$@" -x $K -n $K -o "$out" >"$r/a.log" 2>&1
used=$(df -k --output=used "$fs" | tail -n 1)
ck=$(du -sk "$out/checkpoint_$(printf %08d $K)" | cut -f1)
mount -o remount,size=$((used + ck - 16))k "$fs" || exit 98
for try in b c; do
    timeout 120 "$bin" "$@" -x $((K + 1)) -n $K -y 1 -o "$out" >"$r/$try.log" 2>&1
    echo $? >"$r/$try.rc"; ls -A "$out" | tr '\n' ' ' >"$r/$try.ls"
done
mount -o remount,size=$((used + ck + 24))k "$fs" || exit 98
timeout 120 "$bin" "$@" -x $((K + 1)) -n $K -y 1 -o "$out" >"$r/d.log" 2>&1
echo $? >"$r/d.rc"; ls -A "$out" | tr '\n' ' ' >"$r/d.ls"
EOF
    unshare -m --propagation private bash "$r/full.sh" "$r/fs" "$r" "$T/train_gpt2" $K "${SMALL[@]}" ||
        { say "could not set up the tmpfs (needs root and unshare -m)"; return; }
    local try
    for try in b:"resume, disk full" c:"requeued resume, disk still full" d:"resume with 40 KiB freed"; do
        result "${try#*:}" "$(cat "$r/${try%%:*}.rc")" "$r/${try%%:*}.log"
        say "left: $(cat "$r/${try%%:*}.ls"); $(grep -o 'removed [^ ]*' "$r/${try%%:*}.log" | sed "s|$W/||g" | head -n 2 | xargs)"
    done
}
case10() {  # the small ones
    local pid comm
    env -u OPENBLAS_CORETYPE -u LLMC_BLAS_REEXEC LLMC_TEST_BLAS_CORENAME=Prescott \
        "$T/train_gpt2" -e d1 -b 1 -t 32 -v 0 -s 0 -i "$TOKENS" -x 1000 >"$W/c10_$1.blas.log" 2>&1 &
    pid=$!
    while kill -0 $pid 2>/dev/null && ! grep -q '^step ' "$W/c10_$1.blas.log"; do sleep 0.05; done
    comm=$(ps -o comm= -p $pid)
    kill $pid; wait $pid 2>/dev/null
    say "after the OpenBLAS restart: ps -o comm= says '$comm'; $(grep -m1 -i 'restart' "$W/c10_$1.blas.log" | cut -c1-120)"
    train -h 2 >"$W/c10_$1.h.log" 2>&1
    say "-h 2: exit $? | $(grep -v "^blas:" "$W/c10_$1.h.log" | head -n 1 | cut -c1-150)"
    train "${SMALL[@]}" -x 1 --attention bogus >"$W/c10_$1.att.log" 2>&1
    result "--attention bogus" $? "$W/c10_$1.att.log"
    head -n 60 "$W/corpus.jsonl" | sed '1s/^/\xef\xbb\xbf/' >"$W/bom.jsonl"
    prepro --out-dir "$W/c10_bom_$1" "$W/bom.jsonl" >"$W/c10_$1.bom.log" 2>&1
    result "BOM-led JSONL of 60 records" $? "$W/c10_$1.bom.log"
    say "$(grep '^documents' "$W/c10_bom_$1/corpus_manifest.txt" 2>/dev/null) (manifest)"
    { head -n 30 "$W/corpus.jsonl"; echo '{"text": "good text beside", "x": 1e99999}'; head -n 60 "$W/corpus.jsonl" | tail -n 29; } >"$W/big.jsonl"
    prepro --out-dir "$W/c10_big_$1" "$W/big.jsonl" >"$W/c10_$1.big.log" 2>&1
    result "60 records, one with \"x\": 1e99999" $? "$W/c10_$1.big.log"
    say "$(grep '^documents' "$W/c10_big_$1/corpus_manifest.txt" 2>/dev/null) (manifest)"
    if [ ! -d "$W/dupkey" ]; then
        "$AFTER/hf_convert" export "$W/m.bin" "$W/dupkey" >/dev/null 2>&1
        $PY - "$W/dupkey/config.json" <<'EOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); n = c["n_layer"]
s = json.dumps(c, indent=2).replace('"n_layer": %d' % n, '"n_layer": %d,\n  "n_layer": %d' % (n + 1, n), 1)
open(p, "w").write(s)  # the first n_layer wrong, the last (Python's) right
EOF
    fi
    timeout 120 "$T/hf_convert" import "$W/dupkey" "$W/c10_$1.dup.bin" >"$W/c10_$1.dup.log" 2>&1
    result "config.json with \"n_layer\" twice (wrong, then right)" $? "$W/c10_$1.dup.log"
    local o=$W/c10_fifo_$1
    train "${SMALL[@]}" -x 1 -n 1 -o "$o" >/dev/null 2>&1 || { say "the FIFO case's first run failed"; return; }
    mkfifo "$W/fifo_$1" && ln -sf "$W/fifo_$1" "$o/checkpoint_00000001/optimizer.bin"
    timeout 60 "$T/train_gpt2" "${SMALL[@]}" -x 2 -n 1 -y 1 -o "$o" >"$o.log" 2>&1
    result "optimizer.bin a symlink to a FIFO, -y 1" $? "$o.log"
}
case11() {  # the default training step (-z 1), before vs after, A B A B 5 times per model
    # Two models: make bench's section 1 GPT-2 (L=4 C=256 V=50257, B=4 T=128, 10 steps) and
    # the small one of the cases (V=1000, B=2 T=32, 1000 steps: a per-step cost shows most).
    # Per run: the median step time the trainer prints (steps after the first) and the
    # process's user+sys CPU seconds (steadier than wall time on a loaded machine).
    local side i m
    [ -f "$TOKENS" ] || { say "no $TOKENS (make data)"; return; }
    (cd "$AFTER" && $PY dev/test/gpt2_oracle.py make --out-model "$W/b.bin" --out-state "$W/bs.bin" --layers 4 \
        --channels 256 --heads 4 --max-seq 128 --seq 128 --batch 4 --steps 1 >/dev/null) || { say "oracle failed"; return; }
    local -A ARGS=([section1]="-e $W/b.bin -i $TOKENS -b 4 -t 128 -x 11 -v 0 -s 0 -l 1e-4"
                   [small]="${SMALL[*]} -x 1000")
    for m in section1 small; do
        for i in 1 2 3 4 5; do
            for side in before after; do
                T=$([ $side = before ] && echo "$BEFORE" || echo "$AFTER")
                # shellcheck disable=SC2086
                /usr/bin/time -f "cpu %U %S" -o "$W/c11_${m}_${side}_$i.time" "$T/train_gpt2" ${ARGS[$m]} >"$W/c11_${m}_${side}_$i.log" 2>&1 ||
                    { say "$m $side run $i failed: $(first "$W/c11_${m}_${side}_$i.log")"; return; }
            done
        done
        $PY - "$W" "$m" <<'EOF'
import re, statistics as st, sys
w, m = sys.argv[1:]
fig = {}
for side in ("before", "after"):
    ms, cpu = [], []
    for i in range(1, 6):
        steps = [float(x.group(2)) for x in re.finditer(r"^step +(\d+)/\d+ \|.*?\| ([\d.]+) ms \|",
                 open("%s/c11_%s_%s_%d.log" % (w, m, side, i)).read(), re.M) if int(x.group(1)) > 1]
        ms.append(st.median(steps))
        u, s = open("%s/c11_%s_%s_%d.time" % (w, m, side, i)).read().split()[-2:]
        cpu.append(float(u) + float(s))
    fig[side] = (ms, cpu)
    print("  %s %s: step ms (median per run) %s, median %.2f; process CPU s %s, median %.2f" % (
        m, side, " ".join("%.2f" % x for x in ms), st.median(ms), " ".join("%.2f" % x for x in cpu), st.median(cpu)))
for k, name in ((0, "step ms"), (1, "CPU s")):
    pairs = [a / b for a, b in zip(fig["after"][k], fig["before"][k])]
    print("  %s after/before, %s: pairs %s; median of pairs %.3f; ratio of medians %.3f" % (
        m, name, " ".join("%.3f" % r for r in pairs), st.median(pairs), st.median(fig["after"][k]) / st.median(fig["before"][k])))
EOF
    done
}

for c in "${CASES[@]}"; do
    echo "== case $c: $(sed -n "s/^case$c() {  # //p" "$0")"
    if [ "$c" = 11 ]; then case11; else for_sides "case$c"; fi
done
