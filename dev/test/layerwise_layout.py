#!/usr/bin/env python3
"""
Megatron-core's own layer-wise layout (issue 43's ZeRO-1 Muon buffers), printed as JSON.

Usage: layerwise_layout.py --megatron DIR [--model d2 --dp 2 --bucket-size N|default|none
                           --pad-busbw --wpe muon|adamw --shared-embedding]   one case, JSON + a table
       layerwise_layout.py --megatron DIR --grid [--out FILE] [--compare FILE]  every case, JSON lines
       layerwise_layout.py --megatron DIR --grid --binary ./zero1_plan [--planted NAME=BINARY ...]
DIR: dev/test/megatron_core.sh's (megatron-core 0.19.2 unpacked; loaded as megatron_layout.py loads
it, with its placeholders, none on this path).

For a GPT-2 (llmc/gpt2_spec.h's tensors in canonical order, Vp 50304, maxT 1024), tagged as
Megatron's GPTModel tags its parameters (word_embeddings.weight, here wte = the tied classifier:
is_embedding_or_output_parameter, models/common/language_module/language_module.py:224; with
--wpe adamw wpe too, the issue's reading; with --shared-embedding wte also shared_embedding, a
first pipeline stage), this runs what Megatron's training runs (training/training.py:1570-1700,
wrap_model_chunks_with_ddp): tag_params_for_buffer_routing, then
LayerWiseDistributedOptimizer.compute_full_param_layout(params, bucket_size, dp, ddp_config),
with bucket_size as resolve_ddp_bucket_size gives it (training.py:1552-1567: default
max(40e6, 1e6 x DP), none when overlap_grad_reduce is off). It then builds Megatron's
DistributedDataParallel with that layout (which must accept it and lay out the same buffers)
and asks LayerWiseDistributedOptimizer._shard_params_from_layout, for every rank, which Muon
matrices that rank updates. It checks the layout against this file's own statement of the
algorithm (documented_layout, below: what a C implementation implements), and prints it.

JSON, one object per case: {"case": {...}, "buffers": [buffer, ...]} in DDP's buffer order (the
order of each buffer's first parameter in definition order: the AdamW buffer, wte first, then
the layer-wise one); a buffer: {"kind": "layerwise" | "distopt", "numel", "numel_unpadded",
"shards": DP, "shard_divisor" (layerwise), "buckets": [{"start", "end", "numel_unpadded",
"shard_size", "params": [indices, buffer order]}], "params": [{"index", "name", "start", "end",
"bucket", "shard" (layerwise: the one rank that owns it whole) | "ranks": [first, last]
(distopt: the ranks its elements fall to), "pad_before"}] (definition order; pad_before: the
elements between it and the previous parameter of its shard (layerwise) or bucket (distopt), or
the shard's / bucket's start), "ranks": [{"rank", "ranges": [[start, end] of its shard in each
bucket], "params": [indices it updates (layerwise, Megatron's _shard_params_from_layout) or
touches (distopt)], "param_numel", "padding"}]}. Offsets are elements, half-open.

--binary: `zero1_plan --optimizer muon --json` (its --batch) over the grid, each case's buffers
compared with Megatron's (plan_view: the same facts in both): every bucket's bounds, unpadded
numel and shard size, every parameter's place and bucket, every Muon matrix's owner inside its
own shard, and each rank's matrices. Each --planted binary (zero1_plan with one rule changed)
must differ somewhere, or fail, else the comparison proves little.

THE LAYER-WISE ALGORITHM (megatron/core/optimizer/layer_wise_optimizer.py, 0.19.2, = LW;
param_layout.py = PL):
 0. Which parameters: is_managed_by_layer_wise_optimizer (LW:38-53): p.dim() == 2 and not
    is_embedding_or_output_parameter; tag_params_for_buffer_routing (LW:74-87) sets the tag,
    group_params_for_buffers (distributed/param_and_grad_buffer.py:882-945) makes a BufferKey
    per (dtype, grad dtype, expert, managed) (PL:45-66), and compute_full_param_layout (LW:372-425)
    lays the managed buffer out with _compute_per_buffer_param_layout (LW:195-370) and the other
    with DistributedOptimizer's (distrib_optimizer.py:505-588: today's zero1/ layout, unchanged),
    both with the same bucket_size and DP. QKV is one parameter here. Params: definition order.
 1. Walk the buffer's parameters in reverse (backprop) order (LW:326), appending each to the open
    chunk: chunk_numel += numel, chunk_max = max(chunk_max, numel) (LW:337-339). After appending,
    with a bucket size, close the chunk when chunk_numel >= max(bucket_size,
    int(DP x chunk_max x 0.9)) (LW:340-346; PADDING_FLOOR 0.9, LW:322; int() truncates the
    double product): the floor keeps a chunk open while one matrix would leave most shards
    empty. bucket_size None (no overlap): one chunk. The last chunk is emitted at the end (LW:347).
    A parameter tagged shared_embedding closes the open chunk and gets a chunk of its own in shard 0,
    the other shards padded by its size (LW:269-277, 328-336); GPT-2's tied wte is tagged
    embedding, so it never enters this buffer.
 2. Emit a chunk as a bucket (_emit_bucket, LW:250-306): greedy LPT, the chunk's params sorted by
    numel descending, a stable sort (equal sizes keep backprop order) (LW:284); each goes to the
    shard with the smallest cursor, the lowest shard index on ties (min over range(DP), LW:286);
    it is placed at that cursor rounded up to 64 (pad_param_start, PL:24-26) and the cursor becomes
    placement + numel (LW:287-289).
 3. shard_size = max(cursors) rounded up to shard_divisor = lcm(64, bucket_end_divisor / DP)
    (LW:183-193, 291), bucket_end_divisor = lcm(DP, 128), or lcm(DP, 128, 65536) with
    pad_buckets_for_high_nccl_busbw (PL:29-33). The bucket is DP shards of shard_size elements,
    back to back from the end of the previous bucket (LW:292-305); shard r's params sit in the
    order they were assigned, each start rounded up to 64 (LW:295-300); the bucket's unpadded
    numel is the sum of its params' numels (LW:304). Buckets are numbered in emission order.
 4. Rank r owns (updates with Muon) exactly the params of shard r of every bucket, whole:
    shard = (start - bucket_start) // shard_size (LW:564-631, _shard_params_from_layout, which
    asserts no param crosses a shard). DP = 1: one rank, everything (LW:551-555).
    The reduce-scatter and all-gather are DDP's, over the buffer's equal per-rank shards.
LayerWiseDistributedOptimizer supports no distributed-optimizer instances (LW:456-467,
optimizer/__init__.py:834-840).
"""
import argparse
import importlib
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_layout  # noqa: E402  (loading megatron-core under torch 1.13: one way, shared)
from layout_oracle import first_difference  # noqa: E402
from megatron_layout import zero1_plans  # noqa: E402

LAYER_KINDS = ["ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb"]
PADDING_FLOOR = 0.9


# ---------------------------------------------------------------- the parameter lists

def gpt2_tensors(depth, vocab=50257, max_seq=1024):
    """(name, shape) in llmc/gpt2_spec.h's canonical order for --model dN (torch's (out, in))."""
    C = {12: 768, 24: 1024, 36: 1280, 48: 1600}.get(depth, 64 * depth)
    Vp = (vocab + 127) // 128 * 128
    shape = {"ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C), "qkvb": (3 * C,), "attprojw": (C, C),
             "attprojb": (C,), "ln2w": (C,), "ln2b": (C,), "fcw": (4 * C, C), "fcb": (4 * C,),
             "fcprojw": (C, 4 * C), "fcprojb": (C,)}
    out = [("wte", (Vp, C)), ("wpe", (max_seq, C))]
    for layer in range(depth):
        out += [("h%d.%s" % (layer, k), shape[k]) for k in LAYER_KINDS]
    return out + [("lnfw", (C,)), ("lnfb", (C,))]


def case(tensors, model=None, dp=1, bucket="default", pad_busbw=False, wpe="muon", shared=False, embedding=(0,)):
    """tensors: [(name, shape)]; embedding: the indices tagged is_embedding_or_output_parameter."""
    return {"tensors": tensors, "model": model, "dp": dp, "bucket": bucket, "pad_busbw": pad_busbw, "wpe": wpe,
            "shared": shared, "embedding": list(embedding)}


def cases():
    out = []
    models = [("d%d" % d, gpt2_tensors(d)) for d in (2, 4, 12)]
    # The grid of megatron_layout.py: bucket sizes the default, one that cuts every few tensors,
    # one (a bucket per chunk the floor allows), one larger than any model, none (no overlap).
    for name, tensors in models:
        for dp in (1, 2, 3, 4, 8):
            for bucket in ("default", 40000, 1, 10 ** 12, "none"):
                for pad_busbw in (False, True):
                    for wpe in ("muon", "adamw"):
                        out.append(case(tensors, name, dp, bucket, pad_busbw, wpe))
    # A first pipeline stage's wte (shared_embedding): the AdamW buffer gives it a bucket.
    for name, tensors in models:
        for dp in (2, 3):
            for bucket in ("default", 40000, "none"):
                out.append(case(tensors, name, dp, bucket, shared=True))
    # Random parameter lists: matrices and vectors, sizes near multiples of 64, small buckets,
    # some matrices tagged embedding (AdamW), ties in size (LPT's tie-breaks).
    rng = random.Random(20260107)
    for k in range(80):
        tensors = []
        for i in range(rng.randint(1, 14)):
            if rng.random() < 0.6:
                r = rng.choice([rng.randint(1, 96), 64, 64 * rng.randint(1, 4), 3 * 64])
                c = rng.choice([rng.randint(1, 96), 64, 128])
                tensors.append(("m%d" % i, (r, c)))
            else:
                tensors.append(("v%d" % i, (rng.choice([rng.randint(1, 300), 64 * rng.randint(1, 8) + rng.choice([-1, 0, 1])]),)))
        total = sum(math.prod(s) for _, s in tensors)
        bucket = rng.choice(["default", "none", 1, rng.randint(1, total), rng.randint(1, 4096)])
        embedding = [i for i in range(len(tensors)) if rng.random() < 0.1]
        out.append(case(tensors, None, rng.choice([1, 2, 3, 4, 5, 6, 8]), bucket, rng.random() < 0.3,
                        embedding=embedding))
    # Small matrices of sizes off multiples of 64, one chunk: a shard's load includes the
    # alignment padding before each of its matrices (the greedy choice sees it).
    for k in range(40):
        tensors = [("m%d" % i, (rng.randint(1, 15), rng.randint(1, 15))) for i in range(rng.randint(4, 14))]
        out.append(case(tensors, None, rng.choice([2, 3, 4]), "none", embedding=[]))
    # A bucket size equal to the chunk's numel after some matrix (backprop order) and above the
    # floor: the chunk closes exactly at ==, the edge of `>=`.
    for k in range(20):
        tensors = [("m%d" % i, (rng.choice([64, 128, rng.randint(1, 96)]), rng.choice([64, rng.randint(1, 96)])))
                   for i in range(rng.randint(3, 10))]
        dp = rng.choice([1, 2, 3])
        total, chunk_max, ends = 0, 0, []
        for _, shape in reversed(tensors):
            total += math.prod(shape)
            chunk_max = max(chunk_max, math.prod(shape))
            if total >= int(dp * chunk_max * PADDING_FLOOR):
                ends.append(total)
        if ends:
            out.append(case(tensors, None, dp, rng.choice(ends), embedding=[]))
    return out


def bucket_size_of(c):
    """resolve_ddp_bucket_size (training/training.py:1552-1567), overlap_grad_reduce on unless none."""
    if c["bucket"] == "none":
        return None
    if c["bucket"] == "default":
        return max(40000000, 1000000 * c["dp"])
    return c["bucket"]


# ---------------------------------------------------------------- Megatron's answer

def load(megatron_dir):
    m = megatron_layout.load_megatron(os.path.join(megatron_dir, "site"))
    m.lw = importlib.import_module("megatron.core.optimizer.layer_wise_optimizer")
    m.LW = m.lw.LayerWiseDistributedOptimizer
    return m


def megatron_case(m, c):
    """-> (the case's JSON, [(kind, numels, layout)] for documented_layout's check)."""
    torch = m.torch
    tensors, dp, bucket_size = c["tensors"], c["dp"], bucket_size_of(c)
    params = [torch.nn.Parameter(torch.empty(shape, device="meta")) for _, shape in tensors]
    for i in c["embedding"] + ([1] if c["wpe"] == "adamw" and c["model"] else []):
        params[i].is_embedding_or_output_parameter = True
    if c["shared"]:
        params[0].shared_embedding = True
    module = torch.nn.Module()
    module.params = torch.nn.ParameterList(params)
    m.lw.tag_params_for_buffer_routing([module])
    ddp_config = m.DDPConfig(use_distributed_optimizer=True, overlap_grad_reduce=bucket_size is not None,
                             bucket_size=bucket_size, pad_buckets_for_high_nccl_busbw=c["pad_busbw"])
    full = m.LW.compute_full_param_layout(params, bucket_size, dp, ddp_config)
    index = {id(p): i for i, p in enumerate(params)}

    # Megatron's DDP must take the layout and build the same buffers (rank 0 of dp).
    world, one = m.ProcessGroup(0, dp), m.ProcessGroup(0, 1)
    config = m.TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=1)
    pgc = m.PGCollection(tp=one, pp=one, ep=one, dp=world, dp_cp=world, intra_dp_cp=world, expt_dp=world,
                         intra_expt_dp=world, inter_dist_opt=one)
    ddp = m.DDP(config, ddp_config, module, pg_collection=pgc, full_param_layout=full)
    if ddp.expert_parallel_buffers or len(ddp.buffers) != len(full.layouts):
        raise RuntimeError("DDP made %d buffers for %d layouts" % (len(ddp.buffers), len(full.layouts)))

    # Megatron's owner of each Muon matrix, for every rank.
    owners = {}
    managed = [p for p in params if p.is_managed_by_layer_wise_optimizer]
    for rank in range(dp):
        me = m.LW.__new__(m.LW)  # only the two groups shard_params reads; no __init__
        me.dp_cp, me.expt_dp = m.ProcessGroup(rank, dp), m.ProcessGroup(rank, dp)
        group = {"params": list(managed)}
        m.LW.shard_params(me, [type("Opt", (), {"param_groups": [group]})()], [full])
        for p in group["params"]:
            owners.setdefault(index[id(p)], []).append(rank)

    out = {"case": {"model": c["model"], "dp": dp, "bucket": c["bucket"], "bucket_size": bucket_size,
                    "pad_busbw": c["pad_busbw"], "wpe": c["wpe"] if c["model"] else None, "shared_embedding": c["shared"],
                    "numels": None if c["model"] else [math.prod(s) for _, s in tensors],
                    "embedding": None if c["model"] else c["embedding"]},
           "buffers": []}
    checks = []
    for buf in ddp.buffers:
        key = next(k for k in full.layouts if k.is_managed_by_layer_wise_optimizer ==
                   bool(getattr(buf.params[0], "is_managed_by_layer_wise_optimizer", False)))
        layout = full.layouts[key]
        layerwise = key.is_managed_by_layer_wise_optimizer
        if {index[id(p)]: v for p, v in buf.param_index_map.items()} != {index[id(p)]: v for p, v in layout.param_index_map.items()}:
            raise RuntimeError("DDP's buffer places the parameters elsewhere than the layout")
        if [(b.offset, b.offset + b.grad_data.numel()) for b in buf.buckets] != [tuple(b) for b in layout.bucket_indices]:
            raise RuntimeError("DDP's buckets are not the layout's")
        members = sorted(index[id(p)] for p in layout.param_index_map)
        places = {index[id(p)]: v for p, v in layout.param_index_map.items()}
        b_out = []
        for b, (start, end) in enumerate(layout.bucket_indices):
            held = sorted((i for i in members if places[i][2] == b), key=lambda i: places[i][0])
            b_out.append({"start": start, "end": end, "numel_unpadded": layout.per_bucket_numel_unpadded[b],
                          "shard_size": (end - start) // dp, "params": held})
        p_out, prev_end = [], {}
        for i in sorted(members, key=lambda i: places[i][0]):
            start, end, b = places[i]
            bstart, shard_size = layout.bucket_indices[b][0], b_out[b]["shard_size"]
            if layerwise:
                shard = (start - bstart) // shard_size
                region = (b, shard)
                region_start = bstart + shard * shard_size
                entry = {"shard": shard}
                if end > region_start + shard_size:
                    raise RuntimeError("param %d crosses a shard" % i)
                if owners.get(i, [0] if dp == 1 else []) != [shard] and dp > 1:
                    raise RuntimeError("Megatron's shard_params gives param %d to ranks %s, its place shard %d"
                                       % (i, owners.get(i), shard))
            else:
                region, region_start = b, bstart
                entry = {"ranks": [(start - bstart) // shard_size, (end - 1 - bstart) // shard_size]}
            p_out.append(dict({"index": i, "name": tensors[i][0], "start": start, "end": end, "bucket": b,
                               "pad_before": start - prev_end.get(region, region_start)}, **entry))
            prev_end[region] = end
        p_out.sort(key=lambda e: e["index"])
        ranks = []
        for r in range(dp):
            ranges = [[b["start"] + r * b["shard_size"], b["start"] + (r + 1) * b["shard_size"]] for b in b_out]
            if layerwise:
                mine = [e["index"] for e in p_out if e["shard"] == r]
                numel = sum(e["end"] - e["start"] for e in p_out if e["shard"] == r)
            else:
                mine = [e["index"] for e in p_out if e["ranks"][0] <= r <= e["ranks"][1]]
                numel = sum(max(0, min(e["end"], lo_hi[1]) - max(e["start"], lo_hi[0]))
                            for e in p_out for lo_hi in [ranges[e["bucket"]]])
            ranks.append({"rank": r, "ranges": ranges, "params": mine, "param_numel": numel,
                          "padding": sum(hi - lo for lo, hi in ranges) - numel})
        buffer = {"kind": "layerwise" if layerwise else "distopt", "numel": buf.numel,
                  "numel_unpadded": buf.numel_unpadded, "shards": dp}
        if layerwise:
            buffer["shard_divisor"] = m.LW._shard_divisor(dp, ddp_config)
        buffer.update({"buckets": b_out, "params": p_out, "ranks": ranks})
        out["buffers"].append(buffer)
        checks.append((buffer["kind"], [math.prod(tensors[i][1]) for i in members], members, c, bucket_size))
    return out, checks


# ---------------------------------------------------------------- the algorithm as the header states it

def pad_up(x, d):
    return -(-x // d) * d


# Rules changed one at a time (--planted): each must make documented_layout differ from Megatron
# somewhere in the grid, or the grid could not see that mistake in an implementation either.
PLANTED = {
    "padding_floor_1.0": "the floor DP x max x 1.0 instead of 0.9",
    "no_padding_floor": "chunks close at the bucket size only",
    "close_past_size": "a chunk closes at > instead of >=",
    "forward_order": "the walk in definition order",
    "lpt_ties_last_shard": "LPT ties go to the highest shard index",
    "lpt_ties_definition_order": "equal sizes sorted in definition order",
    "lpt_load_without_alignment": "a shard's load counts no alignment padding",
    "param_start_32": "parameter starts aligned to 32",
    "shard_divisor_without_dp": "shards padded to lcm(64, bucket divisor) (not / DP)",
    "shard_divisor_64": "shards padded to 64 only",
}


def documented_layout(numels, shared, bucket_size, dp, pad_busbw, planted=None):
    """The header's steps 1-3 for one layer-wise buffer; numels in definition order (shared: the
    indices tagged shared_embedding). -> ({i: (start, end, bucket)}, [(bucket start, end)], [unpadded])."""
    divisor = math.lcm(dp, 128, 65536) if pad_busbw else math.lcm(dp, 128)
    shard_divisor = math.lcm(64, divisor // dp)
    if planted == "shard_divisor_without_dp":
        shard_divisor = math.lcm(64, divisor)
    elif planted == "shard_divisor_64":
        shard_divisor = 64
    align = 32 if planted == "param_start_32" else 64
    floor = {"padding_floor_1.0": 1.0, "no_padding_floor": 0.0}.get(planted, PADDING_FLOOR)
    places, buckets, unpadded = {}, [], []

    def emit(chunk, shared_one=False):
        if not chunk:
            return
        assign, cursors = [[] for _ in range(dp)], [0] * dp
        if shared_one:  # shard 0 holds it, the others as much padding
            assign[0].append(chunk[0])
            cursors = [numels[chunk[0]]] * dp
        else:
            ties = sorted(chunk) if planted == "lpt_ties_definition_order" else chunk
            for i in sorted(ties, key=lambda i: -numels[i]):  # stable: ties keep backprop order
                s = min(range(dp), key=lambda k: cursors[k])   # least loaded, lowest index on ties
                if planted == "lpt_ties_last_shard":
                    s = max(range(dp), key=lambda k: (-cursors[k], k))
                assign[s].append(i)
                cursors[s] = (cursors[s] if planted == "lpt_load_without_alignment" else pad_up(cursors[s], align)) + numels[i]
        size = pad_up(max(cursors), shard_divisor)
        start = buckets[-1][1] if buckets else 0
        for s in range(dp):
            cur = start + s * size
            for i in assign[s]:
                cur = pad_up(cur, align)
                places[i] = (cur, cur + numels[i], len(buckets))
                cur += numels[i]
        buckets.append((start, start + dp * size))
        unpadded.append(sum(numels[i] for i in chunk))

    chunk, chunk_numel, chunk_max = [], 0, 0
    for i in (range(len(numels)) if planted == "forward_order" else reversed(range(len(numels)))):
        if i in shared:
            emit(chunk)
            chunk, chunk_numel, chunk_max = [], 0, 0
            emit([i], shared_one=True)
            continue
        chunk.append(i)
        chunk_numel += numels[i]
        chunk_max = max(chunk_max, numels[i])
        threshold = max(bucket_size or 0, int(dp * chunk_max * floor))
        if bucket_size is not None and (chunk_numel > threshold if planted == "close_past_size" else chunk_numel >= threshold):
            emit(chunk)
            chunk, chunk_numel, chunk_max = [], 0, 0
    emit(chunk)
    return places, buckets, unpadded


def check_documented(case_json, checks, planted=None):
    """None, or the first difference between Megatron's layer-wise buffer and documented_layout."""
    for kind, numels, members, c, bucket_size in checks:
        if kind != "layerwise":
            continue
        shared = {k for k, i in enumerate(members) if c["shared"] and i == 0}
        places, buckets, unpadded = documented_layout(numels, shared, bucket_size, c["dp"], c["pad_busbw"], planted)
        buf = next(b for b in case_json["buffers"] if b["kind"] == "layerwise")
        got = {members[k]: v for k, v in places.items()}
        want = {e["index"]: (e["start"], e["end"], e["bucket"]) for e in buf["params"]}
        if got != want:
            i = next(i for i in want if want[i] != got.get(i))
            return "param %d at %s, documented_layout says %s" % (i, want[i], got.get(i))
        if [(b["start"], b["end"]) for b in buf["buckets"]] != buckets or [b["numel_unpadded"] for b in buf["buckets"]] != unpadded:
            return "buckets %s, documented_layout says %s" % ([(b["start"], b["end"]) for b in buf["buckets"]], buckets)
    return None


def invariants(case_json):
    """The properties the issue names, on Megatron's output: None or what fails."""
    for buf in case_json["buffers"]:
        for e in buf["params"]:
            if e["start"] % 64:
                return "%s buffer: %s starts at %d, not a multiple of 64" % (buf["kind"], e["name"], e["start"])
        if buf["kind"] != "layerwise":
            continue
        order = sorted(buf["params"], key=lambda e: -e["index"])  # backprop order
        for b, bucket in enumerate(buf["buckets"]):
            if bucket["shard_size"] % buf["shard_divisor"] or bucket["end"] - bucket["start"] != buf["shards"] * bucket["shard_size"]:
                return "layerwise bucket %d: shard size %d, divisor %d" % (b, bucket["shard_size"], buf["shard_divisor"])
            ids = [k for k, e in enumerate(order) if e["bucket"] == b]
            if ids != list(range(ids[0], ids[-1] + 1)):
                return "layerwise bucket %d is not a contiguous run in backprop order" % b
    return None


# ---------------------------------------------------------------- zero1_plan --optimizer muon

def plan_args(c):
    """zero1_plan's arguments for a case: the Muon matrices are the 2-D untagged parameters."""
    if c["model"]:
        args = ["--model", c["model"], "--wpe", c["wpe"]]
    else:
        matrices = [i for i, (_, s) in enumerate(c["tensors"]) if len(s) == 2 and i not in c["embedding"]]
        args = ["--numels", ",".join(str(math.prod(s)) for _, s in c["tensors"]),
                "--matrices", ",".join(map(str, matrices)) or "none"]
    args += ["--optimizer", "muon", "--dp", str(c["dp"]), "--json"]
    if c["bucket"] == "none":
        args.append("--no-overlap-grad-reduce")
    elif c["bucket"] != "default":
        args += ["--bucket-size", str(c["bucket"])]
    if c["pad_busbw"]:
        args.append("--pad-busbw")
    if c["shared"]:
        args += ["--shared-embedding", "0"]
    return args


def plan_view(buffers, kind_key, owner_key):
    """What both sides say of each buffer, in the same words. kind_key(buffer) -> "muon" | "adamw";
    owner_key: the Muon matrix's rank in a param entry ("shard" in Megatron's, "owner" in zero1_plan's)."""
    out = []
    for buf in buffers:
        muon = kind_key(buf) == "muon"
        dp = buf.get("shards", buf.get("group_size"))
        view = {"optimizer": kind_key(buf), "numel": buf["numel"], "numel_unpadded": buf["numel_unpadded"],
                "buckets": [[b["start"], b["end"], b["numel_unpadded"]] + ([(b["end"] - b["start"]) // dp] if muon else [])
                            for b in buf["buckets"]],
                "params": {str(e["index"]): [e["start"], e["end"], e["bucket"]] + ([e[owner_key]] if muon else [])
                           for e in buf["params"]}}
        if muon:
            view["ranks"] = [[r["rank"], sorted(r["params"]), r["param_numel"], r["padding"]] for r in buf["ranks"]]
        out.append(view)
    return out


def plan_difference(want, got):
    """None, or the first difference between Megatron's case and zero1_plan's JSON for it."""
    mine = plan_view(got["buffers"], lambda b: b["optimizer"], "owner")
    for buf, view in zip(got["buffers"], mine):
        if view["optimizer"] != "muon":
            continue
        for e in buf["params"]:  # whole inside the owner's shard (the layout's point)
            b = buf["buckets"][e["bucket"]]
            lo = b["start"] + e["owner"] * b["shard_size"]
            if not lo <= e["start"] < e["end"] <= lo + b["shard_size"]:
                return "param %d [%d, %d) is not inside its owner %d's shard [%d, %d)" % (
                    e["index"], e["start"], e["end"], e["owner"], lo, lo + b["shard_size"])
    theirs = plan_view(want["buffers"], lambda b: "muon" if b["kind"] == "layerwise" else "adamw", "shard")
    return first_difference(theirs, mine)


def compare_plans(binary, all_cases, wants):
    """[(case index, difference)] of zero1_plan against Megatron; a failed batch: [(-1, why)]."""
    try:
        gots = zero1_plans(binary, all_cases, plan_args)
    except RuntimeError as e:
        return [(-1, str(e))]
    return [(k, d) for k, (w, g) in enumerate(zip(wants, gots)) for d in [plan_difference(w, g)] if d]


# ---------------------------------------------------------------- printing

def table(case_json):
    c = case_json["case"]
    lines = ["%s DP=%d bucket_size=%s pad_busbw=%s wpe=%s shared_embedding=%s" % (
        c["model"] or "numels", c["dp"], c["bucket_size"], c["pad_busbw"], c["wpe"], c["shared_embedding"])]
    for buf in case_json["buffers"]:
        lines.append("%s buffer: numel %d, unpadded %d, padding %d (%.2f%%)%s" % (
            buf["kind"], buf["numel"], buf["numel_unpadded"], buf["numel"] - buf["numel_unpadded"],
            100.0 * (buf["numel"] - buf["numel_unpadded"]) / max(1, buf["numel"]),
            ", shard divisor %d" % buf["shard_divisor"] if buf["kind"] == "layerwise" else ""))
        names = {e["index"]: e for e in buf["params"]}
        for b, bucket in enumerate(buf["buckets"]):
            lines.append("  bucket %d [%d, %d) shard %d x %d, unpadded %d" % (
                b, bucket["start"], bucket["end"], buf["shards"], bucket["shard_size"], bucket["numel_unpadded"]))
            if buf["kind"] == "layerwise":
                for r in range(buf["shards"]):
                    held = [names[i] for i in bucket["params"] if names[i]["shard"] == r]
                    lines.append("    rank %d [%d, %d): %s" % (
                        r, bucket["start"] + r * bucket["shard_size"], bucket["start"] + (r + 1) * bucket["shard_size"],
                        " ".join("%s@%d+%d" % (e["name"], e["start"], e["end"] - e["start"]) for e in held) or "-"))
            else:
                lines.append("    " + " ".join("%s@%d+%d" % (names[i]["name"], names[i]["start"],
                                                           names[i]["end"] - names[i]["start"]) for i in bucket["params"]))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megatron", required=True, help="a directory of dev/test/megatron_core.sh")
    ap.add_argument("--grid", action="store_true", help="every case, one JSON per line")
    ap.add_argument("--out", default=None, help="with --grid: write the JSON lines here (default: stdout)")
    ap.add_argument("--compare", default=None, help="with --grid: JSON lines of another implementation, same order")
    ap.add_argument("--binary", default=None, help="with --grid: compare zero1_plan --optimizer muon --json")
    ap.add_argument("--planted", action="append", default=[], metavar="NAME=BINARY",
                    help="with --binary: a zero1_plan with one rule changed, which must differ")
    ap.add_argument("--model", default="d2")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--bucket-size", default="default")
    ap.add_argument("--pad-busbw", action="store_true")
    ap.add_argument("--wpe", choices=["muon", "adamw"], default="muon")
    ap.add_argument("--shared-embedding", action="store_true")
    ap.add_argument("--table", action="store_true", help="one case: also a table")
    a = ap.parse_args()
    t0 = time.time()
    m = load(a.megatron)
    if not a.grid:
        bucket = a.bucket_size if a.bucket_size in ("default", "none") else int(a.bucket_size)
        c = case(gpt2_tensors(int(a.model.lstrip("d"))), a.model, a.dp, bucket, a.pad_busbw, a.wpe, a.shared_embedding)
        got, checks = megatron_case(m, c)
        problems = [p for p in (check_documented(got, checks), invariants(got)) if p]
        print(json.dumps(got))
        if a.table:
            print(table(got))
        for p in problems:
            print("FAIL %s" % p)
        return 1 if problems or megatron_layout.PLACEHOLDERS_USED else 0
    all_cases = cases()
    results, failures, all_checks_list = [], 0, []
    for k, c in enumerate(all_cases):
        got, checks = megatron_case(m, c)
        all_checks_list.append(checks)
        for p in (check_documented(got, checks), invariants(got)):
            if p:
                failures += 1
                if failures <= 5:
                    print("FAIL case %d (%s): %s" % (k, json.dumps(got["case"]), p))
        results.append(got)
    if megatron_layout.PLACEHOLDERS_USED:
        failures += 1
        print("FAIL: Megatron's code used placeholders: %s" % ", ".join(sorted(set(megatron_layout.PLACEHOLDERS_USED))))
    out = open(a.out, "w") if a.out else sys.stdout
    for r in results:
        out.write(json.dumps(r) + "\n")
    if a.out:
        out.close()
    for name, what in PLANTED.items():
        caught = [k for k, (r, ch) in enumerate(zip(results, all_checks_list)) if check_documented(r, ch, name)]
        if caught:
            print("PASS planted %s (%s): %d cases differ, first case %d" % (name, what, len(caught), caught[0]),
                  file=sys.stderr if not a.out else sys.stdout)
        else:
            failures += 1
            print("FAIL planted %s (%s): no case differs, so the grid cannot see it" % (name, what))
    lw = [b for r in results for b in r["buffers"] if b["kind"] == "layerwise"]
    summary = ("megatron-core %s: %d cases, %d layer-wise buckets, %d AdamW buckets, documented_layout == "
               "LayerWiseDistributedOptimizer in every case: %s, in %.1f s" % (
                   m.version, len(results), sum(len(b["buckets"]) for b in lw),
                   sum(len(b["buckets"]) for r in results for b in r["buffers"] if b["kind"] == "distopt"),
                   "yes" if failures == 0 else "NO (%d failures)" % failures, time.time() - t0))
    print(summary, file=sys.stderr if not a.out else sys.stdout)
    if a.binary:
        differ = compare_plans(a.binary, all_cases, results)
        for k, d in differ[:5]:
            print("FAIL case %d (zero1_plan %s): %s" % (k, " ".join(plan_args(all_cases[k])[:8]) if k >= 0 else "", d))
        print("%s zero1_plan --optimizer muon: %d of %d cases differ from megatron-core %s (both buffers, every "
              "matrix's owner)" % ("FAIL" if differ else "PASS", len(differ), len(results), m.version))
        failures += len(differ)
        for planted in a.planted:
            name, binary = planted.split("=", 1)
            caught = compare_plans(binary, all_cases, results)
            if caught:
                k, d = caught[0]
                print("PASS planted %s: %s" % (name, "its batch fails: %s" % d if k < 0 else
                                                 "%d cases differ, first case %d: %s" % (len(caught), k, d)))
            else:
                failures += 1
                print("FAIL planted %s: no case differs, so the comparison cannot see it" % name)
    if a.compare:
        with open(a.compare) as f:
            theirs = [json.loads(line) for line in f]
        if len(theirs) != len(results):
            print("FAIL compare: %d objects in %s for %d cases" % (len(theirs), a.compare, len(results)))
            return 1
        differ = [(k, first_difference(w, g)) for k, (w, g) in enumerate(zip(results, theirs))]
        differ = [(k, d) for k, d in differ if d]
        for k, d in differ[:5]:
            print("FAIL case %d: %s" % (k, d))
        print("%s compare: %d of %d cases differ from megatron-core %s" % (
            "FAIL" if differ else "PASS", len(differ), len(results), m.version))
        failures += len(differ)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
