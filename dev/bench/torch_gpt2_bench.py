#!/usr/bin/env python3
"""The PyTorch peer: GPT-2 training steps in plain PyTorch, timed, for scripts/gpu_check.sh's
comparison with train_gpt2cu at the same shape, batch and optimizer.

  torch_gpt2_bench.py [--model d12] [-b 16] [-t 1024] [--steps 20] [--warmup 3]
                      [--device cuda|cpu] [--dtype bf16|fp32] [--compile]
  torch_gpt2_bench.py --model d2 -b 2 -t 64 --steps 3 --warmup 1 --device cpu   # a smoke run

The model is llmc/gpt2_spec.h's: depth N, C = 768/1024/1280/1600 for d12/24/36/48 and 64 N
otherwise, heads 64 wide, max T 1024, GPT-2's vocabulary padded to 50304 rows as the trainer
pads it (the logits of the padding are masked out of the loss), tied embedding, pre-LayerNorm
blocks, tanh GELU. A step is the trainer's: forward (bf16 autocast over fp32 weights with
--dtype bf16), cross-entropy, backward, gradient clipping at norm 1, AdamW with its defaults
(lr 3e-4, betas 0.9/0.95, eps 1e-8, no weight decay). Tokens are random: a step's time does not
depend on them. The first --warmup steps are not timed (allocation, autotuning, compilation);
the device is synchronised around the timed ones.

Prints one line (and nothing else on stdout):
  torch_bench model=d12 L=12 C=768 params=124475904 B=16 T=1024 device=cuda dtype=bf16 compile=0
      steps=20 ms/step=45.00 tok/s=364088 peak_mib=12345.6 loss=10.99
peak_mib: the device's peak allocated memory (CUDA), or the process's peak RSS (CPU).
"""
import argparse
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, PADDED_VOCAB, MAX_T = 50257, 50304, 1024


def channels_of(depth):
    return {12: 768, 24: 1024, 36: 1280, 48: 1600}.get(depth, 64 * depth)


class Block(nn.Module):
    def __init__(self, C, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: flash / memory-efficient kernels
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, depth):
        super().__init__()
        C = channels_of(depth)
        self.wte, self.wpe = nn.Embedding(PADDED_VOCAB, C), nn.Embedding(MAX_T, C)
        self.blocks = nn.ModuleList(Block(C, C // 64) for _ in range(depth))
        self.lnf = nn.LayerNorm(C)
        for name, p in self.named_parameters():  # GPT-2's init: N(0, 0.02), residual projections scaled
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * depth) if name.endswith(("proj.weight", "fc_proj.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # the tied classifier, all padded rows
        return F.cross_entropy(logits[..., :VOCAB].float().flatten(0, 1), targets.flatten())


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="d12", help="dN: GPT-2 of depth N (d12 = 124M)")
    ap.add_argument("-b", "--batch", type=int, default=16)
    ap.add_argument("-t", "--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="autocast dtype")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch >= 2.0)")
    a = ap.parse_args(argv)
    if not (a.model[:1] == "d" and a.model[1:].isdigit() and 1 <= int(a.model[1:]) <= 1024):
        ap.error(f"--model '{a.model}': want dN, N in 1..1024")
    if not (1 <= a.seq_len <= MAX_T) or a.batch < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("want -b >= 1, 1 <= -t <= 1024, --steps >= 1, --warmup >= 0")
    if a.compile and not hasattr(torch, "compile"):
        ap.error(f"--compile needs torch >= 2.0 (this is {torch.__version__})")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (--device cpu runs on the CPU)")
    return a


def main(argv):
    a = parse_args(argv)
    torch.manual_seed(42)
    device, depth = torch.device(a.device), int(a.model[1:])
    model = GPT2(depth).to(device)
    step_model = torch.compile(model) if a.compile else model
    cuda = device.type == "cuda"
    extra = {"fused": True} if cuda and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames else {}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, **extra)
    tokens = torch.randint(0, VOCAB, (a.batch, a.seq_len + 1), generator=torch.Generator().manual_seed(1234))
    idx, targets = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def step():
        with autocast:
            loss = step_model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(a.warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    ms = (time.perf_counter() - t0) * 1e3 / a.steps
    if cuda:
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    params = sum(p.numel() for p in model.parameters())
    print(f"torch_bench model={a.model} L={depth} C={channels_of(depth)} params={params} B={a.batch} T={a.seq_len} "
          f"device={device.type} "
          f"dtype={a.dtype} compile={int(a.compile)} steps={a.steps} ms/step={ms:.2f} "
          f"tok/s={a.batch * a.seq_len / ms * 1e3:.0f} peak_mib={peak_mib:.1f} loss={loss.item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
