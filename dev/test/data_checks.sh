# shellcheck shell=bash
# Sourced by the data-pipeline tests (test_tokenizer.sh, test_corpus.sh): a scratch
# directory $TMP (removed on exit), checks counted in $failed, a quiet build, the verdict,
# and the inputs: $LLMC_DATA_DIR (default <repo>/dev/data)/gpt2/{encoder.json,vocab.bpe}.
# The caller has cd'ed to the repository root.
ROOT=$(pwd)
DATA_DIR=${LLMC_DATA_DIR:-$ROOT/dev/data}
ENCODER=$DATA_DIR/gpt2/encoder.json
MERGES=$DATA_DIR/gpt2/vocab.bpe
PY=${LLMC_PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failed=0
pass() { echo "  ok   $*"; }
fail() { echo "  FAIL $*"; failed=$((failed + 1)); }

# build_or_exit TEST TARGET: `make TARGET`, or its log and FAIL TEST (nothing to test).
build_or_exit() {
    if ! make -s "$2" >"$TMP/make.log" 2>&1; then
        cat "$TMP/make.log"
        echo "FAIL $1: make $2 failed"
        exit 1
    fi
}

# verdict TEST: one PASS or FAIL line, and the exit status to match.
verdict() {
    if [ "$failed" -eq 0 ]; then
        echo "PASS $1"
        exit 0
    fi
    echo "FAIL $1: $failed checks failed"
    exit 1
}
