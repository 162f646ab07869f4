#!/usr/bin/python3
"""
Muon under Megatron's routing, as the peer of the C trainers' Muon (issue 43): N steps of
NVIDIA emerging-optimizers 0.3.0's own `Muon` on the hidden matrices of a GPT-2 and torch's
AdamW on the rest, one learning rate and schedule for both, from the oracle's model and batch
(dev/test/gpt2_oracle.py), written in the oracle's formats.

Usage (Debian's python3 with torch 1.13, $LLMC_PYTHON):
  muon_reference.py run --emerging DIR --out-model M0.bin --out-state S.bin --out-final M1.bin
                        [--megatron DIR --engine megatron] [oracle make flags] [--muon-* flags]
  muon_reference.py selftest --emerging DIR [--megatron DIR]
DIR of --emerging: dev/test/emerging_optimizers.sh's (emerging-optimizers + absl-py unpacked);
DIR of --megatron: dev/test/megatron_core.sh's (megatron-core 0.19.2 unpacked).

Outputs of `run`: --out-model, the initial weights (llm.c model file, fp32, as `gpt2_oracle.py
make` writes it: same seed, same init); --out-state, the oracle's debug state (docs/formats.md,
"Oracle debug state", version 3, unchanged: x, y, the initial logits, loss and gradient, then the
step losses and the step grad norms before clipping, of THIS run: Muon + AdamW; its eight
hparams are AdamW's lr, beta1, beta2, eps, weight_decay, grad_clip); --out-final, the weights
after the last step (a model file); --out-json, optionally, the settings, routing, lr per step,
losses and norms as JSON. The step loop is the oracle's (train_steps): every step the same
batch, forward + backward in fp32, global norm (fp64 sum, then fp32), the trainer's clip rule
(scale by clip/norm iff norm > clip), then the two optimizers.

Engines (the same numbers: selftest checks them bit for bit):
  emerging  (default) emerging_optimizers.orthogonalized_optimizers.Muon itself, its `orthogonalize`
            overridden only for qkvw when --muon-split-qkv 1, to split it as Megatron does (below)
            and call Muon's own scaled_orthogonalize_fn on each part.
  megatron  megatron-core 0.19.2's TensorParallelMuon (megatron/core/optimizer/emerging_optimizers.py
            :188), the class get_megatron_optimizer builds for optimizer='muon', constructed with
            the kwargs Megatron's own _muon_config_to_kwargs (:463) derives from an OptimizerConfig
            holding the --muon-* values; qkvw is handed to it in Megatron's interleaved row order
            (below) with Megatron's is_qkv / qkv_split_shapes tags, and its grad permuted likewise.

THE FORMULAS (emerging-optimizers 0.3.0 = EO, megatron-core 0.19.2 = MC; paths in the wheels)
Per Muon matrix W (out x in, as torch stores it) with gradient G (after clipping), at a step
with learning rate lr and weight decay wd, momentum m, buffer M (zeros at the first step):
 1. Weight decay, decoupled, first: W <- W + (-wd*lr) * W                (EO mixin.py:48, called
    at orthogonalized_optimizer.py:176; Megatron's weight_decay_method "decoupled": MC
    TensorParallelMuon's use_decoupled_weight_decay=True, which OptimizerConfig never overrides).
    -wd*lr is a Python double, applied as a float32 scalar.
 2. Momentum: M <- M.lerp_(G, 1 - m)                                       (orthogonalized_optimizer.py:184)
    torch's lerp(a, b, w): a + w*(b - a) for |w| < 0.5, else b - (b - a)*(1 - w); torch 1.13's
    CPU kernel fuses them: fmaf(w, b - a, a), and fmaf(-(b - a), 1 - w, b) (w as float32:
    1 - 0.95 -> 0.05f). m = 0.95: M <- fmaf(0.05f, G - M, M).
 3. Nesterov (off by default): U = G.lerp(M, m), i.e. fmaf(-(M - G), 1 - m, M) for m >= 0.5;
    off: U = M                                                              (:187-190)
 4. Orthogonalize (:192-194, EO muon.py:107-119, muon_utils.py:127-225), in
    torch.set_float32_matmul_precision(fp32_matmul_prec) (EO utils/__init__.py:30):
    a. transpose when rows > cols: X = U^T (X is then r x c with r <= c)   (muon_utils.py:177-180)
    b. Frobenius normalisation: X = X / max(||X||_F, 1e-7)                 (:186, F.normalize over
       dims (-2, -1), eps=1e-7; in fp32)
    c. precision: only when the matmul precision is "medium" (MC's default muon_fp32_matmul_prec,
       OptimizerConfig:272; EO Muon's default too) X is cast to bf16 and every product below is
       a bf16 GEMM (bf16 inputs and output, fp32 accumulation: torch 1.13's CPU addmm rounds
       once, as cuBLAS does); "high"/"highest": all fp32                    (:203-213)
    d. N Newton-Schulz steps (N = num_ns_steps, 5), coefficient sets cycled ("simple", "quintic")
       (:197-199, get_coefficient_iterator :81-117, mode "cycle"):
           A = X X^T;  B = b*A + c*(A A);  X = a*X + B X
       as A = X @ X.mT; B = addmm(A, A, A, beta=b, alpha=c); X = addmm(X, B, X, beta=a, alpha=1)
       (:293-320). The sets, (a, b, c), muon_utils.py:30-44:
         quintic: (4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                  (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)   (step k uses set k mod 5)
         simple:  (3.4445, -4.7750, 2.0315) every step
    e. back to fp32, transposed back when (a) transposed                    (:220-224)
    f. scale: O = (X * s) * extra, s from the shape (rows, cols) of the matrix orthogonalized
       (each third for a split qkvw), EO muon.py:136-162:
         spectral:      s = sqrt(max(rows, cols))        (the default, MC muon_scale_mode)
         shape_scaling: s = sqrt(max(1, rows/cols))
         unit_rms_norm: s = sqrt(rows/cols)
       extra = muon_extra_scale_factor (1.0): a second float32 multiply (muon.py:119).
 5. Update: W <- W + (-lr) * O                                              (orthogonalized_optimizer.py:198)
QKV split (MC muon_split_qkv=True, OptimizerConfig:263; TensorParallelMuon.orthogonalize
emerging_optimizers.py:322-352): Megatron's fused linear_qkv.weight rows are interleaved by
query group, [g0: q heads (NH/NG x hn rows), k (hn), v (hn); g1: ...]; it views the momentum as
(NG, (NH/NG + 2) hn, C), splits dim 1 into qkv_split_shapes = [NH/NG hn, hn, hn]
(_get_qkv_split_shapes :161-173), reshapes each part to (-1, C) and orthogonalizes (and scales)
each alone, then concatenates back. Tagged only for params named *linear_qkv.weight (MC
optimizer/__init__.py:786-790). For GPT-2 (MHA: NG = NH, hn = C/NH) the parts are every head's q
rows in head order, every head's k rows, every head's v rows: in GPT-2's qkvw layout [Q; K; V]
that is THIRDS BY ROWS, Q = rows [0, C), K = [C, 2C), V = [2C, 3C), each C x C (not transposed),
spectral scale sqrt(C) each (not sqrt(3C)). Both engines compute exactly that (selftest).
Learning rate: Megatron's OptimizerParamScheduler gives every param group, Muon's and Adam's,
the same lr = get_lr(group) from max_lr = config.lr, min_lr = config.min_lr
(optimizer_param_scheduler.py:297-300); no lr x scale adjustment of Muon's lr exists in MC 0.19.2
besides the spectral scale above (MuP, off by default, and decoupled_lr, embeddings only, are
the only lr overrides: optimizer/__init__.py). Here the trainer's schedule (llmc/schedule.h:
warmup, cosine to lr x final_fraction) in float32 gives both optimizers each step's lr.
Routing (MC default, optimizer='muon', muon_scalar_optimizer='adam', OptimizerConfig:288): a
param goes to Adam iff getattr(p, 'is_embedding_or_output_parameter', False) or p.ndim != 2
(_is_nonlinear_or_embedding, emerging_optimizers.py:156-158; the same test as
layer_wise_optimizer.py:38-53's is_managed_by_layer_wise_optimizer). Only the word embedding
and the output layer are tagged (models/common/language_module/language_module.py:224, :230):
Megatron's learned position embedding (language_model_embedding.py:67, a plain torch.nn.Embedding)
is 2-D and untagged, so MC routes wpe to MUON. --wpe muon (the default, the code) or adamw (the
issue's wording). Muon: qkvw, attprojw, fcw, fcprojw of every layer (+ wpe by default); AdamW
(torch.optim.AdamW, as Megatron's USING_PYTORCH_OPTIMIZER path, optimizer/__init__.py:557):
wte (tied classifier), biases, LayerNorms (+ wpe with --wpe adamw), weight decay on wte and wpe
only (Megatron: wd_mult 0 for 1-D and *.bias, optimizer/__init__.py:112-118).
"""

import argparse
import importlib
import json
import os
import sys
import time
import types
import typing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_oracle as oracle  # noqa: E402  (model, batch, files, norm and clip: the oracle's own)
from gpt2_oracle import OracleError  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

EMERGING_VERSION = "0.3.0"

# The shims that make emerging-optimizers 0.3.0 (a Python >= 3.12, recent-torch wheel) import
# and run under Debian's python3 3.11 and torch 1.13. None changes a number Muon computes.
SHIMS = [
    ("typing.override = identity decorator",
     "Python 3.12's typing.override (PEP 698), a no-op marker; OrthogonalizedOptimizer.step is "
     "decorated with it (orthogonalized_optimizer.py:15, :156)"),
    ("torch.optim.optimizer.ParamsT = Union[Iterable[Tensor], Iterable[dict]]",
     "a type alias of torch >= 2.2, only used in annotations (muon.py:20, registry.py:21 and others)"),
    ("emerging_optimizers.triton_kernels = a module with HAS_TRITON_340 = False and no kernels",
     "its syrk.py imports triton unconditionally (not installed here); Muon uses the Triton SYRK "
     "kernel only with use_syrk=True (muon.py:93-105, muon_utils.py:209-212), which Megatron "
     "never passes: TensorParallelMuon calls newton_schulz without it"),
]
SHIMS_MEGATRON = [
    ("torch.compile = a decorator whose functions raise when called (engine megatron only)",
     "torch 1.13 has no torch.compile; MC's emerging_optimizers.py imports EO's Lion and SOAP for "
     "its registry, whose update functions are @torch.compile'd at import; Muon never calls them"),
    ("megatron-core loaded as dev/test/megatron_layout.py loads it",
     "its placeholders and package stubs (megatron_layout.SHIMS), none on Muon's path"),
]
COMPILE_PLACEHOLDERS_USED = []


def load_emerging(site):
    """Imports emerging_optimizers from DIR/site with SHIMS; returns the package's modules."""
    import torch.optim.optimizer as torch_optimizer
    if not hasattr(typing, "override"):
        typing.override = lambda f: f
    if not hasattr(torch_optimizer, "ParamsT"):
        torch_optimizer.ParamsT = typing.Union[typing.Iterable[torch.Tensor], typing.Iterable[dict]]
    kernels = types.ModuleType("emerging_optimizers.triton_kernels")
    kernels.HAS_TRITON_340 = False
    kernels.__all__ = ["HAS_TRITON_340"]
    sys.modules["emerging_optimizers.triton_kernels"] = kernels
    if not os.path.isfile(os.path.join(site, "emerging_optimizers", "orthogonalized_optimizers", "muon.py")):
        raise OracleError(f"{site}: no emerging_optimizers here (dev/test/emerging_optimizers.sh makes it)")
    sys.path.insert(0, site)
    import emerging_optimizers
    if emerging_optimizers.__version__ != EMERGING_VERSION:
        raise OracleError(f"{site}: emerging-optimizers {emerging_optimizers.__version__}, want {EMERGING_VERSION}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    eo = types.SimpleNamespace(version=emerging_optimizers.__version__)
    eo.muon = importlib.import_module("emerging_optimizers.orthogonalized_optimizers.muon")
    eo.muon_utils = importlib.import_module("emerging_optimizers.orthogonalized_optimizers.muon_utils")
    eo.Muon = eo.muon.Muon
    return eo


def load_megatron_muon(megatron_dir):
    """megatron-core's TensorParallelMuon and its config helpers (after load_emerging)."""
    def compile_placeholder(fn=None, **kwargs):
        def wrap(f):
            def used(*a, **k):
                COMPILE_PLACEHOLDERS_USED.append(getattr(f, "__name__", "?"))
                raise RuntimeError("torch.compile placeholder %s was called" % getattr(f, "__name__", "?"))
            return used
        return wrap(fn) if fn is not None else wrap
    if not hasattr(torch, "compile"):
        torch.compile = compile_placeholder
    import megatron_layout
    mc = megatron_layout.load_megatron(os.path.join(megatron_dir, "site"))
    mc.layout_module = megatron_layout
    mc.eo = importlib.import_module("megatron.core.optimizer.emerging_optimizers")
    if not mc.eo.HAVE_EMERGING_OPTIMIZERS:
        raise OracleError("megatron-core's emerging_optimizers.py could not import emerging_optimizers")
    mc.OptimizerConfig = importlib.import_module("megatron.core.optimizer.optimizer_config").OptimizerConfig
    mc.layer_wise = importlib.import_module("megatron.core.optimizer.layer_wise_optimizer")
    return mc


# ---------------------------------------------------------------- settings and routing

MUON_KINDS = ("qkvw", "attprojw", "fcw", "fcprojw")


class MuonSettings:
    """The issue's flags, with Megatron 0.19.2's OptimizerConfig defaults."""

    def __init__(self, momentum=0.95, nesterov=False, ns_steps=5, coefficients="quintic", scale="spectral",
                 extra_scale=1.0, split_qkv=True, matmul_prec="medium", wpe="muon"):
        self.momentum, self.nesterov, self.ns_steps = float(momentum), bool(nesterov), int(ns_steps)
        self.coefficients, self.scale, self.extra_scale = coefficients, scale, float(extra_scale)
        self.split_qkv, self.matmul_prec, self.wpe = bool(split_qkv), matmul_prec, wpe

    def as_dict(self):
        return dict(vars(self))


def settings_from_args(a):
    return MuonSettings(a.muon_momentum, a.muon_nesterov, a.muon_ns_steps, a.muon_coefficients, a.muon_scale,
                        a.muon_extra_scale, a.muon_split_qkv, a.muon_fp32_matmul_prec, a.wpe)


def route(cfg, settings):
    """-> (Muon names, AdamW names), canonical order."""
    muon, adam = [], []
    for name, kind, _ in cfg.canonical_order():
        if kind in MUON_KINDS or (kind == "wpe" and settings.wpe == "muon"):
            muon.append(name)
        else:
            adam.append(name)
    return muon, adam


def lr_at_step(lr, warmup, final_fraction, step, total):
    """llmc/schedule.h's lr_at_step in float32 (cosf as numpy's float32 cos: within an ulp)."""
    f = np.float32
    if step < warmup:
        return f(lr) * f(step + 1) / f(warmup)
    if total <= warmup:
        return f(lr)
    progress = min(f(step - warmup) / f(total - warmup), f(1.0))
    cosine = f(0.5) * (f(1.0) + np.cos(f(3.14159265358979) * progress, dtype=np.float32))
    min_lr = f(lr) * f(final_fraction)
    return f(min_lr + (f(lr) - min_lr) * cosine)


# ---------------------------------------------------------------- qkvw in Megatron's row order

def qkv_megatron_rows(C, NH):
    """Index i of Megatron's interleaved linear_qkv row i in GPT-2's [Q; K; V] rows (MHA: one
    query group per head, group g = [q_g (hs rows), k_g, v_g])."""
    hs = C // NH
    idx = torch.empty(3 * C, dtype=torch.long)
    for g in range(NH):
        for t in range(3):
            for i in range(hs):
                idx[g * 3 * hs + t * hs + i] = t * C + g * hs + i
    return idx


# ---------------------------------------------------------------- the optimizers

def make_muon_class(eo):
    class GPT2Muon(eo.Muon):
        """EO's Muon; with split_qkv, qkvw (tagged gpt2_qkv) is orthogonalized in thirds by rows
        (Megatron's split, in GPT-2's row order), each by Muon's own scaled_orthogonalize_fn."""

        def __init__(self, params, split_qkv, **kwargs):
            super().__init__(params, **kwargs)
            self.split_qkv = split_qkv

        def orthogonalize(self, p, grad, **kwargs):
            if self.split_qkv and getattr(p, "gpt2_qkv", False):
                C = grad.shape[1]
                return torch.cat([self.scaled_orthogonalize_fn(part) for part in torch.split(grad, C, dim=0)])
            return super().orthogonalize(p, grad, **kwargs)
    return GPT2Muon


class Reference:
    """Muon on the routed matrices and torch's AdamW on the rest, stepping `master` in place."""

    def __init__(self, cfg, master, settings, hp, eo, engine="emerging", mc=None):
        self.cfg, self.master, self.settings, self.hp = cfg, master, settings, hp
        self.muon_names, self.adam_names = route(cfg, settings)
        self.engine = engine
        self.qkv_idx = qkv_megatron_rows(cfg.C, cfg.NH)
        self.qkv_inv = torch.argsort(self.qkv_idx)
        s = settings
        if engine == "emerging":
            self.muon_params = {n: master[n] for n in self.muon_names}
            for n, p in self.muon_params.items():
                p.gpt2_qkv = n.endswith(".qkvw")
            self.muon = make_muon_class(eo)(
                list(self.muon_params.values()), s.split_qkv, lr=hp["lr"], momentum=s.momentum,
                weight_decay=hp["weight_decay"], nesterov=s.nesterov, weight_decay_method="decoupled",
                fp32_matmul_prec=s.matmul_prec, coefficient_type=s.coefficients, num_ns_steps=s.ns_steps,
                scale_mode=s.scale, extra_scale_factor=s.extra_scale, use_syrk=False)
        elif engine == "megatron":
            if mc is None:
                raise OracleError("--engine megatron needs --megatron DIR")
            self.muon_params = {}
            for n in self.muon_names:
                if n.endswith(".qkvw"):
                    p = master[n][self.qkv_idx].clone()   # Megatron's interleaved linear_qkv.weight
                    p.is_qkv = True
                    p.qkv_split_shapes = mc.eo._get_qkv_split_shapes(self.model_config())
                else:
                    p = master[n]
                self.muon_params[n] = p
            self.muon = mc.eo.TensorParallelMuon(list(self.muon_params.values()),
                                                 **megatron_muon_kwargs(mc, cfg, settings, hp))
        elif engine == "formulas":  # not a peer: the header's formulas in plain torch (selftest's tolerances)
            self.muon_params = {n: master[n] for n in self.muon_names}
            for n, p in self.muon_params.items():
                p.gpt2_qkv = n.endswith(".qkvw")
            self.momenta = {n: torch.zeros_like(p) for n, p in self.muon_params.items()}
            self.muon = types.SimpleNamespace(param_groups=[{}], step=self.formulas_step)
        else:
            raise OracleError(f"unknown engine {engine}")
        decay = [master[n] for n in self.adam_names if n.split(".")[-1] in oracle.DECAY_KINDS]
        no_decay = [master[n] for n in self.adam_names if n.split(".")[-1] not in oracle.DECAY_KINDS]
        self.adamw = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                                        {"params": no_decay, "weight_decay": 0.0}],
                                       lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"], foreach=False)

    def formulas_step(self):
        lr = self.muon.param_groups[0]["lr"]
        for n, p in self.muon_params.items():
            documented_muon_step(p, p.grad, self.momenta[n], lr, self.hp["weight_decay"], self.settings)

    def model_config(self):
        """What Megatron reads from model_chunks[0].config for the split (MHA)."""
        return types.SimpleNamespace(num_attention_heads=self.cfg.NH, num_query_groups=self.cfg.NH,
                                     kv_channels=self.cfg.C // self.cfg.NH)

    @torch.no_grad()
    def step(self, grads, lr):
        for n, p in self.muon_params.items():
            g = grads[n]
            if p is not self.master[n]:
                g = g[self.qkv_idx]
            p.grad = g.clone()
        for n in self.adam_names:
            self.master[n].grad = grads[n].clone()
        for opt in (self.muon, self.adamw):
            for group in opt.param_groups:
                group["lr"] = float(lr)
        self.muon.step()
        self.adamw.step()
        for n, p in self.muon_params.items():
            if p is not self.master[n]:
                self.master[n].copy_(p[self.qkv_inv])
            p.grad = None
        for n in self.adam_names:
            self.master[n].grad = None


def megatron_optimizer_config(mc, settings, hp):
    s = settings
    return mc.OptimizerConfig(optimizer="muon", lr=hp["lr"], weight_decay=hp["weight_decay"],
                              muon_momentum=s.momentum, muon_nesterov=s.nesterov, muon_num_ns_steps=s.ns_steps,
                              muon_coefficient_type=s.coefficients, muon_scale_mode=s.scale,
                              muon_extra_scale_factor=s.extra_scale, muon_split_qkv=s.split_qkv,
                              muon_fp32_matmul_prec=s.matmul_prec)


def megatron_muon_kwargs(mc, cfg, settings, hp):
    chunk = types.SimpleNamespace(config=types.SimpleNamespace(
        num_attention_heads=cfg.NH, num_query_groups=cfg.NH, kv_channels=cfg.C // cfg.NH))
    return mc.eo._muon_config_to_kwargs(megatron_optimizer_config(mc, settings, hp), [chunk], None)


def train(cfg, params, x, y, steps, hp, settings, schedule, eo, engine="emerging", mc=None):
    """The oracle's train_steps with Reference in place of its AdamW.
    -> (first logits, first loss, first grads, losses, norms, lrs, final params)."""
    master = {k: t.clone() for k, t in params.items()}
    ref = Reference(cfg, master, settings, hp, eo, engine, mc)
    losses, norms, lrs = [], [], []
    first = None
    for step in range(steps if steps > 0 else 1):
        work = {k: t.detach().clone().requires_grad_(True) for k, t in master.items()}
        logits, loss, grads = oracle.forward_backward(cfg, work, x, y)
        norm = oracle.global_norm(grads)
        if first is None:
            first = (logits, loss, {k: g.clone() for k, g in grads.items()})
        if steps == 0:
            break
        losses.append(np.float32(loss.item()))
        norms.append(norm)
        oracle.clip_grads(grads, norm, hp["grad_clip"])
        lr = lr_at_step(hp["lr"], schedule["warmup"], schedule["final_fraction"], step, steps)
        lrs.append(lr)
        ref.step(grads, lr)
    return (first[0], first[1], first[2], np.array(losses, np.float32), np.array(norms, np.float32),
            np.array(lrs, np.float32), master)


# ---------------------------------------------------------------- run

def cmd_run(a):
    torch.set_num_threads(a.threads)
    t0 = time.time()
    eo = load_emerging(os.path.join(a.emerging, "site"))
    mc = load_megatron_muon(a.megatron) if a.engine == "megatron" else None
    settings = settings_from_args(a)
    hp = oracle.hparams_from_args(a)
    schedule = {"warmup": a.warmup, "final_fraction": a.final_fraction}
    if a.model:
        cfg, params, dtype = oracle.read_model(a.model)
        if dtype != "fp32":
            raise OracleError(f"{a.model}: {dtype}; the Muon reference takes fp32 models")
    else:
        cfg = oracle.Config(maxT=a.max_seq, V=a.vocab, L=a.layers, NH=a.heads, C=a.channels)
        params = oracle.init_params(cfg, a.seed)
    x, y = oracle.make_batch(cfg, a.batch, a.seq, a.seed, a.tokens)
    logits, loss, grads, losses, norms, lrs, final = train(cfg, params, x, y, a.steps, hp, settings, schedule,
                                                           eo, a.engine, mc)
    if a.out_model:
        oracle.write_model(a.out_model, cfg, params, "fp32")
    if a.out_state:
        oracle.write_state(a.out_state, cfg, a.batch, a.seq, hp, x.numpy(), y.numpy(), logits, float(loss), grads,
                           losses, norms)
    if a.out_final:
        oracle.write_model(a.out_final, cfg, final, "fp32")
    muon_names, adam_names = route(cfg, settings)
    if a.out_json:
        with open(a.out_json, "w") as f:
            json.dump({"emerging_optimizers": eo.version, "engine": a.engine, "muon": settings.as_dict(),
                       "adamw": hp, "schedule": schedule, "config": str(cfg), "B": a.batch, "T": a.seq,
                       "seed": a.seed, "muon_params": muon_names, "adamw_params": adam_names,
                       "lr": [float(v) for v in lrs], "loss": [float(v) for v in losses],
                       "norm": [float(v) for v in norms]}, f, indent=1)
    print(f"muon_reference: emerging-optimizers {eo.version} (engine {a.engine}), {cfg} B={a.batch} T={a.seq} "
          f"seed={a.seed}")
    print(f"muon_reference: Muon {settings.as_dict()}")
    print(f"muon_reference: Muon on {len(muon_names)} matrices "
          f"({', '.join(sorted(set(n.split('.')[-1] for n in muon_names)))}), AdamW on {len(adam_names)} tensors")
    for k in range(len(losses)):
        print(f"step {k + 1:4d}/{len(losses)} | loss {losses[k]:.6f} | norm {norms[k]:.4f} | lr {lrs[k]:.2e}")
    print(f"muon_reference: wrote {' '.join(p for p in (a.out_model, a.out_state, a.out_final, a.out_json) if p)} "
          f"in {time.time() - t0:.2f} s")
    return 0


# ---------------------------------------------------------------- selftest

def documented_newton_schulz(G, steps, coefficients, matmul_prec):
    """The header's step 4a-4e written out (an independent reading of the formulas)."""
    sets = {"quintic": [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                        (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)],
            "simple": [(3.4445, -4.7750, 2.0315)]}[coefficients]
    X = G.T if G.shape[0] > G.shape[1] else G
    X = X / max(float(X.double().norm()), 1e-7)
    bf16 = matmul_prec == "medium"
    rnd = (lambda t: t.bfloat16().float()) if bf16 else (lambda t: t)
    X = rnd(X)
    for k in range(steps):
        a, b, c = sets[k % len(sets)]
        A = rnd(X @ X.T)
        B = rnd(b * A + c * (A @ A))
        X = rnd(a * X + B @ X)
    return X.T if G.shape[0] > G.shape[1] else X


def documented_muon_step(W, G, M, lr, wd, s):
    """One Muon step on W (in place), the header's steps 1-5."""
    W.add_(W, alpha=-wd * lr)
    M.copy_(torch.lerp(M, G, 1 - s.momentum))
    U = torch.lerp(G, M, s.momentum) if s.nesterov else M
    parts = torch.split(U, U.shape[1]) if (s.split_qkv and getattr(W, "gpt2_qkv", False)) else [U]
    out = []
    for P in parts:
        r, c = P.shape
        scale = {"spectral": max(r, c) ** 0.5, "shape_scaling": max(1, r / c) ** 0.5,
                 "unit_rms_norm": (r / c) ** 0.5}[s.scale]
        out.append(documented_newton_schulz(P, s.ns_steps, s.coefficients, s.matmul_prec) * scale * s.extra_scale)
    W.add_(torch.cat(out), alpha=-lr)


def cmd_selftest(a):
    torch.set_num_threads(1)
    failures = []

    def check(cond, what):
        print(f"  [{'ok' if cond else 'FAIL'}] {what}")
        if not cond:
            failures.append(what)

    eo = load_emerging(os.path.join(a.emerging, "site"))
    print(f"selftest: emerging-optimizers {eo.version} from {a.emerging}, torch {torch.__version__}, "
          f"Python {sys.version.split()[0]}")
    print("shims:")
    for what, why in SHIMS:
        print(f"  {what}: {why}")
    hp = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0}
    tiny = oracle.Config(maxT=16, V=300, L=2, NH=4, C=64)   # Vp = 384; hs = 16
    params = oracle.init_params(tiny, 3)
    x, y = oracle.make_batch(tiny, 2, 16, 3, None)
    flat = {"warmup": 0, "final_fraction": 1.0}

    print("selftest: EO's Muon against the header's formulas (one matrix, 3 steps)")
    for prec, tol in (("highest", 1e-5), ("medium", 5e-2)):
        for shape, split in (((192, 64), True), ((256, 64), False), ((64, 256), False), ((64, 64), False)):
            for coef, nesterov in (("quintic", False), ("simple", True)):
                s = MuonSettings(nesterov=nesterov, coefficients=coef, split_qkv=split, matmul_prec=prec)
                g = torch.Generator().manual_seed(shape[0] + shape[1])
                W0 = torch.randn(shape, generator=g) * 0.02
                Wm, Wd, Md = W0.clone(), W0.clone(), torch.zeros(shape)
                Wm.gpt2_qkv = Wd.gpt2_qkv = split
                opt = make_muon_class(eo)([Wm], split, lr=hp["lr"], momentum=s.momentum, weight_decay=0.1,
                                          nesterov=s.nesterov, fp32_matmul_prec=prec, coefficient_type=coef,
                                          num_ns_steps=5, scale_mode="spectral", extra_scale_factor=1.0)
                err = 0.0
                for _ in range(3):
                    G = torch.randn(shape, generator=g)
                    Wm.grad = G.clone()
                    opt.step()
                    documented_muon_step(Wd, G, Md, hp["lr"], 0.1, s)
                    err = max(err, float((Wm - Wd).abs().max() / (Wd - W0).abs().max()))
                check(err < tol, f"{prec:7s} {str(shape):9s} {'qkv thirds' if split else 'whole':10s} {coef:7s} "
                                 f"nesterov={int(nesterov)}: max |diff| / max |update| {err:.1e} < {tol:.0e}")

    print("selftest: scale modes and extra scale (EO's get_muon_scale_factor)")
    f = eo.muon.get_muon_scale_factor
    check(f(192, 64, "spectral") == 192 ** 0.5 and f(64, 256, "spectral") == 16.0, "spectral = sqrt(max(r, c))")
    check(f(256, 64, "shape_scaling") == 2.0 and f(64, 256, "shape_scaling") == 1.0, "shape_scaling = sqrt(max(1, r/c))")
    check(f(256, 64, "unit_rms_norm") == 2.0 and f(64, 256, "unit_rms_norm") == 0.5, "unit_rms_norm = sqrt(r/c)")
    check(list(eo.muon_utils.get_coefficient_iterator(7, eo.muon_utils._COEFFICIENT_SETS["quintic"]))[5:] ==
          eo.muon_utils._COEFFICIENT_SETS["quintic"][:2], "quintic sets cycle: steps 6, 7 use sets 1, 2")

    print("selftest: the reference trains (tiny GPT-2, 6 steps, engine emerging)")
    _, loss0, _, losses, norms, lrs, final = train(tiny, params, x, y, 6, hp, MuonSettings(), flat, eo)
    check(losses[-1] < losses[0] - 0.3, f"loss falls: {losses[0]:.4f} -> {losses[-1]:.4f}")
    check(all(np.isfinite(losses)) and all(np.isfinite(norms)), "losses and norms finite")
    check(float(final["wte"][tiny.V:].abs().max()) == 0.0, "padded wte rows stay zero (AdamW, zero grads)")
    muon_names, _ = route(tiny, MuonSettings())
    moved = {n: float((final[n] - params[n]).abs().max()) for n in params}
    check(all(moved[n] > 0 for n in muon_names), "every Muon matrix moved")

    print("selftest: how far the formulas with other sums land (tiny GPT-2, lr 1e-2, 10 steps): Muon matrices")
    print("  relative to their update, losses absolute (AdamW's tensors: qkvb's K third has a zero gradient")
    print("  up to rounding, which AdamW turns into full steps; its tolerance is the AdamW oracle tests')")
    for prec, tol_w, tol_l in (("highest", 1e-4, 1e-5), ("medium", 0.3, 3e-2)):
        s = MuonSettings(matmul_prec=prec)
        ref = train(tiny, params, x, y, 10, hp, s, flat, eo, "emerging")
        doc = train(tiny, params, x, y, 10, hp, s, flat, eo, "formulas")
        dw = max(float((ref[6][n] - doc[6][n]).abs().max() / (ref[6][n] - params[n]).abs().max()) for n in muon_names)
        dl = float(np.abs(ref[3] - doc[3]).max())
        check(dw < tol_w and dl < tol_l, f"{prec:7s}: Muon matrices max |diff| / max |update| {dw:.1e} (< {tol_w:.0e}), "
                                         f"losses max |diff| {dl:.1e} (< {tol_l:.0e})")
    ref_bf16 = train(tiny, params, x, y, 10, hp, MuonSettings(), flat, eo, "emerging")
    ref_fp32 = train(tiny, params, x, y, 10, hp, MuonSettings(matmul_prec="highest"), flat, eo, "emerging")
    print(f"  (bf16 against fp32 Newton-Schulz, both EO: weights max |diff| "
          f"{max(float((ref_bf16[6][n] - ref_fp32[6][n]).abs().max()) for n in params):.1e}, losses max |diff| "
          f"{float(np.abs(ref_bf16[3] - ref_fp32[3]).max()):.1e})")

    if not a.megatron:
        print("selftest: no --megatron DIR: Megatron's own Muon, config and routing not compared (SKIPPED)")
    else:
        selftest_megatron(a, eo, tiny, params, x, y, hp, flat, check)
    if COMPILE_PLACEHOLDERS_USED:
        check(False, f"torch.compile placeholders were called: {COMPILE_PLACEHOLDERS_USED}")
    if failures:
        print(f"selftest: {len(failures)} FAILED")
        return 1
    print("selftest: all passed")
    return 0


def selftest_megatron(a, eo, tiny, params, x, y, hp, flat, check):
    mc = load_megatron_muon(a.megatron)
    print(f"selftest: megatron-core {mc.version} from {a.megatron}")
    for what, why in SHIMS_MEGATRON:
        print(f"  shim: {what}: {why}")
    print("selftest: OptimizerConfig's muon_* defaults are the reference's")
    config = mc.OptimizerConfig()
    defaults = {k: getattr(config, k) for k in sorted(vars(config)) if k.startswith("muon_")}
    print("  " + ", ".join(f"{k}={v!r}" for k, v in defaults.items()))
    want = {"muon_momentum": 0.95, "muon_nesterov": False, "muon_num_ns_steps": 5, "muon_coefficient_type": "quintic",
            "muon_scale_mode": "spectral", "muon_extra_scale_factor": 1.0, "muon_split_qkv": True,
            "muon_fp32_matmul_prec": "medium", "muon_scalar_optimizer": "adam", "muon_tp_mode": "blockwise"}
    check(all(defaults.get(k) == v for k, v in want.items()), "defaults == MuonSettings() and Adam for the rest")
    kwargs = megatron_muon_kwargs(mc, tiny, MuonSettings(), hp)
    shown = {k: v for k, v in kwargs.items() if k not in ("is_qkv_fn", "pg_collection")}
    print("  TensorParallelMuon kwargs (Megatron's _muon_config_to_kwargs): " +
          ", ".join(f"{k}={v!r}" for k, v in shown.items()))
    probe = mc.eo.TensorParallelMuon([torch.nn.Parameter(torch.zeros(4, 4))], **kwargs)
    check(probe.weight_decay_method == "decoupled" and probe.nesterov is False and probe.fp32_matmul_prec == "medium"
          and kwargs["qkv_split_shapes"] == [16, 16, 16] and kwargs["tp_mode"] == "blockwise",
          "decoupled weight decay (use_decoupled_weight_decay: the constructor's default True, no config field), "
          "no Nesterov, bf16 Newton-Schulz, qkv split [hs, hs, hs], blockwise (no TP)")

    print("selftest: Megatron's routing predicates on GPT-2's parameters, tagged as Megatron's GPTModel tags them")
    muon_by_megatron, lw_by_megatron = [], []
    for name, kind, _ in tiny.canonical_order():
        p = torch.nn.Parameter(torch.empty(tiny.shape(kind)))
        if kind == "wte":  # word_embeddings.weight, the tied output: language_module.py:224
            p.is_embedding_or_output_parameter = True
        if not mc.eo._is_nonlinear_or_embedding(p):
            muon_by_megatron.append(name)
        if mc.layer_wise.is_managed_by_layer_wise_optimizer(p):
            lw_by_megatron.append(name)
    muon_names, _ = route(tiny, MuonSettings())
    check(muon_by_megatron == muon_names == lw_by_megatron,
          f"Muon and the layer-wise buffer: {', '.join(sorted(set(n.split('.')[-1] for n in muon_names)))}"
          " (wpe: untagged 2-D, so Muon)")

    print("selftest: the engines agree bit for bit: EO's Muon (+ the GPT-2 thirds split) vs Megatron's "
          "TensorParallelMuon (interleaved qkv, its own split), 3 steps")
    # Without the split, qkvw is orthogonalized whole, in each engine's row order: the same
    # matrix up to a row permutation, so equal up to the order of Newton-Schulz's sums (fp32).
    for s, tol in ((MuonSettings(), 0), (MuonSettings(matmul_prec="highest"), 0),
                   (MuonSettings(nesterov=True, coefficients="simple", scale="shape_scaling", extra_scale=0.2), 0),
                   (MuonSettings(wpe="adamw", scale="unit_rms_norm", ns_steps=7), 0),
                   (MuonSettings(split_qkv=False, matmul_prec="highest"), 1e-4)):
        runs = [train(tiny, params, x, y, 3, hp, s, flat, eo, engine, mc) for engine in ("emerging", "megatron")]
        diff = max(float((runs[0][6][n] - runs[1][6][n]).abs().max()) for n in params)
        if tol == 0:
            same = all(torch.equal(runs[0][6][n], runs[1][6][n]) for n in params) and np.array_equal(runs[0][3], runs[1][3])
            check(same, f"{s.as_dict()}: bitwise (max |diff| {diff:.1e})")
        else:
            check(diff < tol, f"{s.as_dict()}: max |diff| {diff:.1e} < {tol:.0e} (qkvw whole, rows permuted)")
    check(not mc.layout_module.PLACEHOLDERS_USED, "no megatron-core placeholder used")


# ---------------------------------------------------------------- command line

def add_muon_flags(p):
    p.add_argument("--muon-momentum", type=float, default=0.95)
    p.add_argument("--muon-nesterov", type=int, choices=[0, 1], default=0)
    p.add_argument("--muon-ns-steps", type=int, default=5)
    p.add_argument("--muon-coefficients", choices=["simple", "quintic"], default="quintic")
    p.add_argument("--muon-scale", choices=["spectral", "shape_scaling", "unit_rms_norm"], default="spectral")
    p.add_argument("--muon-extra-scale", type=float, default=1.0)
    p.add_argument("--muon-split-qkv", type=int, choices=[0, 1], default=1)
    p.add_argument("--muon-fp32-matmul-prec", choices=["medium", "high", "highest"], default="medium",
                   help="Megatron's muon_fp32_matmul_prec: medium = Newton-Schulz in bf16 (the default)")
    p.add_argument("--wpe", choices=["muon", "adamw"], default="muon",
                   help="wpe's optimizer: muon (Megatron 0.19.2's routing, the default) or adamw")


def build_parser():
    ap = argparse.ArgumentParser(description="emerging-optimizers' Muon (+ AdamW) on a GPT-2: the Muon peer.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="N steps of Muon + AdamW; write the initial model, the state, the final model")
    r.add_argument("--emerging", required=True, help="a directory of dev/test/emerging_optimizers.sh")
    r.add_argument("--megatron", default=None, help="a directory of dev/test/megatron_core.sh (engine megatron)")
    r.add_argument("--engine", choices=["emerging", "megatron"], default="emerging")
    r.add_argument("--model", default=None, help="start from this fp32 model file instead of a random init")
    r.add_argument("--out-model", default=None)
    r.add_argument("--out-state", default=None)
    r.add_argument("--out-final", default=None)
    r.add_argument("--out-json", default=None)
    oracle.add_make_flags(r)  # the model, batch and AdamW: the oracle's own defaults
    r.add_argument("--warmup", type=int, default=0)
    r.add_argument("--final-fraction", type=float, default=1.0)
    add_muon_flags(r)
    r.set_defaults(func=cmd_run)
    s = sub.add_parser("selftest", help="the formulas, the engines and Megatron's defaults and routing")
    s.add_argument("--emerging", required=True)
    s.add_argument("--megatron", default=None)
    s.set_defaults(func=cmd_selftest)
    return ap


def main(argv=None):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    a = build_parser().parse_args(argv)
    try:
        return a.func(a)
    except OracleError as e:
        print(f"muon_reference: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
