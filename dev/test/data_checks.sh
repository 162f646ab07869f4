# shellcheck shell=bash
# Sourced by the data-pipeline tests (test_tokenizer.sh, test_corpus.sh, test_corpus_dir.sh)
# after test_lib.sh (whose $TMP is the scratch directory): a quiet build, and the inputs:
# $LLMC_DATA_DIR (default <repo>/dev/data)/gpt2/{encoder.json,vocab.bpe}.
ROOT=$(pwd)
DATA_DIR=${LLMC_DATA_DIR:-$ROOT/dev/data}
ENCODER=$DATA_DIR/gpt2/encoder.json
MERGES=$DATA_DIR/gpt2/vocab.bpe

# build_or_exit TARGET: `make -s TARGET`; if it fails, its log and the end (nothing to test).
build_or_exit() { make -s "$1" >"$TMP/make.log" 2>&1 || fatal "make $1" "$TMP/make.log"; }
