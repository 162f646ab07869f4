#!/usr/bin/python3
"""An independent reference for hf_convert (tools/hf_convert.c), used by dev/test/test_hf.sh.

It reads and writes safetensors files itself (the JSON header and numpy.frombuffer, no C
code and no safetensors package), maps Hugging Face GPT-2 names to the oracle's tensors
(dev/test/gpt2_oracle.py, applying the Conv1D transpose itself), and compares logits.

  fixtures --out DIR [--vocab V --layers L --channels C --heads NH --max-seq T] [--seed S]
      DIR/model.bin: an llm.c model file with every tensor random (biases and LayerNorm
      too, so that a misplaced or untransposed tensor changes the logits), padded wte rows
      zero; DIR/padded_noise.bin: the same with random padded rows. Then HF directories
      (model.safetensors + config.json) made from model.bin, one per subdirectory:
      canonical (the layout hf_convert export writes: the test compares the bytes),
      published* (the names of the `gpt2` checkpoint on the Hugging Face hub: no
      "transformer." prefix, sorted, with its attn.bias / attn.masked_bias buffers; F32,
      F16 and BF16), and bad ones (a missing, unknown, misshaped, duplicated tensor, ...).
  transformers-save --out DIR [shape flags as fixtures] [--seed S]
      (with transformers only) DIR/lm_head and DIR/base as transformers' save_pretrained
      writes them for GPT2LMHeadModel (prefixed names) and GPT2Model (unprefixed).
  check [--pair M.bin HF_DIR]... [--pair-bf16 M.bin HF_DIR]... [--pair-mismatch M.bin HF_DIR]...
      the oracle's logits on each llm.c file against the oracle's on the HF file (and,
      when transformers is importable, GPT2LMHeadModel.from_pretrained(HF_DIR)'s) on a few
      token sequences; --pair-bf16: the llm.c values rounded to bf16 first;
      --pair-mismatch: a negative control, which must not match; --require-transformers:
      without transformers a failure, not SKIPPED. Exit 1 on any failure.
"""

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import gpt2_oracle as oracle  # noqa: E402

PREFIX = "transformer."
# oracle kind -> (HF name after "h.N.", Conv1D-transposed)
LAYER_MAP = {
    "ln1w": ("ln_1.weight", False), "ln1b": ("ln_1.bias", False),
    "qkvw": ("attn.c_attn.weight", True), "qkvb": ("attn.c_attn.bias", False),
    "attprojw": ("attn.c_proj.weight", True), "attprojb": ("attn.c_proj.bias", False),
    "ln2w": ("ln_2.weight", False), "ln2b": ("ln_2.bias", False),
    "fcw": ("mlp.c_fc.weight", True), "fcb": ("mlp.c_fc.bias", False),
    "fcprojw": ("mlp.c_proj.weight", True), "fcprojb": ("mlp.c_proj.bias", False),
}
TOP_MAP = {"wte": "wte.weight", "wpe": "wpe.weight", "lnfw": "ln_f.weight", "lnfb": "ln_f.bias"}
DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": (None, 2)}


def hf_name(name, kind, layer):
    """oracle tensor -> (HF name without prefix, transposed)."""
    if layer is None:
        return TOP_MAP[name], False
    suffix, transposed = LAYER_MAP[kind]
    return f"h.{layer}.{suffix}", transposed


# ----------------------------------------------------------------------------
# safetensors, by hand

def read_safetensors(path):
    """-> dict name -> float32 numpy array (F32, F16, BF16), in header order."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = data[base + begin:base + end]
        if e["dtype"] == "BF16":
            a = oracle.bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2"))
        else:
            a = np.frombuffer(raw, dtype=DTYPES[e["dtype"]][0]).astype(np.float32)
        out[name] = a.reshape(e["shape"])
    return out


def encode(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "BF16":
        return oracle.bf16_bits(a).astype("<u2").tobytes()
    return a.astype(DTYPES[dtype][0]).tobytes()


def write_safetensors(path, tensors):
    """tensors: list of (name, float32 array, dtype); laid out in that order, the header
    compact JSON after the metadata, blank-padded to a multiple of 8."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a, dtype in tensors:
        blob = encode(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------
# llm.c <-> HF tensors, by hand

def hf_tensors_from_llmc(cfg, params):
    """-> [(HF name without prefix, float32 array)] in hf_convert's order (canonical)."""
    out = []
    for name, kind, layer in cfg.canonical_order():
        t = params[name].numpy()
        if name == "wte":
            t = t[:cfg.V]  # HF's wte has no padded rows
        key, transposed = hf_name(name, kind, layer)
        out.append((key, np.ascontiguousarray(t.T) if transposed else t))
    return out


def oracle_params_from_hf(cfg, hf):
    """HF tensors (prefix optional) -> oracle params (wte padded to Vp with zeros)."""
    plain = {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in hf.items()}
    params = {}
    for name, kind, layer in cfg.canonical_order():
        key, transposed = hf_name(name, kind, layer)
        t = plain[key]
        if transposed:
            t = t.T
        if name == "wte":
            t = np.concatenate([t, np.zeros((cfg.Vp - cfg.V, cfg.C), np.float32)])
        params[name] = torch.from_numpy(np.ascontiguousarray(t, dtype=np.float32))
    return params


def config_json(cfg, published):
    c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.V,
         "n_positions": cfg.maxT, "n_embd": cfg.C, "n_layer": cfg.L, "n_head": cfg.NH,
         "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "n_inner": None}
    if published:  # the extra keys the hub's gpt2 config.json has
        c.update({"n_ctx": cfg.maxT, "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1,
                  "initializer_range": 0.02, "summary_type": "cls_index", "summary_use_proj": True,
                  "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
                  "bos_token_id": 50256, "eos_token_id": 50256})
    return c


# ----------------------------------------------------------------------------
# subcommands

def random_params(cfg, seed, padding_noise):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, kind, _ in cfg.canonical_order():
        t = 0.1 * torch.randn(cfg.shape(kind), generator=g)
        params[name] = t + 1.0 if kind in ("ln1w", "ln2w", "lnfw") else t
    params["wte"][cfg.V:] = 0.0
    if padding_noise:  # drawn last, so the other tensors equal those without it
        params["wte"][cfg.V:] = 0.1 * torch.randn((cfg.Vp - cfg.V, cfg.C), generator=g)
    return params


def write_hf(out, cfg, params, naming="canonical", dtype="F32", edit=None, config_edit=None):
    """model.safetensors + config.json in out; edit(tensors) and config_edit(dict) make bad ones."""
    published = naming == "published"
    tensors = [(k if published else PREFIX + k, t, dtype) for k, t in hf_tensors_from_llmc(cfg, params)]
    if published:
        mask = np.tril(np.ones((cfg.maxT, cfg.maxT), np.float32))[None, None]
        for l in range(cfg.L):
            tensors.append((f"h.{l}.attn.bias", mask, "F32"))
            tensors.append((f"h.{l}.attn.masked_bias", np.array(-1e4, np.float32), "F32"))
        tensors.sort(key=lambda e: e[0])
    if edit:
        tensors = edit(tensors)
    config = config_json(cfg, published)
    if config_edit:
        config_edit(config)
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def untied_head(tensors):
    head = next(t for k, t, _ in tensors if k.endswith("wte.weight")).copy()
    head[0, 0] += 1.0
    return tensors + [("lm_head.weight", head, "F32")]


def cmd_fixtures(a):
    """The model files and every HF directory the test imports, in --out."""
    cfg = oracle.Config(maxT=a.max_seq, V=a.vocab, L=a.layers, NH=a.heads, C=a.channels)
    os.makedirs(a.out, exist_ok=True)
    params = random_params(cfg, a.seed, False)
    oracle.write_model(os.path.join(a.out, "model.bin"), cfg, params, "fp32")
    oracle.write_model(os.path.join(a.out, "padded_noise.bin"), cfg, random_params(cfg, a.seed, True), "fp32")
    out = lambda name: os.path.join(a.out, name)  # noqa: E731
    write_hf(out("canonical"), cfg, params)
    write_hf(out("published"), cfg, params, "published")
    write_hf(out("published_f16"), cfg, params, "published", "F16")
    write_hf(out("published_bf16"), cfg, params, "published", "BF16")
    drop = PREFIX + "h.1.mlp.c_fc.bias"
    write_hf(out("missing"), cfg, params, edit=lambda ts: [e for e in ts if e[0] != drop])
    extra = lambda name: lambda ts: ts + [(name, np.zeros(3, np.float32), "F32")]  # noqa: E731
    write_hf(out("unknown"), cfg, params, edit=extra(PREFIX + "h.0.attn.rotary.weight"))
    write_hf(out("beyond"), cfg, params, edit=extra(PREFIX + f"h.{cfg.L}.ln_1.weight"))
    write_hf(out("duplicate"), cfg, params, edit=extra("wte.weight"))
    bad = PREFIX + "h.0.attn.c_attn.weight"
    write_hf(out("misshaped"), cfg, params, edit=lambda ts: [(k, t.T.copy() if k == bad else t, d) for k, t, d in ts])
    write_hf(out("untied"), cfg, params, edit=untied_head)
    write_hf(out("tied_head"), cfg, params,
             edit=lambda ts: ts + [("lm_head.weight", next(t for k, t, _ in ts if k.endswith("wte.weight")), "F32")])
    write_hf(out("bad_activation"), cfg, params, config_edit=lambda c: c.update(activation_function="relu"))
    return 0


def cmd_transformers_save(a):
    """Directories written by transformers itself (save_pretrained, safetensors), from a
    GPT-2 with transformers' own random init: OUT/lm_head (GPT2LMHeadModel: prefixed names)
    and OUT/base (GPT2Model: unprefixed, as the published checkpoint)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(a.seed)
    config = GPT2Config(vocab_size=a.vocab, n_positions=a.max_seq, n_embd=a.channels, n_layer=a.layers,
                        n_head=a.heads)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # transformers initialises biases to 0 and LayerNorm to 1: make them count
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape))
    model.save_pretrained(os.path.join(a.out, "lm_head"), safe_serialization=True)
    model.transformer.save_pretrained(os.path.join(a.out, "base"), safe_serialization=True)
    return 0


def token_batches(cfg):
    g = torch.Generator().manual_seed(1234)
    T = min(cfg.maxT, 24)
    return [torch.randint(0, cfg.V, (3, T), generator=g), torch.tensor([[0, 1, 2, cfg.V - 1, 5]])]


def compare(what, ref, got, tol, quiet):
    err = float((ref - got).abs().max()) if ref.shape == got.shape else float("inf")
    ok = err <= tol
    if not quiet:
        print(f"  [{'ok' if ok else 'FAIL'}] {what}, tokens {tuple(ref.shape[:2])}: max abs diff {err:.2e} (<= {tol:g})")
    return ok


def check_pair(model_path, hf_dir, bf16, hf_model_class, quiet=False):
    """The oracle's logits on the llm.c file against those on the safetensors file and, with
    transformers, against GPT2LMHeadModel. -> number of failures."""
    cfg, params, _ = oracle.read_model(model_path)
    if bf16:
        params = {k: torch.from_numpy(oracle.round_bf16(t.numpy())) for k, t in params.items()}
    hf_params = oracle_params_from_hf(cfg, read_safetensors(os.path.join(hf_dir, "model.safetensors")))
    model = hf_model_class.from_pretrained(hf_dir, torch_dtype=torch.float32).eval() if hf_model_class else None
    if not quiet:
        print(f"check {hf_dir} against {model_path}{' (rounded to bf16)' if bf16 else ''}")
    failures = 0
    with torch.no_grad():
        for x in token_batches(cfg):
            ref = oracle.forward(cfg, params, x)[0][..., :cfg.V]
            failures += not compare("oracle on the safetensors file vs on the llm.c file", ref,
                                    oracle.forward(cfg, hf_params, x)[0][..., :cfg.V], 1e-5, quiet)
            if model is not None:
                failures += not compare("transformers GPT2LMHeadModel.from_pretrained vs the oracle", ref,
                                        model(x).logits, 1e-5, quiet)
    return failures


def cmd_check(a):
    torch.set_num_threads(1)
    try:
        import transformers
        from transformers import GPT2LMHeadModel
        print(f"transformers {transformers.__version__}: GPT2LMHeadModel.from_pretrained is checked too")
    except ImportError:
        if a.require_transformers:
            print("FAIL: transformers is not importable by this python (bash scripts/install_hf_client.sh)")
            return 1
        GPT2LMHeadModel = None
        print("SKIPPED: transformers not installed (bash scripts/install_hf_client.sh installs the pinned one)")
    failures = sum(check_pair(m, h, False, GPT2LMHeadModel) for m, h in a.pair or [])
    failures += sum(check_pair(m, h, True, GPT2LMHeadModel) for m, h in a.pair_bf16 or [])
    for m, h in a.pair_mismatch or []:  # negative controls: the check must fail on these
        caught = check_pair(m, h, False, None, quiet=True) > 0
        failures += not caught
        print(f"  [{'ok' if caught else 'FAIL'}] negative control: {h} does not match {m}")
    print(f"check: {failures} failed")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, func in (("fixtures", cmd_fixtures), ("transformers-save", cmd_transformers_save)):
        f = sub.add_parser(name)
        f.add_argument("--out", required=True)
        for flag, default in (("--vocab", 50257), ("--layers", 2), ("--channels", 32), ("--heads", 4),
                              ("--max-seq", 32), ("--seed", 0)):
            f.add_argument(flag, type=int, default=default)
        f.set_defaults(func=func)
    c = sub.add_parser("check")
    c.add_argument("--pair", nargs=2, action="append", metavar=("MODEL", "HF_DIR"))
    c.add_argument("--pair-bf16", nargs=2, action="append", metavar=("MODEL", "HF_DIR"))
    c.add_argument("--pair-mismatch", nargs=2, action="append", metavar=("MODEL", "HF_DIR"))
    c.add_argument("--require-transformers", action="store_true", help="fail, not SKIPPED, without transformers")
    c.set_defaults(func=cmd_check)
    a = ap.parse_args()
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
