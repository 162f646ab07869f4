#!/usr/bin/env bash
# Prepares the tinyshakespeare token shards and the GPT-2 tokenizer file in <repo>/data/:
#   data/tinyshakespeare_val.bin, data/tinyshakespeare_train.bin, data/gpt2_tokenizer.bin
# Builds ./prepro_text (C, GPT-2 BPE; no Python) and runs it only when an output is
# missing or older than the tool or its inputs, so calling this before every run is cheap.
# Inputs come from $LLMC_DATA_DIR (default <repo>/dev/data, carried by the repository):
#   gpt2/encoder.json, gpt2/vocab.bpe, tinyshakespeare/input.txt
# Works from any directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DATA_DIR=${LLMC_DATA_DIR:-dev/data}
OUT_DIR=data
ENCODER=$DATA_DIR/gpt2/encoder.json
MERGES=$DATA_DIR/gpt2/vocab.bpe
INPUT=$DATA_DIR/tinyshakespeare/input.txt

make -s prepro_text

outputs=("$OUT_DIR/tinyshakespeare_val.bin" "$OUT_DIR/tinyshakespeare_train.bin" "$OUT_DIR/gpt2_tokenizer.bin")
stale=0
for out in "${outputs[@]}"; do
    if [ ! -f "$out" ]; then stale=1; break; fi
    for src in ./prepro_text "$ENCODER" "$MERGES" "$INPUT"; do
        if [ "$src" -nt "$out" ]; then stale=1; fi
    done
done

if [ "$stale" -eq 0 ]; then
    echo "prepare_data: $OUT_DIR/ is up to date (tinyshakespeare shards, gpt2_tokenizer.bin)"
    exit 0
fi
# prepro_text itself explains where to download any input that is missing.
./prepro_text --encoder "$ENCODER" --merges "$MERGES" --input "$INPUT" --out-dir "$OUT_DIR" --name tinyshakespeare
