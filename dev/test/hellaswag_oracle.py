#!/usr/bin/python3
"""Independent reference for the HellaSwag-style eval (-H 1, run/eval.h).

Reads llm.c's eval file format on its own (struct, no C code shared), scores every item
with gpt2_oracle.py's PyTorch GPT-2, and writes the files dev/test/test_hellaswag.sh needs.

  score   --model M --eval F [--dump OUT]   every item's 4 completion losses and the accuracy
  prepare --eval F --out-dir D --encoder J --input TXT
          checks the eval set against the text it came from (each context + right completion
          occurs verbatim in TXT; the wrong ones differ from the right one), writes a random
          model D/model.bin (L=2 C=64 NH=4 V=50257 maxT=64) and its scores D/oracle_dump.txt,
          crafted bad files D/bad_*.bin, and a planted set D/planted.bin (the first item the
          random model gets wrong, four times, its right completion at each place, labelled so) with D/planted_train.bin, a token
          shard of that item's context and right completion, over and over.

Scoring (the definition the C eval implements): a row is context + completion; the
completion's score is the mean cross-entropy of its tokens, each predicted from all tokens
before it; the prediction is the completion of lowest score (the first of equal ones).
Dump lines: "k index label predicted loss0 loss1 loss2 loss3".
"""

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe_reference  # noqa: E402
import gpt2_oracle as oracle  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MAGIC, VERSION, START = 20240522, 1, 65535


def read_eval(path):
    """-> list of dicts (index, label, ctx, ends). Raises ValueError on any malformed field."""
    data = open(path, "rb").read()
    if len(data) < 1024:
        raise ValueError(f"{path}: shorter than the header")
    magic, version, n = struct.unpack_from("<3i", data, 0)
    if (magic, version) != (MAGIC, VERSION) or n < 1:
        raise ValueError(f"{path}: header {magic} {version} {n}")
    body = data[1024:]
    if len(body) % 2:
        raise ValueError(f"{path}: odd body")
    u = struct.unpack(f"<{len(body) // 2}H", body)
    items, p = [], 0
    for k in range(n):
        start, nbytes, index, label, ncomp = u[p:p + 5]
        if start != START or ncomp != 4 or label >= 4 or p + nbytes // 2 > len(u):
            raise ValueError(f"{path}: item {k}: fields {u[p:p + 5]}")
        end, q = p + nbytes // 2, p + 5
        seqs = []
        for _ in range(5):  # the context, then 4 completions
            m = u[q]
            seqs.append(list(u[q + 1:q + 1 + m]))
            q += 1 + m
        if q != end or any(len(s) == 0 for s in seqs):
            raise ValueError(f"{path}: item {k}: its fields end at {q}, its byte count says {end}")
        items.append({"index": index, "label": label, "ctx": seqs[0], "ends": seqs[1:]})
        p = end
    if p != len(u):
        raise ValueError(f"{path}: {2 * (len(u) - p)} bytes after the last item")
    return items


def write_eval(path, items):
    """items as read_eval returns them (labels and lengths written as given, unchecked)."""
    stream, longest = [], 0
    for it in items:
        s = [START, 0, it["index"], it["label"], len(it["ends"]), len(it["ctx"])] + it["ctx"]
        for e in it["ends"]:
            s += [len(e)] + e
        s[1] = 2 * len(s)
        longest = max(longest, s[1])
        stream += s
    header = [MAGIC, VERSION, len(items), longest] + [0] * 252
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(stream)}H", *stream))


def completion_losses(cfg, params, it):
    """The 4 mean losses of item it: one batch of its 4 rows, padded to the longest row only."""
    rows = [it["ctx"] + e for e in it["ends"]]
    width = max(len(r) for r in rows) - 1
    x = torch.zeros((4, width), dtype=torch.long)
    y = torch.zeros((4, width), dtype=torch.long)
    for j, r in enumerate(rows):
        x[j, :len(r) - 1] = torch.tensor(r[:-1])
        y[j, :len(r) - 1] = torch.tensor(r[1:])
    with torch.no_grad():
        logits, _ = oracle.forward(cfg, params, x)
        losses = F.cross_entropy(logits[..., :cfg.V].reshape(-1, cfg.V), y.reshape(-1), reduction="none").view(4, -1)
    c = len(it["ctx"])
    return [float(losses[j, c - 1:c - 1 + len(e)].double().mean()) for j, e in enumerate(it["ends"])]


def score(cfg, params, items, dump_path):
    """-> every item's predicted completion; writes the dump lines."""
    preds = []
    with open(dump_path, "w") if dump_path else open(os.devnull, "w") as out:
        for k, it in enumerate(items):
            loss = completion_losses(cfg, params, it)
            preds.append(min(range(4), key=lambda j: (loss[j], j)))
            out.write(f"{k} {it['index']} {it['label']} {preds[-1]} " + " ".join(f"{v:.9g}" for v in loss) + "\n")
    return preds


def accuracy_text(items, preds):
    c = sum(p == it["label"] for p, it in zip(preds, items))
    return f"accuracy {c / len(items):.4f} ({c}/{len(items)})"


def decoder(encoder_path):
    byte_of = {ch: b for b, ch in bpe_reference.bytes_to_unicode().items()}
    ids = json.load(open(encoder_path, encoding="utf-8"))
    text_of = {i: bytes(byte_of[ch] for ch in tok) for tok, i in ids.items()}
    return lambda toks: b"".join(text_of[t] for t in toks)


def check_against_text(items, encoder_path, input_path):
    decode = decoder(encoder_path)
    text = open(input_path, "rb").read()
    for k, it in enumerate(items):
        ctx, right = decode(it["ctx"]), decode(it["ends"][it["label"]])
        if ctx + right not in text:
            raise ValueError(f"item {k}: context + right completion is not in {input_path}: {ctx + right!r}")
        for j, e in enumerate(it["ends"]):
            if j != it["label"] and e == it["ends"][it["label"]]:
                raise ValueError(f"item {k}: wrong completion {j} equals the right one")
    labels = sorted({it["label"] for it in items})
    print(f"hellaswag_oracle: {len(items)} items read; each context + right completion is in {input_path}; "
          f"labels used: {labels}")


def cmd_score(a):
    cfg, params, _ = oracle.read_model(a.model)
    items = read_eval(a.eval)
    print(f"hellaswag_oracle: {accuracy_text(items, score(cfg, params, items, a.dump))}")
    return 0


def write_bad_files(items, d):
    def variant(name, change):
        its = [dict(it, ends=list(it["ends"])) for it in items]
        change(its)
        write_eval(os.path.join(d, name), its)

    variant("bad_label.bin", lambda its: its[3].update(label=4))
    variant("bad_long.bin", lambda its: its[5].update(ctx=(its[5]["ctx"] * 8)[:70]))  # 70 + completion > 64
    write_eval(os.path.join(d, "bad_magic.bin"), items)
    with open(os.path.join(d, "bad_magic.bin"), "r+b") as f:
        f.write(struct.pack("<i", 20240520))  # a token shard's magic
    data = open(os.path.join(d, "good.bin"), "rb").read()
    open(os.path.join(d, "bad_cut.bin"), "wb").write(data[:-8])  # inside the last item


def write_planted(item, d):
    right = item["ends"][item["label"]]
    wrong = [e for j, e in enumerate(item["ends"]) if j != item["label"]]
    planted = []
    for j in range(4):  # the right completion at place j
        ends = wrong[:j] + [right] + wrong[j:]
        planted.append({"index": j, "label": j, "ctx": item["ctx"], "ends": ends})
    write_eval(os.path.join(d, "planted.bin"), planted)
    row = item["ctx"] + right
    toks = row * (4096 // len(row) + 1)  # enough for any -b, -t and rank count of the tests
    with open(os.path.join(d, "planted_train.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))


def cmd_prepare(a):
    items = read_eval(a.eval)
    check_against_text(items, a.encoder, a.input)
    d = a.out_dir
    write_eval(os.path.join(d, "good.bin"), items)  # rewritten by this reader's writer: the C reader must agree
    if open(os.path.join(d, "good.bin"), "rb").read() != open(a.eval, "rb").read():
        raise ValueError("the Python writer does not reproduce the C tool's file byte for byte")
    cfg = oracle.Config(maxT=64, V=50257, L=2, NH=4, C=64)
    params = oracle.init_params(cfg, a.seed)
    oracle.write_model(os.path.join(d, "model.bin"), cfg, params, "fp32")
    preds = score(cfg, params, items, os.path.join(d, "oracle_dump.txt"))
    print(f"hellaswag_oracle: random model {accuracy_text(items, preds)}")
    write_bad_files(items, d)
    # An item the random model gets wrong: it scores 0/4 planted until training teaches it.
    k = next(k for k, it in enumerate(items) if preds[k] != it["label"])
    write_planted(items[k], d)
    print(f"hellaswag_oracle: planted item {k}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score")
    s.add_argument("--model", required=True)
    s.add_argument("--eval", required=True)
    s.add_argument("--dump", default=None)
    s.set_defaults(func=cmd_score)
    p = sub.add_parser("prepare")
    p.add_argument("--eval", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--encoder", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--seed", type=int, default=7)
    p.set_defaults(func=cmd_prepare)
    a = ap.parse_args()
    torch.set_num_threads(1)
    try:
        return a.func(a)
    except (ValueError, OSError, oracle.OracleError) as e:
        print(f"hellaswag_oracle: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
