# Sourced by the test and benchmark scripts: the repository root as working directory,
# one thread per rank, the oracle's interpreter (Debian's python3 with torch), and
# mpirun with the flags a root CI machine with few cores needs.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=${LLMC_PYTHON:-/usr/bin/python3}
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

# small_model DIR: builds train_gpt2 (with zero1/) and writes DIR/m.bin, a random GPT-2 of
# vocabulary 1000 and 32 positions (the oracle's), for tests that make their own shards.
small_model() {
    make -s train_gpt2 USE_ZERO1=1 >/dev/null || { echo "FAIL build"; return 1; }
    $PY dev/test/gpt2_oracle.py make --out-model "$1/m.bin" --out-state "$1/s.bin" --vocab 1000 --max-seq 32 \
        --seq 32 --steps 1 >/dev/null || { echo "FAIL oracle make"; return 1; }
}
