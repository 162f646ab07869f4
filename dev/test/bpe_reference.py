#!/usr/bin/env python3
"""An independent GPT-2 BPE encoder: the test oracle for tools/bpe.h.

Independent on purpose: the pre-tokenisation runs GPT-2's pattern through Python's own
regex engine (`re`, with real backtracking and lookahead), with the Unicode classes
computed here from unicodedata at start-up, not the C tables; the BPE is GPT-2's
original "merge the best pair everywhere, repeat" loop, not the C heap.
Python's `re` lacks \\p{..}, and its \\s is str.isspace() (which adds U+001C..U+001F to
Unicode's White_Space), so all three classes are spelled out as explicit ranges.

usage: bpe_reference.py --encoder encoder.json --merges vocab.bpe [--pretokens] [FILE]
prints the ids of FILE (default stdin) as UTF-8 text, space separated, on one line;
with --pretokens, the UTF-8 byte length of each pre-token instead; with --records, the
input is NUL-separated records, each handled alone and printed on its own line.
"""
import argparse
import json
import re
import sys
import unicodedata


def code_point_ranges(predicate):
    out, start = [], None
    for cp in range(0x110000):
        if predicate(cp):
            if start is None:
                start = cp
        elif start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, 0x10FFFF))
    return out


def class_body(ranges):
    return "".join("\\U%08x-\\U%08x" % (lo, hi) if lo != hi else "\\U%08x" % lo for lo, hi in ranges)


def gpt2_pattern():
    cat = unicodedata.category
    letters = class_body(code_point_ranges(lambda cp: cat(chr(cp))[0] == "L"))
    numbers = class_body(code_point_ranges(lambda cp: cat(chr(cp)) in ("Nd", "Nl", "No")))
    # Unicode White_Space, as the `regex` module's \s: the separators plus TAB..CR and NEL.
    spaces = class_body(code_point_ranges(
        lambda cp: 9 <= cp <= 13 or cp == 0x85 or cat(chr(cp)) in ("Zs", "Zl", "Zp")))
    L, N, S = "[" + letters + "]", "[" + numbers + "]", "[" + spaces + "]"
    other = "[^" + spaces + letters + numbers + "]"
    not_space = "[^" + spaces + "]"
    pattern = ("'s|'t|'re|'ve|'m|'ll|'d"
               "| ?" + L + "+| ?" + N + "+| ?" + other + "+"
               "|" + S + "+(?!" + not_space + ")|" + S + "+")
    return re.compile(pattern)


def bytes_to_unicode():
    """GPT-2's printable spelling of every byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class GPT2Encoder:
    def __init__(self, encoder_path, merges_path):
        with open(encoder_path, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[0].startswith("#version"):
            lines = lines[1:]
        merges = [tuple(line.split(" ")) for line in lines if line]
        self.ranks = {}
        for r, pair in enumerate(merges):
            self.ranks.setdefault(pair, r)
        self.byte_spelling = bytes_to_unicode()
        self.pattern = gpt2_pattern()
        self.cache = {}

    def bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            best = min(zip(parts, parts[1:]), key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == best[0] and parts[i + 1] == best[1]:
                    merged.append(best[0] + best[1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        self.cache[word] = parts
        return parts

    def pretokens(self, text):
        return self.pattern.findall(text)

    def encode(self, text):
        ids = []
        for piece in self.pretokens(text):
            spelled = "".join(self.byte_spelling[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(spelled))
        return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoder", required=True)
    ap.add_argument("--merges", required=True)
    ap.add_argument("--pretokens", action="store_true")
    ap.add_argument("--records", action="store_true")
    ap.add_argument("file", nargs="?")
    args = ap.parse_args()
    raw = open(args.file, "rb").read() if args.file else sys.stdin.buffer.read()
    text = raw.decode("utf-8")  # the oracle only handles valid UTF-8
    enc = GPT2Encoder(args.encoder, args.merges)
    records = text.split("\0") if args.records else [text]
    if args.records and records[-1] == "":
        records.pop()  # a trailing NUL ends the last record; it does not start one
    for record in records:
        if args.pretokens:
            out = [len(p.encode("utf-8")) for p in enc.pretokens(record)]
        else:
            out = enc.encode(record)
        print(" ".join(str(x) for x in out))


if __name__ == "__main__":
    main()
