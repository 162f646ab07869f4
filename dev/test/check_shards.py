#!/usr/bin/python3
"""Checks the shards prepro_text wrote against an independent reading of the input.

usage: check_shards.py --encoder E --merges M --input TEXT --val VAL.bin --train TRAIN.bin
                       --val-tokens N
Checks: llm.c shard headers (magic 20240520, version 1, count matching the file size);
val holds the first N tokens; and val + train equal, id for id, what the oracle
(bpe_reference.py) gives for llm.c's recipe: every blank-line separated section, each
ending after its "\\n\\n", prefixed with <|endoftext|>.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe_reference import GPT2Encoder  # noqa: E402


def read_shard(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(256 * 4), dtype=np.int32)
        body = f.read()
    problems = []
    if header.size != 256:
        return None, [f"{path}: header truncated"]
    if header[0] != 20240520:
        problems.append(f"{path}: magic {header[0]} != 20240520")
    if header[1] != 1:
        problems.append(f"{path}: version {header[1]} != 1")
    if len(body) != 2 * int(header[2]):
        problems.append(f"{path}: header says {header[2]} tokens, file holds {len(body) / 2}")
    return np.frombuffer(body, dtype=np.uint16).astype(np.int64), problems


def main():
    ap = argparse.ArgumentParser()
    for name in ("encoder", "merges", "input", "val", "train"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--val-tokens", type=int, required=True)
    args = ap.parse_args()

    val, p1 = read_shard(args.val)
    train, p2 = read_shard(args.train)
    problems = p1 + p2
    if not problems:
        enc = GPT2Encoder(args.encoder, args.merges)
        eot = enc.encoder["<|endoftext|>"]
        text = open(args.input, "rb").read().decode("utf-8")
        # str.split drops the separator; put "\n\n" back on every section but the last.
        sections = text.split("\n\n")
        expected = []
        for k, section in enumerate(sections):
            doc = section + ("\n\n" if k + 1 < len(sections) else "")
            expected.append(eot)
            expected.extend(enc.encode(doc))
        expected = np.array(expected, dtype=np.int64)
        got = np.concatenate([val, train])
        if len(val) != min(args.val_tokens, len(expected)):
            problems.append(f"val holds {len(val)} tokens, want {min(args.val_tokens, len(expected))}")
        if len(got) != len(expected):
            problems.append(f"shards hold {len(got)} tokens, oracle gives {len(expected)}")
        else:
            diff = np.nonzero(got != expected)[0]
            if diff.size:
                problems.append(f"{diff.size} ids differ from the oracle, first at token {diff[0]}")
        if int((got == eot).sum()) != len(sections):
            problems.append(f"{int((got == eot).sum())} <|endoftext|> tokens, want {len(sections)} documents")
    if problems:
        for p in problems:
            print("  " + p)
        print("FAIL check_shards")
        return 1
    print(f"PASS check_shards: val {len(val)} + train {len(train)} tokens, {len(sections)} documents, ids match the oracle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
