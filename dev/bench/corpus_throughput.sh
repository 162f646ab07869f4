#!/usr/bin/env bash
# Throughput of prepro_corpus (--threads 1 and all cores) against the Python reference
# tokenizer (dev/test/bpe_reference.py, driven over the same JSONL: parse each line, encode
# <|endoftext|> + the text), side by side in one run: A B C A B C ..., medians of
# BENCH_REPEATS (default 3). MB/s = bytes of the JSONL file / wall seconds of the whole
# process (start-up and the encoder's loading included for both). No BLAS runs here, so
# OPENBLAS_* settings do not matter.
#
#   dev/bench/corpus_throughput.sh [CORPUS.jsonl]
# Without a corpus: tinyshakespeare's blank-line separated sections as JSONL, repeated
# BENCH_COPIES times (default 4, about 5 MB).
set -eu
source "$(dirname "${BASH_SOURCE[0]}")/../test/env.sh"
REPEATS=${BENCH_REPEATS:-3}
COPIES=${BENCH_COPIES:-4}
bench_work_dir
make -s prepro_corpus >/dev/null
CORES=$(getconf _NPROCESSORS_ONLN)  # not nproc: it obeys OMP_NUM_THREADS

corpus=${1:-$work/corpus.jsonl}
if [ $# -eq 0 ]; then
    $PY - dev/data/tinyshakespeare/input.txt "$corpus" "$COPIES" <<'PYEOF'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for _ in range(int(sys.argv[3])):
        for section in text.split("\n\n"):
            f.write(json.dumps({"text": section + "\n\n"}, ensure_ascii=False) + "\n")
PYEOF
fi
bytes=$(stat -c %s "$corpus")
cat >"$work/ref.py" <<'PYEOF'
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "dev", "test"))
from bpe_reference import GPT2Encoder
enc = GPT2Encoder("dev/data/gpt2/encoder.json", "dev/data/gpt2/vocab.bpe")
eot, n = enc.encoder["<|endoftext|>"], 0
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f:
        n += 1 + len(enc.encode(json.loads(line)["text"]))
print(n)
PYEOF

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
timed() {  # "wall cpu" seconds of one run of the command (cpu: user + sys, all its threads)
    local TIMEFORMAT='%R %U %S'
    { time "$@" >"$work/last.out" 2>"$work/last.err"; } 2>"$work/time" || { cat "$work/last.err" >&2; exit 1; }
    awk '{ printf "%.4f %.4f\n", $1, $2 + $3 }' "$work/time"
}
c_run() { rm -rf "$work/out"; ./prepro_corpus --out-dir "$work/out" --progress 0 --threads "$1" "$corpus"; }

echo "== prepro_corpus vs the Python reference tokenizer: $(basename "$corpus"), $((bytes / 1000)) kB, $CORES cores"
: >"$work/c1"; : >"$work/cn"; : >"$work/py"
for r in $(seq "$REPEATS"); do
    timed c_run 1 >>"$work/c1"
    timed c_run "$CORES" >>"$work/cn"
    timed "$PY" "$work/ref.py" "$corpus" >>"$work/py"
done
py_tokens=$(cat "$work/last.out")
c_tokens=$(awk '$1 == "total" { print $3 }' "$work/out/corpus_manifest.txt")
[ "$py_tokens" = "$c_tokens" ] || { echo "token counts differ: C $c_tokens, Python $py_tokens" >&2; exit 1; }
mbs() { awk -v b="$bytes" -v s="$1" 'BEGIN { printf "%.2f", b / s / 1e6 }'; }
for k in c1 cn py; do
    cut -d' ' -f1 "$work/$k" | median >"$work/$k.wall"
    cut -d' ' -f2 "$work/$k" | median >"$work/$k.cpu"
done
c1=$(cat "$work/c1.wall"); cn=$(cat "$work/cn.wall"); py=$(cat "$work/py.wall")
c1c=$(cat "$work/c1.cpu"); cnc=$(cat "$work/cn.cpu"); pyc=$(cat "$work/py.cpu")
echo "  (medians of $REPEATS; wall: MB/s of the whole process; cpu: MB per CPU-second, what a core does when it has one)"
printf "  prepro_corpus --threads 1   wall %6.2f MB/s (%.2f s)   cpu %6.2f MB/s\n" "$(mbs "$c1")" "$c1" "$(mbs "$c1c")"
printf "  prepro_corpus --threads %-3d wall %6.2f MB/s (%.2f s)   cpu %6.2f MB/s\n" "$CORES" "$(mbs "$cn")" "$cn" "$(mbs "$cnc")"
printf "  bpe_reference.py            wall %6.2f MB/s (%.2f s)   cpu %6.2f MB/s; both give %s tokens\n" "$(mbs "$py")" "$py" \
    "$(mbs "$pyc")" "$c_tokens"
awk -v a="$c1" -v b="$cn" -v p="$py" -v n="$CORES" 'BEGIN {
    printf "  wall ratios: C (1 thread) / Python = %.1f, C (%d threads) / Python = %.1f, %d threads / 1 = %.2f\n", p / a, n, p / b, n, a / b }'
awk -v a="$c1c" -v p="$pyc" 'BEGIN { printf "  cpu ratio: C / Python = %.1f per core\n", p / a }'
echo "  load average during the run: $(cut -d' ' -f1-3 /proc/loadavg) on $CORES cores"
