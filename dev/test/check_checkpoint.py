"""Checks a checkpoint's optimizer.bin against the PyTorch oracle, independently of the
trainer's writer: after ONE step from m = v = 0 on the oracle's batch, AdamW leaves
    m = (1 - beta1) * g,   v = (1 - beta2) * g^2,   g = the oracle's gradient, clipped
(clip factor grad_clip / norm when the norm exceeds grad_clip), every tensor in llm.c's
tensor-major file order. Also checks the header (magic 20241129, version 1, step 1)
and the size. As a control, the same comparison against the gradient laid out in
canonical (layer-major) order must fail: the check can tell the two orders apart.

usage: check_checkpoint.py STATE.bin CHECKPOINT_DIR... [--beta1 0.9] [--beta2 0.95] [--grad-clip 1.0]
Prints "PASS|FAIL DIR: what" lines; exit 0 when everything passes, 1 otherwise.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_oracle import read_state  # noqa: E402

TOLERANCE = 1e-3  # of the largest expected value, as the oracle test's gradient check


def worst(got, want):
    scale = float(np.max(np.abs(want)))
    return float(np.max(np.abs(got.astype(np.float64) - want))) / scale


def canonical_order(cfg, file_order):
    """The same values with the tensors in canonical (layer-major) order, the trainer's
    in-memory order: what a writer that forgot the file order would produce."""
    blocks, at = {}, 0
    for name, kind, _ in cfg.file_order():
        n = int(np.prod(cfg.shape(kind)))
        blocks[name] = file_order[at:at + n]
        at += n
    return np.concatenate([blocks[name] for name, _, _ in cfg.canonical_order()])


def check(s, ckpt, a, report):
    cfg, n = s["cfg"], s["cfg"].num_params()
    path = os.path.join(ckpt, "optimizer.bin")
    data = np.fromfile(path, dtype="<u1")
    report(data.size == 1024 + 8 * n, f"{data.size} bytes (header + m + v for {n} parameters)")
    if data.size != 1024 + 8 * n:
        return
    header = data[:1024].view("<i4")
    report(list(header[:3]) == [20241129, 1, 1] and not header[3:].any(),
           f"header: magic {header[0]}, version {header[1]}, step {header[2]}, rest zero")
    m = data[1024:1024 + 4 * n].view("<f4")
    v = data[1024 + 4 * n:].view("<f4")
    norm = float(s["step_norms"][0])
    scale = a.grad_clip / norm if a.grad_clip > 0 and norm > a.grad_clip else 1.0
    g = s["grads"].astype(np.float64) * scale
    m_want, v_want = (1 - a.beta1) * g, (1 - a.beta2) * g * g
    em, ev = worst(m, m_want), worst(v, v_want)
    report(em <= TOLERANCE, f"m == (1-beta1) * clipped oracle gradient, file order (worst {em:.2e} of max)")
    report(ev <= 2 * TOLERANCE, f"v == (1-beta2) * its square, file order (worst {ev:.2e} of max)")
    control = worst(m, canonical_order(cfg, m_want))
    report(control > 100 * TOLERANCE, f"control: against layer-major order the check fails (worst {control:.2e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("state")
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    a = ap.parse_args()
    s = read_state(a.state)
    ok = True
    for ckpt in a.checkpoints:
        def report(good, what):
            nonlocal ok
            ok &= good
            print(("PASS " if good else "FAIL ") + ckpt + ": " + what)
        check(s, ckpt, a, report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
