#!/usr/bin/env python3
"""
Megatron-core's own code as the oracle of zero1/'s layout (dev/test/test_megatron_layout.sh).

Usage: megatron_layout.py --megatron DIR --binary ./zero1_plan [--planted NAME=BINARY ...]

DIR/site holds megatron-core unpacked from its wheel (dev/test/megatron_core.sh). For every
case below and every rank of the sharding group, Megatron's DistributedDataParallel is built
over a model whose parameters have the case's sizes (DDP picks the bucket size, asks
DistributedOptimizer for the buffer layout and builds the _ParamAndGradBuffer and its
buckets), and DistributedOptimizer._build_gbuf_range_map gives the rank's four views of every
parameter piece it owns. Everything `zero1_plan --json --shards` says about the same case must
be equal: the bucket size, every bucket's bounds, unpadded size and parameters, every
parameter's place, and every (rank, bucket) shard with its views. Each --planted binary (a
zero1_plan built with one rule changed) must differ somewhere, or the comparison proves little.

0.19.2's wheel declares Python >= 3.12 and torch >= 2.6; its layout modules (and 0.13.1's)
run on Debian's python3 (3.11) and torch 1.13 with the placeholders in SHIMS, none of which
the layout calls: a placeholder used raises, and fails the run even if caught.
"""
import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layout_oracle import first_difference  # noqa: E402  (the JSON comparison, shared)

SHIMS = [
    ("package __init__ of megatron, megatron.core, .distributed, .optimizer not run",
     "they import the whole model stack; the layout modules are loaded one by one"),
    ("torch.distributed.checkpoint, torch.distributed._shard: placeholder modules",
     "distributed checkpointing, imported by megatron.core.utils; torch 1.13 lacks the first, "
     "and the second's metadata does not import under Python 3.11"),
    ("torch.distributed._coalescing_manager: placeholder", "batches collectives; absent in torch 1.13"),
    ("torch.cuda.current_device() -> 'meta'", "the buffers get their sizes and views, no storage"),
    ("torch.cuda.Stream: objects that fail on any use", "DDP makes a communication stream for "
     "distributed-optimizer instances and hands it to its bucket groups"),
    ("torch.distributed.ProcessGroup(rank, size) for DDP's groups",
     "torch's base process group: answers rank() and size(), raises on any collective; one "
     "process asks for every rank of every size (Megatron's code also wants torch.distributed "
     "initialized: a real gloo group of this one process on 127.0.0.1)"),
]
SHIMS_0_13 = [
    ("parallel_state's data-parallel size and rank overrides, and its tensor-parallel rank (0.13 only)",
     "0.13's DDP reads the default bucket size's data-parallel size, and the ranks it logs with, "
     "from parallel_state instead of the groups it is given: set to the case's"),
]
BARE_PACKAGES = ["megatron", "megatron.core", "megatron.core.distributed", "megatron.core.optimizer"]
PLACEHOLDER_MODULES = ["torch.distributed.checkpoint", "torch.distributed._shard"]


# ---------------------------------------------------------------- loading megatron-core

PLACEHOLDERS_USED = []  # also what an `except` in Megatron's code swallowed: the run fails on any


def placeholder(qualname):
    """A class that fails when made or called: stands for a name the layout never uses."""
    def used(*args, **kwargs):
        PLACEHOLDERS_USED.append(qualname)
        raise RuntimeError("placeholder %s was used: the layout path needs it after all" % qualname)
    return type(qualname.rsplit(".", 1)[-1], (), {"__init__": used, "__call__": used})


def inert(qualname):
    """A class whose objects can be made and passed around, but fail on any other use."""
    def used(self, name):
        PLACEHOLDERS_USED.append(qualname + "." + name)
        raise RuntimeError("placeholder %s.%s was used: the layout path needs it after all" % (qualname, name))
    return type(qualname.rsplit(".", 1)[-1], (), {"__init__": lambda self, *a, **k: None, "__getattr__": used})


class PlaceholderModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = placeholder(self.__name__ + "." + name)
        setattr(self, name, value)
        return value


class PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == m or name.startswith(m + ".") for m in PLACEHOLDER_MODULES):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def load_megatron(site):
    import torch
    import torch.distributed
    sys.meta_path.insert(0, PlaceholderFinder())
    torch.distributed._coalescing_manager = placeholder("torch.distributed._coalescing_manager")
    torch.cuda.current_device = lambda: "meta"
    torch.cuda.Stream = inert("torch.cuda.Stream")
    for name in BARE_PACKAGES:
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(site, *name.split("."))]
        package.__package__ = name
        sys.modules[name] = package
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, package)
    sys.path.insert(0, site)
    import warnings
    warnings.filterwarnings("ignore")  # "Transformer Engine and Apex are not installed" and the like
    import logging
    logging.disable(logging.WARNING)   # DDP's note that it computes the layout itself
    importlib.import_module("megatron.core.parallel_state")  # first, as megatron.core's __init__ does
    jit = importlib.import_module("megatron.core.jit")
    if hasattr(jit, "disable_jit_fuser"):
        jit.disable_jit_fuser()  # Megatron's own switch: torch 1.13's TorchScript rejects its norms
    m = types.SimpleNamespace()
    m.DDP = importlib.import_module("megatron.core.distributed.distributed_data_parallel").DistributedDataParallel
    m.DDPConfig = importlib.import_module(
        "megatron.core.distributed.distributed_data_parallel_config").DistributedDataParallelConfig
    buffers = importlib.import_module("megatron.core.distributed.param_and_grad_buffer")
    m.shard_buffer = buffers.shard_buffer
    m.DistOpt = importlib.import_module("megatron.core.optimizer.distrib_optimizer").DistributedOptimizer
    m.TransformerConfig = importlib.import_module("megatron.core.transformer.transformer_config").TransformerConfig
    groups = importlib.import_module("megatron.core.process_groups_config")
    m.PGCollection = getattr(groups, "ProcessGroupCollection", None)  # None: a 0.13 release (make_ddp)
    m.GradGroups, m.ModelGroups = getattr(groups, "GradCommProcessGroups", None), getattr(groups, "ModelCommProcessGroups", None)
    m.parallel_state = sys.modules["megatron.core.parallel_state"]
    m.ProcessGroup = torch.distributed.ProcessGroup
    m.torch = torch
    # Megatron asserts torch.distributed is initialized before it logs a buffer: a real group.
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
    m.version = importlib.import_module("megatron.core.package_info").__version__
    return m


# ---------------------------------------------------------------- Megatron's answer

def make_ddp(m, config, ddp_config, module, rank, dp, group, instances):
    """DDP for `rank` of `dp` ranks sharding in `instances` groups of `group` (rank < group)."""
    world, intra, one = m.ProcessGroup(rank, dp), m.ProcessGroup(rank, group), m.ProcessGroup(0, 1)
    groups = dict(dp=world, dp_cp=world, intra_dp_cp=intra, expt_dp=world, intra_expt_dp=intra,
                  inter_dist_opt=m.ProcessGroup(0, instances))
    if m.PGCollection is not None:
        return m.DDP(config, ddp_config, module, pg_collection=m.PGCollection(tp=one, pp=one, ep=one, **groups))
    # 0.13 takes the groups in two objects, but reads the default bucket size's data-parallel
    # size and the ranks it logs with from parallel_state: its overrides, set to this rank's.
    m.parallel_state._MPU_DATA_PARALLEL_WORLD_SIZE = dp
    m.parallel_state.set_data_parallel_rank(rank)
    m.parallel_state.set_tensor_model_parallel_rank(0)
    grad, model = m.GradGroups(), m.ModelGroups()
    for name, g in groups.items():
        setattr(grad, name, g)
    model.pp, model.ep = one, one
    return m.DDP(config, ddp_config, module, grad_comm_pgs=grad, model_comm_pgs=model)


def megatron_plan(m, numels, dp, instances, bucket, pad_busbw, shared, overlap):
    """The plan zero1_plan prints, as Megatron's code makes it: one DDP per rank of group 0
    (ranks 0..G-1 of the dp ranks in `instances` consecutive groups)."""
    torch = m.torch
    group = dp // instances
    config = m.TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=1)
    plan = None
    for rank in range(group):
        params = [torch.nn.Parameter(torch.empty(n, device="meta")) for n in numels]
        if shared is not None:
            params[shared].shared_embedding = True  # Megatron's mark for a bucket of its own
        module = torch.nn.Module()
        module.params = torch.nn.ParameterList(params)
        index = {id(p): i for i, p in enumerate(params)}
        ddp_config = m.DDPConfig(use_distributed_optimizer=True, overlap_grad_reduce=overlap,
                                 bucket_size=None if bucket == "default" else bucket,
                                 pad_buckets_for_high_nccl_busbw=pad_busbw,
                                 num_distributed_optimizer_instances=instances)
        ddp = make_ddp(m, config, ddp_config, module, rank, dp, group, instances)
        if len(ddp.buffers) != 1 or ddp.expert_parallel_buffers:
            raise RuntimeError("DDP made %d buffers, want one" % len(ddp.buffers))
        buf = ddp.buffers[0]
        if plan is None:
            plan = {"dp": dp, "instances": instances, "group_size": group, "bucket_size": ddp.bucket_size,
                    "numel": buf.numel, "numel_unpadded": buf.numel_unpadded, "buckets": [], "params": [None] * len(params),
                    "shards": []}
            for b in buf.buckets:
                held = sorted(index[id(p)] for p in b.params_list)
                if held != list(range(held[0], held[-1] + 1)):
                    raise RuntimeError("bucket %d holds parameters %s, not a contiguous run" % (b.bucket_id, held))
                plan["buckets"].append({"start": b.offset, "end": b.offset + b.grad_data.numel(),
                                        "numel_unpadded": b.numel_unpadded, "first_param": held[0],
                                        "last_param": held[-1]})
            for p, (start, end, bucket_id) in buf.param_index_map.items():
                plan["params"][index[id(p)]] = {"index": index[id(p)], "start": start, "end": end, "bucket": bucket_id}
        ranges = m.DistOpt._build_gbuf_range_map(buf)[(buf.param_dtype, buf.grad_dtype)]
        for b, bucket_ranges in enumerate(ranges):
            # The rank's shard as its reduce-scatter sees it (Megatron's shard_buffer view).
            shard = m.shard_buffer(buf.buckets[b].grad_data, group)[rank]
            views = sorted(bucket_ranges["param_map"].items(), key=lambda kv: kv[1]["gbuf_world"].start)
            plan["shards"].append({
                "rank": rank, "bucket": b, "start": shard.storage_offset(), "end": shard.storage_offset() + shard.numel(),
                "params": [dict({"index": index[id(p)]},
                                **{k: [r.start, r.end] for k, r in v.items()}) for p, v in views]})
    return plan


# ---------------------------------------------------------------- the cases

def gpt2_numels(depth):
    """llmc/gpt2_spec.h's canonical tensors of `--model dN` (vocab 50257 padded to 50304, 1024
    positions): wte, wpe, twelve per block, lnfw, lnfb."""
    C = {12: 768, 24: 1024, 36: 1280, 48: 1600}.get(depth, 64 * depth)
    block = [C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C]
    return [50304 * C, 1024 * C] + block * depth + [C, C]


def case(numels, model=None, dp=1, instances=1, bucket="default", pad_busbw=False, shared=None, overlap=True,
         megatron_bucket=None):
    """megatron_bucket: what Megatron is given when it differs from zero1_plan's --bucket-size
    (bucket_size=0, whose layout --bucket-size 1 must equal)."""
    return {"numels": numels, "model": model, "dp": dp, "instances": instances, "bucket": bucket,
            "pad_busbw": pad_busbw, "shared": shared, "overlap": overlap, "megatron_bucket": megatron_bucket}


def cases():
    out = []
    models = [("d%d" % d, gpt2_numels(d)) for d in (2, 4, 12)]
    # The matrix: bucket sizes the default, one that cuts every few tensors, one (a bucket per
    # parameter), one larger than any model, and none (Megatron has no size for one bucket: its
    # one-bucket setting is overlap_grad_reduce=False).
    for name, numels in models:
        for dp in (1, 2, 3, 4, 8):
            for bucket in ("default", 40000, 1, 10 ** 12, "none"):
                for pad_busbw in (False, True):
                    out.append(case(numels, name, dp, 1, bucket, pad_busbw))
    # The shared-embedding rule: wte (index 0) in a bucket of its own.
    for name, numels in models:
        for dp in (2, 3):
            for bucket in ("default", 40000, "none"):
                out.append(case(numels, name, dp, 1, bucket, shared=0))
    # Overlap off: one bucket whatever the bucket size; bucket_size=0 as --bucket-size 1.
    for name, numels in models:
        out.append(case(numels, name, 4, 1, 40000, overlap=False))
        out.append(case(numels, name, 2, 1, "default", overlap=False))
        out.append(case(numels, name, 8, 1, 1, True, overlap=False))
        out.append(case(numels, name, 2, 1, 1, megatron_bucket=0))
    # Distributed-optimizer instances: the layout is a group's, the default bucket size the
    # whole data-parallel group's (64 ranks: 64e6 where a group of 32 would give 40e6).
    for name, numels in models:
        for dp, k in ((4, 2), (8, 2), (8, 4), (6, 3), (64, 2)):
            for bucket in ("default", 40000):
                out.append(case(numels, name, dp, k, bucket))
    # Random parameter lists: sizes near multiples of 64 (the start alignment), small buckets.
    rng = random.Random(20240520)
    for _ in range(60):
        n = rng.randint(1, 12)
        numels = [rng.choice([rng.randint(1, 3000), 64 * rng.randint(1, 40) + rng.choice([-1, 0, 1])])
                  for _ in range(n)]
        k = rng.choice([1, 1, 1, 2, 3])
        dp = k * rng.randint(1, 8)
        bucket = rng.choice(["default", "none", rng.randint(1, sum(numels)), rng.randint(1, 256)])
        shared = rng.choice([None, None, 0, n - 1, rng.randrange(n)])
        out.append(case(numels, None, dp, k, bucket, rng.random() < 0.3, shared, rng.random() < 0.8))
    # A bucket size equal to a parameter's end in the first bucket (the walk is in reverse,
    # starts 64-aligned): the bucket closes exactly at ==, the edge of `>= bucket_size`.
    for _ in range(15):
        numels = [rng.randint(1, 3000) for _ in range(rng.randint(2, 8))]
        ends, start = [], 0
        for n in reversed(numels):
            ends.append(start + n)
            start = -(-(start + n) // 64) * 64
        out.append(case(numels, None, rng.randint(1, 8), 1, rng.choice(ends[:-1])))
    return out


def plan_args(c):
    args = ["--model", c["model"]] if c["model"] else ["--numels", ",".join(map(str, c["numels"]))]
    args += ["--dp", str(c["dp"]), "--json", "--shards"]
    if c["instances"] > 1:
        args += ["--instances", str(c["instances"])]
    if c["bucket"] != "default":
        args += ["--bucket-size", str(c["bucket"])]
    if not c["overlap"]:
        args.append("--no-overlap-grad-reduce")
    if c["pad_busbw"]:
        args.append("--pad-busbw")
    if c["shared"] is not None:
        args += ["--shared-embedding", str(c["shared"])]
    return args


def zero1_plans(binary, all_cases, args_of=plan_args):
    """zero1_plan --batch over the cases (args_of(case): its arguments), one JSON each; raises
    RuntimeError when the batch fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for c in all_cases:
            f.write(" ".join(args_of(c)) + "\n")
        batch = f.name
    try:
        proc = subprocess.run([binary, "--batch", batch], capture_output=True, text=True)
    finally:
        os.unlink(batch)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) != len(all_cases):
        raise RuntimeError("%s --batch exited %d with %d JSON lines for %d cases: %s" % (
            binary, proc.returncode, len(lines), len(all_cases), proc.stderr.strip()[-300:]))
    return [json.loads(line) for line in lines]


def difference(c, want, got):
    """The first difference between Megatron's plan and zero1_plan's, or None."""
    if c["model"]:  # zero1_plan's model has the sizes Megatron was given
        sizes = [p["end"] - p["start"] for p in got["params"]]
        if sizes != c["numels"]:
            return "$.params: sizes differ from the GPT-2 tensors given to Megatron"
    if c["megatron_bucket"] is not None:  # the same layout from another bucket size
        want = dict(want, bucket_size=c["bucket"])
    return first_difference(want, got)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megatron", required=True, help="a directory of dev/test/megatron_core.sh")
    ap.add_argument("--binary", default="./zero1_plan")
    ap.add_argument("--planted", action="append", default=[], metavar="NAME=BINARY")
    a = ap.parse_args()
    t0 = time.time()
    m = load_megatron(os.path.join(a.megatron, "site"))
    all_cases = cases()
    wants = []
    for c in all_cases:
        b = c["megatron_bucket"] if c["megatron_bucket"] is not None else c["bucket"]
        wants.append(megatron_plan(m, c["numels"], c["dp"], c["instances"], None if b == "none" else b,
                                   c["pad_busbw"], c["shared"], c["overlap"] and b != "none"))
    ranks = sum(w["group_size"] for w in wants)
    print("megatron-core %s (%s): %d cases, %d ranks' DDP built, %d buckets, %d shards, in %.1f s" % (
        m.version, a.megatron, len(all_cases), ranks, sum(len(w["buckets"]) for w in wants),
        sum(len(w["shards"]) for w in wants), time.time() - t0))
    print("shims (none on the layout path):")
    for what, why in SHIMS + (SHIMS_0_13 if m.PGCollection is None else []):
        print("  %s: %s" % (what, why))
    failures = 0
    if PLACEHOLDERS_USED:
        failures += 1
        print("FAIL megatron_layout: Megatron's code used placeholders: %s" % ", ".join(sorted(set(PLACEHOLDERS_USED))))
    for k, (c, want, got) in enumerate(zip(all_cases, wants, zero1_plans(a.binary, all_cases))):
        d = difference(c, want, got)
        if d:
            failures += 1
            if failures <= 5:
                print("FAIL case %d (zero1_plan %s): %s" % (k, " ".join(plan_args(c)[:12]), d))
    if failures:
        print("FAIL megatron_layout: %d of %d cases differ from megatron-core %s" % (failures, len(all_cases), m.version))
    else:
        print("PASS megatron_layout: zero1_plan == megatron-core %s in all %d cases" % (m.version, len(all_cases)))
    for planted in a.planted:
        name, binary = planted.split("=", 1)
        caught = [(k, difference(c, want, got)) for k, (c, want, got) in
                  enumerate(zip(all_cases, wants, zero1_plans(binary, all_cases)))]
        caught = [(k, d) for k, d in caught if d]
        if caught:
            k, d = caught[0]
            print("PASS planted %s: %d cases differ, first case %d: %s" % (name, len(caught), k, d))
        else:
            failures += 1
            print("FAIL planted %s: no case differs, so the comparison cannot see it" % name)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
