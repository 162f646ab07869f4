#!/usr/bin/env bash
# Prepares the tinyshakespeare token shards, the GPT-2 tokenizer file and the small
# HellaSwag-format eval set (-H 1) in <repo>/data/:
#   data/tinyshakespeare_val.bin, data/tinyshakespeare_train.bin, data/gpt2_tokenizer.bin,
#   data/tinyshakespeare_manifest.txt (tokens, bytes, CRC32C of each shard),
#   data/tinyshakespeare_hellaswag.bin
# Builds ./prepro_text (C, GPT-2 BPE; no Python) and runs it only when the outputs are not
# those of the current inputs, so calling this before every run is cheap. "Current" is a
# content stamp, data/.prepared: the checksums of the inputs, of the tool's sources and of
# the outputs. Contents, not times: a data/ carried to another machine stays valid there
# although prepro_text is rebuilt (newer) on arrival; a changed input, tool source or
# damaged output re-prepares.
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

outputs=("$OUT_DIR/tinyshakespeare_val.bin" "$OUT_DIR/tinyshakespeare_train.bin" "$OUT_DIR/gpt2_tokenizer.bin"
         "$OUT_DIR/tinyshakespeare_manifest.txt" "$OUT_DIR/tinyshakespeare_hellaswag.bin")
STAMP=$OUT_DIR/.prepared
TOOL_SOURCES=(tools/prepro_text.c tools/bpe.h tools/unicode_classes.h llmc/utils.h tools/shard_writer.h run/crc32c.[ch]
              run/hellaswag_file.[ch] run/files.[ch] run/error.[ch])
# Checksums only, not names: the same inputs from another LLMC_DATA_DIR are the same inputs.
fingerprint() { sha256sum "$ENCODER" "$MERGES" "$INPUT" "${TOOL_SOURCES[@]}" "${outputs[@]}" 2>/dev/null | cut -d' ' -f1; }

if [ -f "$STAMP" ] && [ "$(fingerprint)" = "$(cat "$STAMP")" ]; then
    echo "prepare_data: $OUT_DIR/ is up to date (tinyshakespeare shards, gpt2_tokenizer.bin, tinyshakespeare_hellaswag.bin)"
    exit 0
fi
rm -f "$STAMP"
# prepro_text itself explains where to download any input that is missing.
./prepro_text --encoder "$ENCODER" --merges "$MERGES" --input "$INPUT" --out-dir "$OUT_DIR" --name tinyshakespeare
fingerprint >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
