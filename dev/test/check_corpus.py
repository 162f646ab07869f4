#!/usr/bin/python3
"""Checks what prepro_corpus wrote against an independent reading of the documents.

usage: check_corpus.py --encoder E --merges M --case DOCS.json DIR SHARD_TOKENS VAL_TOKENS ...
DOCS.json: the documents the corpus holds, in input order (a JSON list of strings, written
by the test from its own Python strings, not from the tool's parsing). For each case:
  - DIR/*_manifest.txt lists the shards in order: val shards first, numbered from 0 without
    gaps, NAME_val_NNNNNN.bin then NAME_train_NNNNNN.bin; every shard but the last of a
    split holds exactly SHARD_TOKENS; val holds min(VAL_TOKENS, all) tokens, or with
    VAL_TOKENS `default` prepro_corpus's stated default: a tenth of all (rounded down, at
    least 1), at most SHARD_TOKENS and 10,000,000;
  - each shard's header (20240520, version 1, count = the file's size), its size and its
    CRC32C (bitwise, from crc32c_reference.py) agree with the manifest, and so do the totals;
  - the ids, shard after shard, are the oracle's (bpe_reference.py): <|endoftext|>, then
    the document's ids, for every document;
  - DIR holds nothing else but gpt2_tokenizer.bin and .lock (no temporary file).
Exits 0 when every case passes.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe_reference import GPT2Encoder  # noqa: E402
from crc32c_reference import crc32c_bitwise  # noqa: E402


def check_case(enc, docs_path, out_dir, shard_tokens, val_tokens):
    problems = []
    manifests = [f for f in os.listdir(out_dir) if f.endswith("_manifest.txt")]
    if len(manifests) != 1:
        return [f"{len(manifests)} manifests, want 1"], 0, 0, 0
    name = manifests[0][: -len("_manifest.txt")]
    lines = open(os.path.join(out_dir, manifests[0]), encoding="utf-8").read().splitlines()
    if not lines or lines[0] != "llmc-shards 1 prepro_corpus":
        problems.append(f"manifest starts with {lines[:1]}")
    shards = [line.split(" ", 5) for line in lines if line.startswith("shard ")]
    totals = [line.split() for line in lines if line.startswith("total ")]
    ids = []
    for k, (_, split, tokens, size, crc, fname) in enumerate(shards):
        want = f"{name}_{split}_{k:06d}.bin"
        if fname != want:
            problems.append(f"shard {k} is named {fname}, want {want}")
        data = open(os.path.join(out_dir, fname), "rb").read()
        header = np.frombuffer(data[:1024], dtype=np.int32)
        if header[0] != 20240520 or header[1] != 1 or 1024 + 2 * int(header[2]) != len(data):
            problems.append(f"{fname}: header {header[:3].tolist()} for a {len(data)}-byte file")
        if int(tokens) != int(header[2]) or int(size) != len(data):
            problems.append(f"{fname}: manifest says {tokens} tokens, {size} bytes")
        if int(crc, 16) != crc32c_bitwise(data):
            problems.append(f"{fname}: CRC32C {crc32c_bitwise(data):08x}, manifest says {crc}")
        ids.append(np.frombuffer(data[1024:], dtype=np.uint16).astype(np.int64))
    splits = [s[1] for s in shards]
    if splits != sorted(splits, key=lambda s: s != "val"):
        problems.append(f"shards not val first: {splits}")
    for split in ("val", "train"):
        counts = [int(s[2]) for s in shards if s[1] == split]
        if any(c != shard_tokens for c in counts[:-1]) or any(c < 1 or c > shard_tokens for c in counts):
            problems.append(f"{split} shard sizes {counts}, want {shard_tokens} each but the last")
    docs = json.load(open(docs_path, encoding="utf-8"))
    eot = enc.encoder["<|endoftext|>"]
    expected = []
    for doc in docs:
        expected.append(eot)
        expected.extend(enc.encode(doc))
    got = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    n_val = sum(int(s[2]) for s in shards if s[1] == "val")
    want_val = min(max(1, len(expected) // 10), shard_tokens, 10_000_000) if val_tokens == "default" \
        else min(int(val_tokens), len(expected))
    if n_val != want_val:
        problems.append(f"val holds {n_val} tokens, want {want_val}")
    if len(got) != len(expected):
        problems.append(f"shards hold {len(got)} tokens, the oracle gives {len(expected)} for {len(docs)} documents")
    elif (got != np.array(expected)).any():
        problems.append(f"ids differ from the oracle, first at token {int(np.nonzero(got != np.array(expected))[0][0])}")
    if totals != [["total", str(len(shards)), str(len(got)), str(n_val), str(len(got) - n_val)]]:
        problems.append(f"manifest totals {totals}")
    others = set(os.listdir(out_dir)) - {s[5] for s in shards} - {manifests[0], "gpt2_tokenizer.bin", ".lock"}
    if others:
        problems.append(f"other files in {out_dir}: {sorted(others)}")
    return problems, len(shards), len(got), len(docs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoder", required=True)
    ap.add_argument("--merges", required=True)
    ap.add_argument("--case", nargs=4, action="append", required=True,
                    metavar=("DOCS", "DIR", "SHARD_TOKENS", "VAL_TOKENS"))
    args = ap.parse_args()
    enc = GPT2Encoder(args.encoder, args.merges)
    failed = 0
    for docs, out_dir, shard_tokens, val_tokens in args.case:
        problems, *counts = check_case(enc, docs, out_dir, int(shard_tokens), val_tokens)
        for p in problems:
            print(f"  {out_dir}: {p}")
        if problems:
            failed += 1
        else:
            print(f"PASS check_corpus {out_dir}: {counts[0]} shards, {counts[1]} tokens, {counts[2]} documents: "
                  f"ids, sizes, headers and CRC32Cs as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
