#!/usr/bin/python3
"""PyTorch (CPU) oracle for the C GPT-2 trainers.

Every numeric claim of train_gpt2.c / train_gpt2.cu is checked against this file:
it builds the same GPT-2 as llm.c (pre-LN, GELU-tanh, tied lm_head, vocabulary padded
to Vp), writes an llm.c model file and a "debug state" (inputs, logits, loss, every
gradient, and the losses/norms of several clipped-AdamW steps on one batch).

Run it with an interpreter that has torch: $LLMC_PYTHON, by default Debian's /usr/bin/python3
(the tests call it that way): $LLMC_PYTHON dev/test/gpt2_oracle.py ...
Subcommands: make, bench, check-model, selftest (formats: docs/formats.md, "Model file" and "Oracle debug state").

Numerics: everything is float32 (parameters, activations, gradients, AdamW state and
arithmetic), because that is what the C trainer computes; only the global gradient norm
is accumulated in float64 and then rounded to float32, so the reference norm is the
exact value the trainer's (float) sum approximates.
"""

import argparse
import math
import os
import struct
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MODEL_MAGIC = 20240326
MODEL_VERSION_FP32 = 3
MODEL_VERSION_BF16 = 5
TOKENS_MAGIC = 20240520
STATE_MAGIC = 20240327
STATE_VERSION = 3
HEADER_INTS = 256

# Per-layer tensor kinds in canonical order (docs/design.md, "Canonical parameter order").
LAYER_KINDS = ["ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb"]
# Tensors that get weight decay (the 2-D ones); biases and LayerNorm params never do.
DECAY_KINDS = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}
# Residual projections: their init std is scaled by 1/sqrt(2L) (GPT-2 paper).
RESIDUAL_KINDS = {"attprojw", "fcprojw"}


class OracleError(Exception):
    """Bad input: reported as one line, exit code 2."""


def padded_vocab(V):
    return ((V + 127) // 128) * 128


class Config:
    def __init__(self, maxT, V, L, NH, C, Vp=None):
        self.maxT, self.V, self.L, self.NH, self.C = int(maxT), int(V), int(L), int(NH), int(C)
        self.Vp = padded_vocab(self.V) if Vp is None else int(Vp)
        self.validate()

    def validate(self):
        for name in ("maxT", "V", "L", "NH", "C"):
            if getattr(self, name) <= 0:
                raise OracleError(f"config: {name} must be > 0, got {getattr(self, name)}")
        if self.C % self.NH != 0:
            raise OracleError(f"config: channels {self.C} not divisible by heads {self.NH}")
        if self.Vp < self.V or self.Vp % 128 != 0:
            # llm.c only requires Vp >= V; we accept any multiple of 128 that covers V.
            raise OracleError(f"config: padded vocab {self.Vp} must be a multiple of 128 and >= vocab {self.V}")

    def shape(self, kind):
        """PyTorch shape of one tensor (per layer for layer kinds); weights are [out, in]."""
        C = self.C
        return {
            "wte": (self.Vp, C), "wpe": (self.maxT, C),
            "ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C), "qkvb": (3 * C,),
            "attprojw": (C, C), "attprojb": (C,), "ln2w": (C,), "ln2b": (C,),
            "fcw": (4 * C, C), "fcb": (4 * C,), "fcprojw": (C, 4 * C), "fcprojb": (C,),
            "lnfw": (C,), "lnfb": (C,),
        }[kind]

    def file_order(self):
        """(name, kind, layer) of every tensor in llm.c's tensor-major file order."""
        out = [("wte", "wte", None), ("wpe", "wpe", None)]
        for kind in LAYER_KINDS:
            for l in range(self.L):
                out.append((f"h{l}.{kind}", kind, l))
        out += [("lnfw", "lnfw", None), ("lnfb", "lnfb", None)]
        return out

    def canonical_order(self):
        """(name, kind, layer) in canonical layer-major order (docs/design.md)."""
        out = [("wte", "wte", None), ("wpe", "wpe", None)]
        for l in range(self.L):
            for kind in LAYER_KINDS:
                out.append((f"h{l}.{kind}", kind, l))
        out += [("lnfw", "lnfw", None), ("lnfb", "lnfb", None)]
        return out

    def num_params(self):
        return sum(int(np.prod(self.shape(kind))) for _, kind, _ in self.file_order())

    def __str__(self):
        return (f"maxT={self.maxT} V={self.V} Vp={self.Vp} L={self.L} NH={self.NH} C={self.C} "
                f"num_params={self.num_params()}")


# ----------------------------------------------------------------------------
# bf16 (round to nearest even on the upper 16 bits, like llmc/bf16.h)

def bf16_bits(a):
    """float32 array -> uint16 bf16 bits, round-to-nearest-even; NaN stays a (quiet) NaN."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, ((u >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), rounded)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_bf16(a):
    """float32 array -> float32 array holding the bf16-rounded values."""
    return bf16_bits_to_f32(bf16_bits(a))


# ----------------------------------------------------------------------------
# parameters: a dict name -> float32 leaf tensor, one per (kind, layer), PyTorch layout.
# Separate tensors per layer (not one stacked tensor per kind) so that backward does not
# scatter into whole stacked tensors, which would distort the benchmark.

def init_params(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, kind, _ in cfg.canonical_order():
        shape = cfg.shape(kind)
        if kind in ("ln1w", "ln2w", "lnfw"):
            t = torch.ones(shape)
        elif len(shape) == 1:
            t = torch.zeros(shape)  # biases and LayerNorm biases
        else:
            std = 0.02 / math.sqrt(2 * cfg.L) if kind in RESIDUAL_KINDS else 0.02
            t = torch.empty(shape).normal_(0.0, std, generator=g)
        params[name] = t
    params["wte"][cfg.V:] = 0.0  # padded vocabulary rows never receive a token
    return params


def flatten_params(cfg, tensors):
    """Concatenate tensors (params or grads, dict by name) in llm.c file order -> float32 numpy."""
    return np.concatenate([tensors[name].detach().reshape(-1).numpy().astype(np.float32, copy=False)
                           for name, _, _ in cfg.file_order()])


def unflatten_params(cfg, flat):
    params, off = {}, 0
    for name, kind, _ in cfg.file_order():
        shape = cfg.shape(kind)
        n = int(np.prod(shape))
        params[name] = torch.from_numpy(np.array(flat[off:off + n], dtype=np.float32)).reshape(shape)
        off += n
    assert off == flat.size
    return params


def write_model(path, cfg, params, dtype):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0] = MODEL_MAGIC
    header[1] = MODEL_VERSION_BF16 if dtype == "bf16" else MODEL_VERSION_FP32
    header[2:8] = [cfg.maxT, cfg.V, cfg.L, cfg.NH, cfg.C, cfg.Vp]
    flat = flatten_params(cfg, params)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        if dtype == "bf16":
            f.write(bf16_bits(flat).astype("<u2").tobytes())
        else:
            f.write(flat.astype("<f4").tobytes())


def read_with_header(path, what):
    """-> (the file's bytes, its 256-int header). what names the kind of file in errors."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise OracleError(f"cannot read {what} {path}: {e.strerror}")
    if len(data) < HEADER_INTS * 4:
        raise OracleError(f"{what} {path}: {len(data)} bytes, shorter than its 1024-byte header")
    return data, np.frombuffer(data, dtype="<i4", count=HEADER_INTS)


def read_model(path):
    """-> (cfg, params dict of float32 tensors, dtype string). bf16 values are widened exactly."""
    data, header = read_with_header(path, "model file")
    if header[0] != MODEL_MAGIC:
        raise OracleError(f"model file {path}: bad magic {header[0]} (expected {MODEL_MAGIC})")
    version = int(header[1])
    if version not in (MODEL_VERSION_FP32, MODEL_VERSION_BF16):
        raise OracleError(f"model file {path}: unsupported version {version} (3 = fp32, 5 = bf16)")
    cfg = Config(maxT=header[2], V=header[3], L=header[4], NH=header[5], C=header[6], Vp=header[7])
    n = cfg.num_params()
    elem = 4 if version == MODEL_VERSION_FP32 else 2
    expected = HEADER_INTS * 4 + n * elem
    if len(data) != expected:
        raise OracleError(f"model file {path}: {len(data)} bytes, expected {expected} for {cfg}")
    body = data[HEADER_INTS * 4:]
    if version == MODEL_VERSION_FP32:
        flat = np.frombuffer(body, dtype="<f4").astype(np.float32)
        dtype = "fp32"
    else:
        flat = bf16_bits_to_f32(np.frombuffer(body, dtype="<u2"))
        dtype = "bf16"
    return cfg, unflatten_params(cfg, flat), dtype


def read_tokens(path, count, V):
    data, header = read_with_header(path, "token shard")
    if header[0] != TOKENS_MAGIC or header[1] != 1:
        raise OracleError(f"token shard {path}: bad magic/version {header[0]}/{header[1]} "
                          f"(expected {TOKENS_MAGIC}/1)")
    ntok = int(header[2])
    if len(data) != HEADER_INTS * 4 + 2 * ntok:
        raise OracleError(f"token shard {path}: {len(data)} bytes but header says {ntok} tokens")
    if ntok < count:
        raise OracleError(f"token shard {path}: has {ntok} tokens, need B*T+1 = {count}")
    toks = np.frombuffer(data, dtype="<u2", count=count, offset=HEADER_INTS * 4).astype(np.int64)
    if toks.max() >= V:
        raise OracleError(f"token shard {path}: token id {int(toks.max())} >= vocab size {V}")
    return toks


# ----------------------------------------------------------------------------
# the model, functional

def forward(cfg, p, x, y=None):
    """x, y: (B, T) int64. Returns (logits (B,T,Vp), loss or None)."""
    B, T = x.shape
    C, NH = cfg.C, cfg.NH
    hs = C // NH
    pos = torch.arange(T)
    h = F.embedding(x, p["wte"]) + F.embedding(pos, p["wpe"])[None]
    # Causal mask: position t attends to 0..t.
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scale = 1.0 / math.sqrt(hs)
    for l in range(cfg.L):
        a = F.layer_norm(h, (C,), p[f"h{l}.ln1w"], p[f"h{l}.ln1b"], eps=1e-5)
        qkv = F.linear(a, p[f"h{l}.qkvw"], p[f"h{l}.qkvb"])
        q, k, v = qkv.split(C, dim=-1)  # q, k, v in that order along the last dim
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + F.linear(o, p[f"h{l}.attprojw"], p[f"h{l}.attprojb"])
        a = F.layer_norm(h, (C,), p[f"h{l}.ln2w"], p[f"h{l}.ln2b"], eps=1e-5)
        m = F.gelu(F.linear(a, p[f"h{l}.fcw"], p[f"h{l}.fcb"]), approximate="tanh")
        h = h + F.linear(m, p[f"h{l}.fcprojw"], p[f"h{l}.fcprojb"])
    h = F.layer_norm(h, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    logits = h @ p["wte"].t()  # all Vp columns, as the C trainer computes them
    loss = None
    if y is not None:
        # Only the real vocabulary takes part in the softmax; padded columns get no gradient.
        loss = F.cross_entropy(logits[..., :cfg.V].reshape(-1, cfg.V), y.reshape(-1))
    return logits, loss


def forward_backward(cfg, p, x, y):
    """-> (logits, loss float32, grads dict). p's tensors must require grad."""
    for t in p.values():
        t.grad = None
    logits, loss = forward(cfg, p, x, y)
    loss.backward()
    return logits.detach(), loss.detach(), {k: t.grad for k, t in p.items()}


def global_norm(grads):
    # float64 accumulation, then float32: the exact value that the trainer approximates.
    s = sum(float(g.double().pow(2).sum()) for g in grads.values())
    return np.float32(math.sqrt(s))


class ManualAdamW:
    """AdamW written out (PyTorch semantics, decoupled weight decay), float32 throughout.

    Per element, at step t (1-based):
        p -= lr * wd * p                      (decay tensors only)
        m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
        p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
    """

    def __init__(self, params, lr, beta1, beta2, eps, weight_decay):
        self.params = params
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, beta1, beta2, eps, weight_decay
        self.m = {k: torch.zeros_like(t) for k, t in params.items()}
        self.v = {k: torch.zeros_like(t) for k, t in params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self, grads):
        self.t += 1
        bc1 = 1.0 - self.b1 ** self.t
        bc2 = 1.0 - self.b2 ** self.t
        for name, p in self.params.items():
            g = grads[name]
            kind = name.split(".")[-1]
            if kind in DECAY_KINDS and self.wd != 0.0:
                p.mul_(1.0 - self.lr * self.wd)
            m, v = self.m[name], self.v[name]
            m.mul_(self.b1).add_(g, alpha=1.0 - self.b1)
            v.mul_(self.b2).addcmul_(g, g, value=1.0 - self.b2)
            denom = (v / bc2).sqrt_().add_(self.eps)
            p.addcdiv_(m / bc1, denom, value=-self.lr)


def clip_grads(grads, norm, grad_clip):
    """The trainer's rule: scale by grad_clip/norm iff grad_clip > 0 and norm > grad_clip."""
    if grad_clip > 0.0 and norm > grad_clip:
        scale = np.float32(grad_clip) / norm
        for g in grads.values():
            g.mul_(float(scale))


def train_steps(cfg, params, x, y, steps, hp, bf16_params):
    """Runs `steps` clipped-AdamW steps on one batch.

    params: fp32 master values (already bf16-rounded when bf16_params). With bf16_params,
    each forward uses bf16(master), like the trainer that keeps an fp32 master and writes
    the updated values back into its bf16 param buffer.
    Returns (first logits, first loss, first grads, losses[steps], norms[steps]).
    """
    master = {k: t.clone() for k, t in params.items()}
    opt = ManualAdamW(master, hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"])
    losses, norms = [], []
    first = None
    for _ in range(steps if steps > 0 else 1):
        if bf16_params:
            work = {k: torch.from_numpy(round_bf16(t.numpy())).requires_grad_(True) for k, t in master.items()}
        else:
            work = {k: t.detach().clone().requires_grad_(True) for k, t in master.items()}
        logits, loss, grads = forward_backward(cfg, work, x, y)
        norm = global_norm(grads)
        if first is None:
            first = (logits, loss, {k: g.clone() for k, g in grads.items()})
        if steps == 0:
            break
        losses.append(np.float32(loss.item()))
        norms.append(norm)
        clip_grads(grads, norm, hp["grad_clip"])
        opt.step(grads)
    return first[0], first[1], first[2], np.array(losses, np.float32), np.array(norms, np.float32)


# ----------------------------------------------------------------------------
# debug state

def write_state(path, cfg, B, T, hp, x, y, logits, loss, grads, step_losses, step_norms):
    steps = len(step_losses)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0:11] = [STATE_MAGIC, STATE_VERSION, B, T, cfg.V, cfg.Vp, steps, cfg.L, cfg.NH, cfg.C, cfg.maxT]
    hparams = np.array([hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"], hp["grad_clip"], 0, 0],
                       dtype="<f4")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(hparams.tobytes())
        f.write(np.asarray(x, dtype="<i4").reshape(-1).tobytes())
        f.write(np.asarray(y, dtype="<i4").reshape(-1).tobytes())
        f.write(logits.numpy().astype("<f4").reshape(-1).tobytes())
        f.write(np.array([loss], dtype="<f4").tobytes())
        f.write(flatten_params(cfg, grads).astype("<f4").tobytes())
        f.write(np.asarray(step_losses, dtype="<f4").tobytes())
        f.write(np.asarray(step_norms, dtype="<f4").tobytes())


def read_state(path):
    """Parses a debug state file into a dict (used by selftest; a reader for other tools)."""
    with open(path, "rb") as f:
        data = f.read()
    header = np.frombuffer(data, dtype="<i4", count=HEADER_INTS)
    if header[0] != STATE_MAGIC or header[1] != STATE_VERSION:
        raise OracleError(f"state file {path}: bad magic/version {header[0]}/{header[1]}")
    B, T, V, Vp, steps, L, NH, C, maxT = (int(v) for v in header[2:11])
    cfg = Config(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp)
    off = HEADER_INTS * 4
    out = {"cfg": cfg, "B": B, "T": T, "steps": steps}

    def take(dtype, n):
        nonlocal off
        a = np.frombuffer(data, dtype=dtype, count=n, offset=off)
        off += n * 4
        return a

    out["hparams"] = take("<f4", 8)
    out["x"] = take("<i4", B * T).reshape(B, T)
    out["y"] = take("<i4", B * T).reshape(B, T)
    out["logits"] = take("<f4", B * T * Vp).reshape(B, T, Vp)
    out["loss"] = float(take("<f4", 1)[0])
    out["grads"] = take("<f4", cfg.num_params())
    out["step_losses"] = take("<f4", steps)
    out["step_norms"] = take("<f4", steps)
    if off != len(data):
        raise OracleError(f"state file {path}: {len(data)} bytes, expected {off}")
    return out


# ----------------------------------------------------------------------------
# subcommands

def hparams_from_args(a):
    return {"lr": a.lr, "beta1": a.beta1, "beta2": a.beta2, "eps": a.eps,
            "weight_decay": a.weight_decay, "grad_clip": a.grad_clip}


def make_batch(cfg, B, T, seed, tokens_path):
    if T > cfg.maxT:
        raise OracleError(f"sequence length {T} > max sequence length {cfg.maxT}")
    if B <= 0 or T <= 0:
        raise OracleError(f"batch {B} and sequence length {T} must be > 0")
    n = B * T + 1
    if tokens_path:
        toks = read_tokens(tokens_path, n, cfg.V)
        toks = torch.from_numpy(toks)
    else:
        # A separate stream from the parameter init, so the batch does not change with the model size.
        g = torch.Generator().manual_seed(seed + 1)
        toks = torch.randint(0, cfg.V, (n,), generator=g, dtype=torch.int64)
    return toks[:-1].reshape(B, T).clone(), toks[1:].reshape(B, T).clone()


def run_make(cfg, B, T, dtype, seed, steps, hp, tokens_path, train_dtype=None):
    """Shared by `make` and selftest: -> (params as stored, x, y, logits, loss, grads, losses, norms).
    train_dtype: the parameter storage the AdamW steps model (default: the file's dtype).
    "fp32" after a bf16 file is what a trainer with fp32 params does after loading it."""
    if steps < 0:
        raise OracleError(f"--steps must be >= 0, got {steps}")
    params = init_params(cfg, seed)
    if dtype == "bf16":
        # The reference starts from exactly what the trainer reads from a version-5 file.
        params = {k: torch.from_numpy(round_bf16(t.numpy())) for k, t in params.items()}
    x, y = make_batch(cfg, B, T, seed, tokens_path)
    train_dtype = train_dtype or dtype
    logits, loss, grads, losses, norms = train_steps(cfg, params, x, y, steps, hp, train_dtype == "bf16")
    return params, x, y, logits, loss, grads, losses, norms


def cmd_make(a):
    torch.set_num_threads(a.threads)
    cfg = Config(maxT=a.max_seq, V=a.vocab, L=a.layers, NH=a.heads, C=a.channels)
    hp = hparams_from_args(a)
    t0 = time.time()
    params, x, y, logits, loss, grads, losses, norms = run_make(cfg, a.batch, a.seq, a.dtype, a.seed, a.steps,
                                                                hp, a.tokens, a.train_dtype)
    write_model(a.out_model, cfg, params, a.dtype)
    write_state(a.out_state, cfg, a.batch, a.seq, hp, x.numpy(), y.numpy(), logits, float(loss), grads,
                losses, norms)
    print(f"oracle: {cfg} B={a.batch} T={a.seq} dtype={a.dtype} seed={a.seed}")
    print(f"oracle: loss at init {float(loss):.6f} (ln V = {math.log(cfg.V):.6f})")
    if len(losses):
        print(f"oracle: step losses {losses[0]:.6f} -> {losses[-1]:.6f} over {len(losses)} steps, "
              f"norms {norms[0]:.4f} -> {norms[-1]:.4f}")
    print(f"oracle: wrote {a.out_model} and {a.out_state} in {time.time() - t0:.2f} s")
    return 0


def cmd_bench(a):
    torch.set_num_threads(a.threads)
    cfg, params, _ = read_model(a.model)
    if a.steps <= 0 or a.warmup < 0:
        raise OracleError("--steps must be > 0 and --warmup >= 0")
    x, y = make_batch(cfg, a.batch, a.seq, 1234, None)
    p = {k: t.clone().requires_grad_(True) for k, t in params.items()}
    decay = [t for k, t in p.items() if k.split(".")[-1] in DECAY_KINDS]
    no_decay = [t for k, t in p.items() if k.split(".")[-1] not in DECAY_KINDS]
    # torch's own AdamW, single-tensor (foreach off): plain eager PyTorch as a user would run it.
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = forward(cfg, p, x, y)
        loss.backward()
        norm = global_norm({k: t.grad for k, t in p.items()})
        clip_grads({k: t.grad for k, t in p.items()}, norm, 1.0)
        opt.step()
    dt = time.perf_counter() - t0
    print(f"oracle_tokens_per_s {a.batch * a.seq * a.steps / dt:.1f}")
    return 0


def cmd_check_model(a):
    cfg, params, dtype = read_model(a.model)
    print(f"model {a.model}: dtype={dtype} {cfg}")
    if a.verbose:
        for name, _, _ in cfg.file_order():
            t = params[name]
            print(f"  {name:14s} {str(tuple(t.shape)):14s} mean {t.mean():+.6f} std {t.std() if t.numel() > 1 else 0:.6f}")
    return 0


# ----------------------------------------------------------------------------
# selftest

def reference_forward_numpy(cfg, p, x, y):
    """Independent float64 forward with explicit per-head loops: checks the head split,
    the q/k/v order, the causal mask and the tied, padded lm_head of forward()."""
    P = {k: t.detach().double().numpy() for k, t in p.items()}
    B, T = x.shape
    C, NH = cfg.C, cfg.NH
    hs = C // NH

    def ln(h, w, b):
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return (h - mu) / np.sqrt(var + 1e-5) * w + b

    def gelu(u):
        return 0.5 * u * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))

    h = P["wte"][x] + P["wpe"][:T][None]
    for l in range(cfg.L):
        a = ln(h, P[f"h{l}.ln1w"], P[f"h{l}.ln1b"])
        qkv = a @ P[f"h{l}.qkvw"].T + P[f"h{l}.qkvb"]
        o = np.zeros((B, T, C))
        for b in range(B):
            for hd in range(NH):
                q = qkv[b, :, hd * hs:(hd + 1) * hs]
                k = qkv[b, :, C + hd * hs:C + (hd + 1) * hs]
                v = qkv[b, :, 2 * C + hd * hs:2 * C + (hd + 1) * hs]
                for t in range(T):
                    s = k[:t + 1] @ q[t] / math.sqrt(hs)
                    w = np.exp(s - s.max())
                    o[b, t, hd * hs:(hd + 1) * hs] = (w / w.sum()) @ v[:t + 1]
        h = h + o @ P[f"h{l}.attprojw"].T + P[f"h{l}.attprojb"]
        a = ln(h, P[f"h{l}.ln2w"], P[f"h{l}.ln2b"])
        h = h + gelu(a @ P[f"h{l}.fcw"].T + P[f"h{l}.fcb"]) @ P[f"h{l}.fcprojw"].T + P[f"h{l}.fcprojb"]
    h = ln(h, P["lnfw"], P["lnfb"])
    logits = h @ P["wte"].T
    z = logits[..., :cfg.V]
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, y[..., None], -1).mean()
    return logits, loss


def cmd_selftest(a):
    import tempfile
    torch.set_num_threads(1)
    failures = []

    def check(cond, what):
        print(f"  [{'ok' if cond else 'FAIL'}] {what}")
        if not cond:
            failures.append(what)

    hp = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0}
    tmp = tempfile.mkdtemp(prefix="gpt2_oracle_")

    print("selftest: bf16 rounding matches torch")
    r = np.random.default_rng(0).standard_normal(100000).astype(np.float32) * 3
    r[:4] = [np.inf, -np.inf, 0.0, -0.0]
    ours = bf16_bits(r)
    theirs = torch.from_numpy(r).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    check(np.array_equal(ours, theirs), "bf16_bits == torch .to(bfloat16) (RNE)")

    print("selftest: default config (L=2 C=64 NH=4 V=50257 T=64 B=4), 10 steps")
    cfg = Config(maxT=64, V=50257, L=2, NH=4, C=64)
    t0 = time.time()
    params, x, y, logits, loss, grads, losses, norms = run_make(cfg, 4, 64, "fp32", 0, 10, hp, None)
    print(f"  (took {time.time() - t0:.2f} s) loss {float(loss):.4f} steps {losses[0]:.4f} -> {losses[-1]:.4f}")
    check(abs(float(loss) - math.log(cfg.V)) < 0.1, f"init loss {float(loss):.4f} within 0.1 of ln V")
    check(float(grads["wte"][cfg.V:].abs().max()) == 0.0, "padded wte rows have zero gradient")
    check(float(params["wte"][cfg.V:].abs().max()) == 0.0, "padded wte rows are zero at init")
    check(abs(float(logits[..., cfg.V:].abs().max())) == 0.0, "padded logits are zero at init")
    check(losses[-1] < losses[0] - 0.5, "loss falls over 10 steps")
    check(np.all(np.isfinite(losses)) and np.all(np.isfinite(norms)), "losses and norms finite")
    check(losses[0] == np.float32(float(loss)), "step_losses[0] equals the init loss")

    mpath, spath = os.path.join(tmp, "m.bin"), os.path.join(tmp, "s.bin")
    write_model(mpath, cfg, params, "fp32")
    cfg2, params2, dt = read_model(mpath)
    check(dt == "fp32" and str(cfg2) == str(cfg) and
          all(torch.equal(params[k], params2[k]) for k in params), "fp32 model file round-trips exactly")
    check(os.path.getsize(mpath) == 1024 + 4 * cfg.num_params(), "fp32 model file size")
    write_state(spath, cfg, 4, 64, hp, x.numpy(), y.numpy(), logits, float(loss), grads, losses, norms)
    st = read_state(spath)
    check(np.array_equal(st["grads"], flatten_params(cfg, grads)) and np.array_equal(st["x"], x.numpy())
          and np.array_equal(st["step_losses"], losses) and np.array_equal(st["logits"], logits.numpy()),
          "debug state round-trips")

    print("selftest: bf16 model file")
    pb, *_ = run_make(cfg, 4, 64, "bf16", 0, 0, hp, None)
    write_model(mpath, cfg, pb, "bf16")
    _, pb2, dt = read_model(mpath)
    check(dt == "bf16" and all(torch.equal(pb[k], pb2[k]) for k in pb), "bf16 model file round-trips exactly")
    check(os.path.getsize(mpath) == 1024 + 2 * cfg.num_params(), "bf16 model file size")
    check(all(torch.equal(pb[k], torch.from_numpy(round_bf16(params[k].numpy()))) for k in pb),
          "bf16 params are the RNE rounding of the fp32 init")

    print("selftest: forward vs independent float64 numpy reference (tiny config)")
    tiny = Config(maxT=16, V=300, L=2, NH=4, C=32)  # Vp = 384
    tp = init_params(tiny, 3)
    # Non-trivial LayerNorm params and biases so that every term is exercised.
    g = torch.Generator().manual_seed(7)
    for k in tp:
        if k.split(".")[-1] not in DECAY_KINDS:
            tp[k] = tp[k] + 0.1 * torch.randn(tp[k].shape, generator=g)
    tx, ty = make_batch(tiny, 2, 12, 3, None)
    lg, ls = forward(tiny, tp, tx, ty)
    rlg, rls = reference_forward_numpy(tiny, tp, tx.numpy(), ty.numpy())
    err = float(np.abs(lg.numpy() - rlg).max())
    check(err < 1e-5, f"logits max abs err {err:.2e} < 1e-5")
    check(abs(float(ls) - rls) < 1e-5, f"loss {float(ls):.6f} vs {rls:.6f}")

    print("selftest: gradient vs float64 autograd, finite differences")
    p64 = {k: t.double().requires_grad_(True) for k, t in tp.items()}
    _, l64 = forward(tiny, p64, tx, ty)
    l64.backward()
    pw = {k: t.clone().requires_grad_(True) for k, t in tp.items()}
    _, _, g32 = forward_backward(tiny, pw, tx, ty)
    gerr = max(float((g32[k].double() - p64[k].grad).abs().max()) for k in tp)
    check(gerr < 1e-5, f"fp32 grads vs fp64 grads max abs err {gerr:.2e}")
    # Finite differences on a few elements in float64.
    with torch.no_grad():
        worst = 0.0
        for name, idx in [("h0.qkvw", (5, 3)), ("h1.fcprojw", (2, 70)), ("wpe", (4, 1)), ("lnfb", (9,)),
                          ("wte", (int(ty[0, 0]), 2)), ("h1.ln1w", (0,))]:
            q = {k: t.detach().clone() for k, t in p64.items()}
            h = 1e-6
            q[name][idx] += h
            lp = float(forward(tiny, q, tx, ty)[1])
            q[name][idx] -= 2 * h
            lm = float(forward(tiny, q, tx, ty)[1])
            worst = max(worst, abs((lp - lm) / (2 * h) - float(p64[name].grad[idx])))
    check(worst < 1e-6, f"finite differences agree (max err {worst:.2e})")

    print("selftest: manual AdamW vs torch.optim.AdamW (no clipping, 5 steps)")
    pm = {k: t.clone() for k, t in tp.items()}
    pt = {k: t.clone().requires_grad_(True) for k, t in tp.items()}
    opt = ManualAdamW(pm, 1e-3, 0.9, 0.95, 1e-8, 0.1)
    topt = torch.optim.AdamW(
        [{"params": [t for k, t in pt.items() if k.split(".")[-1] in DECAY_KINDS], "weight_decay": 0.1},
         {"params": [t for k, t in pt.items() if k.split(".")[-1] not in DECAY_KINDS], "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for _ in range(5):
        w = {k: t.clone().requires_grad_(True) for k, t in pm.items()}
        _, _, gm = forward_backward(tiny, w, tx, ty)
        opt.step(gm)
        topt.zero_grad(set_to_none=True)
        forward(tiny, pt, tx, ty)[1].backward()
        topt.step()
    aerr = max(float((pm[k] - pt[k].detach()).abs().max()) for k in pm)
    check(aerr < 1e-6, f"manual AdamW vs torch AdamW max abs diff {aerr:.2e} < 1e-6")
    check(float(pm["wte"][tiny.V:].abs().max()) == 0.0, "padded wte rows stay zero under AdamW")

    print("selftest: clipping rule")
    gg = {"a": torch.tensor([3.0, 4.0])}
    clip_grads(gg, global_norm(gg), 1.0)
    check(torch.allclose(gg["a"], torch.tensor([0.6, 0.8])), "norm 5 clipped to 1")
    gg = {"a": torch.tensor([0.3, 0.4])}
    clip_grads(gg, global_norm(gg), 1.0)
    check(torch.equal(gg["a"], torch.tensor([0.3, 0.4])), "norm 0.5 left alone")

    print("selftest: token shard input")
    tpath = os.path.join(tmp, "tok.bin")
    toks = np.arange(2 * 12 + 5, dtype=np.uint16) % 300
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[0:3] = [TOKENS_MAGIC, 1, toks.size]
    with open(tpath, "wb") as f:
        f.write(hdr.tobytes())
        f.write(toks.astype("<u2").tobytes())
    sx, sy = make_batch(tiny, 2, 12, 0, tpath)
    check(np.array_equal(sx.numpy().reshape(-1), toks[:24]) and np.array_equal(sy.numpy().reshape(-1), toks[1:25]),
          "x = toks[0:BT], y = toks[1:BT+1]")
    try:
        make_batch(tiny, 4, 12, 0, tpath)
        check(False, "too-short shard rejected")
    except OracleError:
        check(True, "too-short shard rejected")

    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)
    if failures:
        print(f"selftest: {len(failures)} FAILED")
        return 1
    print("selftest: all passed")
    return 0


def add_make_flags(p):
    """The model, batch and AdamW flags of `make`, which muon_reference.py's `run` takes too."""
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--max-seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--tokens", default=None, help="llm.c token shard; default: seeded random token ids")
    p.add_argument("--threads", type=int, default=1)


def build_parser():
    ap = argparse.ArgumentParser(description="PyTorch CPU oracle for the llm.c-style GPT-2 trainers.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("make", help="random-init a model; write the model file and the debug state")
    m.add_argument("--out-model", required=True, help="llm.c model file to write")
    m.add_argument("--out-state", required=True, help="debug state file to write")
    m.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    m.add_argument("--train-dtype", choices=["fp32", "bf16"], default=None,
                   help="parameter storage modelled by the AdamW steps (default: --dtype)")
    add_make_flags(m)
    m.set_defaults(func=cmd_make)

    b = sub.add_parser("bench", help="time forward+backward+AdamW steps in eager PyTorch")
    b.add_argument("--model", required=True)
    b.add_argument("--batch", type=int, required=True)
    b.add_argument("--seq", type=int, required=True)
    b.add_argument("--steps", type=int, required=True)
    b.add_argument("--warmup", type=int, default=2)
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--lr", type=float, default=1e-4)
    b.add_argument("--weight-decay", type=float, default=0.1)
    b.set_defaults(func=cmd_bench)

    c = sub.add_parser("check-model", help="print a model file's config and parameter count")
    c.add_argument("--model", required=True)
    c.add_argument("--verbose", action="store_true", help="also print every tensor's shape, mean and std")
    c.set_defaults(func=cmd_check_model)

    s = sub.add_parser("selftest", help="assert the oracle's own invariants; exit 1 on failure")
    s.set_defaults(func=cmd_selftest)
    return ap


def main(argv=None):
    a = build_parser().parse_args(argv)
    try:
        return a.func(a)
    except OracleError as e:
        print(f"gpt2_oracle: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
