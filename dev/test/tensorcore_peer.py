#!/usr/bin/env python3
"""The CPU layer's tensor-core model (cuda_cpu/tensorcore.cpp's tc_dot) against its peer,
MMA-Sim (PyPI `mmasim`, pinned in dev/test/mmasim.sh), bit for bit.

    tensorcore_peer.py --site D/site --bin build/cuda_cpu/tests/test_tensorcore --arch Hopper

draws bf16 dot products with an fp32 accumulator (k = 16, 32, 64, 48: one group and chains of
groups) of several kinds, has the layer compute them (`test_tensorcore peer IN OUT`, under the
CUDA_CPU_TC_* settings of --arch) and MMA-Sim's dot-product model for that architecture's
mma.sync bf16 -> fp32 (its own tables: F bits, L_max, e_zero), and prints one line per kind;
exit 1 if any result differs in a bit. --layer-env NAME=VALUE overrides one of the layer's
settings (the test's planted change: CUDA_CPU_TC_GROUP=0, the former exact model, must differ).

Shims (MMA-Sim declares torch >= 2.9; this runs on Debian's torch 1.13): torch's float8 dtypes,
which its tables name but the bf16 path never uses, are placeholders; its fma module, which
compiles a C++ extension at import for fp64 mma only, is replaced by an empty module; and
the operation is built from sim.py's tables directly, because sim.MMA reads dtype.itemsize
(torch >= 2.1) for the group length (32 bytes / 2 bytes a bf16).
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile
import types

import torch

# The CUDA_CPU_TC_* settings the layer documents for each architecture (docs/cuda_cpu.md).
LAYER_SETTINGS = {"Hopper": {"CUDA_CPU_TC_GROUP": "16", "CUDA_CPU_TC_EXTRA_BITS": "2"},
                  "Ampere": {"CUDA_CPU_TC_GROUP": "8", "CUDA_CPU_TC_EXTRA_BITS": "1"}}
BF16_MIN_EXP = -126


def peer_op(site, arch):
    for name in ["float8_e8m0fnu", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz"]:
        if not hasattr(torch, name):
            setattr(torch, name, object())
    sys.path.insert(0, site)
    import mmasim.arithmetic
    fake = types.ModuleType("mmasim.arithmetic.fma")
    fake.MMA_FMA = None
    sys.modules["mmasim.arithmetic.fma"] = fake
    mmasim.arithmetic.fma = fake
    from mmasim.nv_ptx import sim
    from mmasim.arithmetic import fdpa
    return fdpa.MMA_T_FDPA(sim._mma_F_bits[arch], "RZ-FP32", sim._mma_L_max_bytes[arch] // 2,
                           sim._mma_e_zero_for_fp32[arch], "bf16", "bf16")


def cases(kind, n, k, g):
    """a, b (n x k, bf16 values) and c (n, fp32) of one kind."""
    a = torch.randn(n, k, generator=g)
    b = torch.randn(n, k, generator=g)
    c = torch.randn(n, generator=g)
    if kind == "wide exponents":
        a = a * torch.exp2(torch.randint(-30, 31, (n, k), generator=g).float())
        b = b * torch.exp2(torch.randint(-30, 31, (n, k), generator=g).float())
        c = c * torch.exp2(torch.randint(-40, 41, (n,), generator=g).float())
    elif kind == "cancellation":
        a[:, 1::2] = -a[:, 0::2]
        b[:, 1::2] = b[:, 0::2]
        a[:, -1] = a[:, -1] * 2.0 ** -20
        c = c * 2.0 ** -10
    elif kind == "large accumulator":
        c = c * 2.0 ** 24
    elif kind == "zero accumulator":
        c = torch.zeros(n)
    elif kind == "one-signed":
        a, b = a.abs(), b.abs()
    elif kind == "tiny":
        a = a * 2.0 ** -60
        b = b * 2.0 ** -60
        c = c * 2.0 ** -125
    return a.to(torch.bfloat16), b.to(torch.bfloat16), c


def layer(binary, arch, a, b, c, overrides):
    n, k = a.shape
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        rec = torch.cat([c[:, None], a.float(), b.float()], dim=1).contiguous()
        with open(inp, "wb") as f:
            f.write(struct.pack("<3i", n, k, BF16_MIN_EXP))
            f.write(rec.numpy().tobytes())
        env = {**os.environ, **LAYER_SETTINGS[arch], **overrides}
        subprocess.run([binary, "peer", inp, out], env=env, check=True)
        return torch.frombuffer(bytearray(open(out, "rb").read()), dtype=torch.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--site", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--arch", choices=sorted(LAYER_SETTINGS), required=True)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--layer-env", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()
    overrides = dict(kv.split("=", 1) for kv in args.layer_env)
    op = peer_op(args.site, args.arch)
    g = torch.Generator().manual_seed(args.seed)
    bad = 0
    for kind in ["normal", "wide exponents", "cancellation", "large accumulator", "zero accumulator", "one-signed",
                 "tiny"]:
        for k in [16, 32, 48, 64]:
            a, b, c = cases(kind, args.n, k, g)
            ours = layer(args.bin, args.arch, a, b, c, overrides)
            theirs = op.dpa(a, b, c).float()
            differ = (ours.view(torch.int32) != theirs.view(torch.int32)) & ~(ours.isnan() & theirs.isnan())
            bad += int(differ.sum())
            print("%s %s k=%d: %d of %d differ in a bit" % (args.arch, kind, k, int(differ.sum()), args.n))
            if differ.any():
                i = int(differ.nonzero()[0])
                print("    first: layer %r (0x%08x), MMA-Sim %r (0x%08x)" % (
                    float(ours[i]), int(ours.view(torch.int32)[i]) & 0xffffffff, float(theirs[i]),
                    int(theirs.view(torch.int32)[i]) & 0xffffffff))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
