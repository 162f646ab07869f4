# Sourced by the test and benchmark scripts: the repository root as working directory,
# one thread per rank, the oracle's interpreter (Debian's python3 with torch), and
# mpirun with the flags a root CI machine with few cores needs.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=${LLMC_PYTHON:-/usr/bin/python3}
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

# bench_work_dir: sets work, a fresh scratch directory that is removed when the script exits
# (the benchmarks' own EXIT trap).
bench_work_dir() { work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT; }

# small_model DIR: builds train_gpt2 (with zero1/) and writes DIR/m.bin, a random GPT-2 of
# vocabulary 1000 and 32 positions (the oracle's), for tests that make their own shards.
small_model() {
    make -s train_gpt2 USE_ZERO1=1 >/dev/null || { echo "FAIL build"; return 1; }
    $PY dev/test/gpt2_oracle.py make --out-model "$1/m.bin" --out-state "$1/s.bin" --vocab 1000 --max-seq 32 \
        --seq 32 --steps 1 >/dev/null || { echo "FAIL oracle make"; return 1; }
}

# pattern_shard PATH: a train shard of 8192 tokens repeating (i * 7) % 50, a pattern the
# small model learns within tens of steps.
pattern_shard() {
    $PY - "$1" <<'PYEOF' || { echo "FAIL shard"; return 1; }
import struct, sys
n = 8192
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *((i * 7) % 50 for i in range(n))))
PYEOF
}

# random_shards DIR: DIR/shard_{0,1,2}.bin, 700, 600 and 900 random tokens below 1000 (the
# small model's vocabulary), the same every time: shards of odd sizes for the data-order tests.
random_shards() {
    $PY - "$1" <<'PYEOF' || { echo "FAIL shards"; return 1; }
import random, struct, sys
rng = random.Random(7)
for i, n in enumerate((700, 600, 900)):
    with open(f"{sys.argv[1]}/shard_{i}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *(rng.randrange(1000) for _ in range(n))))
PYEOF
}

# wait_stopped LOG N: waits (120 s at most) until N processes have said in LOG that they stop
# themselves (LLMC_TEST_STOP, dev/test/seams.c) and every one of them is stopped; prints
# their pids. A test then acts at that known place and continues them (kill -CONT).
wait_stopped() {
    local pids p all
    for _ in $(seq 1200); do
        pids=$(sed -n 's/^test: rank .* (LLMC_TEST_STOP, pid \([0-9]*\))$/\1/p' "$1" 2>/dev/null)
        if [ "$(wc -w <<<"$pids")" -ge "$2" ]; then
            all=1
            for p in $pids; do [[ $(ps -o stat= -p "$p" 2>/dev/null) == T* ]] || all=0; done
            [ $all = 1 ] && { echo $pids; return 0; }
        fi
        sleep 0.1
    done
    return 1
}

# Tests that train twice and compare (reporting through test_lib.sh): run NAME's output is
# $TMP/NAME.log, its -o directory $TMP/NAME, holding checkpoint $CKPT after $STEPS steps.
# step_lines NAME: its step lines' step, loss and norm.
step_lines() { sed -n 's/^\(step *[0-9]*\/[0-9]* | loss [^|]* | norm [^|]*\) |.*/\1/p' "$TMP/$1.log"; }
# same_runs A B: identical step lines (loss, norm) and final checkpoint files, byte for byte.
same_runs() {
    local n f diffs=()
    n=$(step_lines "$1" | wc -l)
    [ "$n" = "$STEPS" ] || diffs+=("$1 printed $n step lines, expected $STEPS")
    cmp -s <(step_lines "$1") <(step_lines "$2") || diffs+=("step losses/norms differ")
    for f in model.bin optimizer.bin; do
        cmp -s "$TMP/$1/$CKPT/$f" "$TMP/$2/$CKPT/$f" || diffs+=("$CKPT/$f differs")
    done
    if [ ${#diffs[@]} -eq 0 ]; then
        ok "$1 == $2 bitwise ($STEPS step lines, $CKPT/model.bin, optimizer.bin)"
    else
        not_ok "$1 vs $2: $(printf "%s; " "${diffs[@]}")"
        diag "$(paste -d '\n' <(step_lines "$1" | sed "s/^/$1: /") <(step_lines "$2" | sed "s/^/$2: /"))"
    fi
}
