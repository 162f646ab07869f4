#!/usr/bin/env python3
"""
Independent oracle for zero1/ layout and shard ranges, written from Megatron-LM's code
(the layout loop of _ParamAndGradBuffer, distrib_optimizer.py's _build_model_gbuf_range,
_build_model_gbuf_param_range_map and its Range.normalize), not from the C code.

Usage: layout_oracle.py --binary ./zero1_plan [--configs 2000] [--seed 1234]
Generates random configurations, runs them all through `zero1_plan --batch FILE`
(one JSON object per line), and compares every bucket, parameter place and per-rank
view with this file's own computation. Also checks coverage (every parameter element
owned by exactly one (rank, bucket)) and the ledger arithmetic. A quarter of the
configurations split the ranks into distributed-optimizer instances (--dp W --instances K):
the layout and shards are then a group's (W/K ranks), and the ledger adds the shard's
all-reduce across the K groups. Exit 0 on pass.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile


# ---------------------------------------------------------------- Megatron rules

def pad(x, divisor):
    return -(-x // divisor) * divisor  # integer ceil: offsets can exceed float precision


class Range:
    """Half-open [start, end); normalize(s) moves it to start at s, keeping its size."""

    def __init__(self, start, end):
        self.start, self.end = start, end
        self.size = end - start

    def normalize(self, start=0):
        return Range(start, start + self.size)

    def as_list(self):
        return [self.start, self.end]


def megatron_layout(numels, dp, bucket_size, pad_busbw, shared_index):
    """numels in definition order; bucket_size None = no bucketing. Returns
    (param_index_map {i: (start, end, bucket_id)}, buckets [(offset, numel, unpadded)], numel, numel_unpadded)."""
    if pad_busbw:
        divisor = math.lcm(dp, 128, 2 ** 16)
    else:
        divisor = math.lcm(dp, 128)

    def pad_end_of_bucket(x):
        return pad(x, divisor)

    def pad_start_of_param(x):
        return pad(x, 64)

    param_index_map = {}
    bucket_bounds = []      # (start, end) padded
    per_bucket_unpadded = []
    bucket_start_index = 0
    bucket_params = []
    bucket_id = 0
    param_start_index = 0
    param_end_index = 0

    def update_bucket_metadata(end_index):
        nonlocal bucket_start_index, bucket_params, bucket_id
        bucket_end_index = pad_end_of_bucket(end_index)
        per_bucket_unpadded.append(end_index - bucket_start_index)
        bucket_bounds.append((bucket_start_index, bucket_end_index))
        bucket_start_index = bucket_end_index
        bucket_params = []
        bucket_id += 1
        return bucket_end_index

    for i in reversed(range(len(numels))):
        requires_new_bucket = (i == shared_index)
        param_start_index = pad_start_of_param(param_start_index)
        if requires_new_bucket and len(bucket_params) > 0:
            param_start_index = update_bucket_metadata(param_start_index)
        param_end_index = param_start_index + numels[i]
        param_index_map[i] = (param_start_index, param_end_index, bucket_id)
        bucket_params.append(i)
        if (bucket_size is not None and (param_end_index - bucket_start_index) >= bucket_size) or requires_new_bucket:
            param_start_index = update_bucket_metadata(param_end_index)
        else:
            param_start_index = param_end_index
    if len(bucket_params) > 0:
        update_bucket_metadata(param_end_index)

    numel = bucket_bounds[-1][1]
    numel_unpadded = sum(per_bucket_unpadded)
    assert numel_unpadded <= numel
    assert numel % dp == 0
    buckets = [(s, e - s, u) for (s, e), u in zip(bucket_bounds, per_bucket_unpadded)]
    return param_index_map, buckets, numel, numel_unpadded


def gbuf_range_for_rank(bucket_offset, bucket_numel, dp, rank):
    assert bucket_numel % dp == 0
    max_range_size = bucket_numel // dp
    world_ranges = []
    for r in range(dp):
        s = r * max_range_size
        e = min(bucket_numel, s + max_range_size)
        world_ranges.append(Range(s + bucket_offset, e + bucket_offset))
    return world_ranges[rank]


def param_range_map(param_index_map, gbuf_world_range, bucket_offset):
    out = {}
    for param, (param_world_start, param_world_end, _) in param_index_map.items():
        local_start = max(0, param_world_start - gbuf_world_range.start)
        local_end = min(gbuf_world_range.size, param_world_end - gbuf_world_range.start)
        if local_end > local_start:
            local = Range(local_start, local_end)
            world = local.normalize(local_start + gbuf_world_range.start)
            world_in_bucket = Range(world.start - bucket_offset, world.end - bucket_offset)
            sub_param = local.normalize(max(0, gbuf_world_range.start - param_world_start))
            out[param] = {"gbuf_world": world, "gbuf_world_in_bucket": world_in_bucket,
                          "gbuf_local": local, "param": sub_param}
    return out


def expected_plan(cfg):
    # dp is the layout's: a group's, when the state is split into distributed-optimizer instances
    numels, dp, instances = cfg["numels"], cfg["dp"], cfg["instances"]
    bs = cfg["bucket_size"]
    if bs == "default":  # Megatron's DDP: over the whole data-parallel group, every instance's ranks
        bs = max(40_000_000, 1_000_000 * dp * instances)
    param_index_map, buckets, numel, numel_unpadded = megatron_layout(
        numels, dp, bs, cfg["pad_busbw"], cfg["shared"])
    shards = []
    for rank in range(dp):
        for b, (offset, bnumel, _) in enumerate(buckets):
            world = gbuf_range_for_rank(offset, bnumel, dp, rank)
            # Only this bucket's params (others cannot intersect the range anyway).
            in_bucket = {p: v for p, v in param_index_map.items() if v[2] == b}
            views = param_range_map(in_bucket, world, offset)
            plist = sorted(views.items(), key=lambda kv: kv[1]["gbuf_world"].start)
            shards.append({"rank": rank, "bucket": b, "start": world.start, "end": world.end,
                           "params": [{"index": p, **{k: r.as_list() for k, r in v.items()}} for p, v in plist]})
    return {
        "dp": dp * instances, "instances": instances, "group_size": dp, "bucket_size": bs, "pad_busbw": cfg["pad_busbw"],
        "numel": numel, "numel_unpadded": numel_unpadded,
        "buckets": [{"start": s, "end": s + n, "numel_unpadded": u} for s, n, u in buckets],
        "params": [{"index": i, "start": param_index_map[i][0], "end": param_index_map[i][1],
                    "bucket": param_index_map[i][2]} for i in range(len(numels))],
        "shards": shards,
    }


# ---------------------------------------------------------------- configurations

PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61]


def random_config(rng):
    r = rng.random()
    dp = rng.choice(PRIMES) if r < 0.35 else (1 if r < 0.45 else (64 if r < 0.5 else rng.randint(1, 64)))
    n = rng.randint(1, 9)
    kind = rng.choice(["none", "small", "small", "exact", "default"])
    base = rng.choice([1, 7, 64, 100, 1000, 5000])
    if kind == "none":
        bucket_size = None
        numels = [rng.randint(1, 4 * base) for _ in range(n)]
    elif kind == "default":
        bucket_size = "default"  # omit --bucket-size: the planner's default applies
        numels = [rng.randint(1, 4 * base) for _ in range(n)]
    else:
        bucket_size = rng.randint(1, base)
        numels = [rng.randint(1, 3 * bucket_size + 1) for _ in range(n)]
    shared = rng.choice([None, None, 0, n - 1, n // 2])
    instances = rng.randint(2, 5) if rng.random() < 0.25 else 1  # dp ranks per group, instances groups
    cfg = {"numels": numels, "dp": dp, "instances": instances, "bucket_size": bucket_size,
           "pad_busbw": rng.random() < 0.3, "shared": shared}
    if kind == "exact":
        # bucket_size equal to some parameter's end in the unbucketed layout: the first
        # cut then happens exactly at ==, the boundary case of `>= bucket_size`.
        pim, _, _, _ = megatron_layout(numels, dp, None, cfg["pad_busbw"], None)
        j = rng.randrange(n)
        cfg["bucket_size"] = pim[j][1]
    return cfg


def config_to_args(cfg):
    args = ["--numels", ",".join(str(x) for x in cfg["numels"]), "--dp", str(cfg["dp"] * cfg["instances"]), "--shards"]
    if cfg["instances"] > 1:
        args += ["--instances", str(cfg["instances"])]
    if cfg["bucket_size"] is None:
        args += ["--bucket-size", "none"]
    elif cfg["bucket_size"] != "default":
        args += ["--bucket-size", str(cfg["bucket_size"])]
    if cfg["pad_busbw"]:
        args.append("--pad-busbw")
    if cfg["shared"] is not None:
        args += ["--shared-embedding", str(cfg["shared"])]
    return args


# ---------------------------------------------------------------- checks

def check_coverage(cfg, got):
    """Every element of every parameter owned by exactly one (rank, bucket); every view
    inside its shard; the four views consistent."""
    owned = {i: [] for i in range(len(cfg["numels"]))}
    for sh in got["shards"]:
        for v in sh["params"]:
            w = v["gbuf_world"]
            if not (sh["start"] <= w[0] < w[1] <= sh["end"]):
                return "view %s of param %d outside shard [%d,%d)" % (w, v["index"], sh["start"], sh["end"])
            size = w[1] - w[0]
            for k in ("gbuf_world_in_bucket", "gbuf_local", "param"):
                if v[k][1] - v[k][0] != size:
                    return "view %s has a different size than gbuf_world" % k
            owned[v["index"]].append((v["param"][0], v["param"][1], sh["rank"], sh["bucket"]))
    for i, pieces in owned.items():
        pieces.sort()
        pos = 0
        for s, e, _, _ in pieces:
            if s != pos:
                return "param %d: elements [%d,%d) owned %s" % (i, min(s, pos), max(s, pos),
                                                               "twice" if s < pos else "by nobody")
            pos = e
        if pos != cfg["numels"][i]:
            return "param %d: tail [%d,%d) owned by nobody" % (i, pos, cfg["numels"][i])
    return None


def check_ledger(got):
    # dp ranks shard the state in each of k groups; world = dp * k (ring figures, rounded down)
    n, dp, groups = got["numel"], got["group_size"], got["instances"]
    world = dp * groups
    for key, pb, sb in (("bf16_params", 2, 12), ("fp32_params", 4, 8)):
        g = got["ledger"][key]
        owned = n // dp
        rs, ag = (dp - 1) * n * 4 // dp, (dp - 1) * n * pb // dp
        cross = 2 * (groups - 1) * owned * 4 // groups
        want = {"param_buffer": pb * n, "grad_buffer": 4 * n,
                "total_replicated": pb * n + 4 * n + sb * n,
                "total_zero1": pb * n + 4 * n + sb * owned,
                "sent_all_reduce": 2 * (world - 1) * n * 4 // world,
                "sent_reduce_scatter": rs, "sent_all_gather": ag,
                "sent_cross_all_reduce": cross, "sent_zero1": rs + ag + cross}
        for k, v in want.items():
            if g[k] != v:
                return "ledger %s.%s = %s, want %s" % (key, k, g[k], v)
    return None


def first_difference(want, got, path="$"):
    if isinstance(want, dict):
        for k in want:
            if k not in got:
                return "%s.%s missing" % (path, k)
            d = first_difference(want[k], got[k], "%s.%s" % (path, k))
            if d:
                return d
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(want) != len(got):
            return "%s: length %s, want %d" % (path, len(got) if isinstance(got, list) else "?", len(want))
        for i, (a, b) in enumerate(zip(want, got)):
            d = first_difference(a, b, "%s[%d]" % (path, i))
            if d:
                return d
        return None
    return None if want == got else "%s = %r, want %r" % (path, got, want)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="./zero1_plan")
    ap.add_argument("--configs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    cfgs = [random_config(rng) for _ in range(a.configs)]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for c in cfgs:
            f.write(" ".join(config_to_args(c)) + "\n")
        batch = f.name
    try:
        proc = subprocess.run([a.binary, "--batch", batch], capture_output=True, text=True)
    finally:
        os.unlink(batch)
    if proc.returncode != 0:
        print("FAIL layout_oracle: zero1_plan --batch exited %d: %s" % (proc.returncode, proc.stderr.strip()))
        return 1
    lines = proc.stdout.splitlines()
    if len(lines) != len(cfgs):
        print("FAIL layout_oracle: %d JSON lines for %d configurations" % (len(lines), len(cfgs)))
        return 1
    stats = {"buckets": 0, "views": 0, "padding_only_shards": 0, "multi_bucket": 0, "split_params": 0,
             "instances": 0}
    for k, (cfg, line) in enumerate(zip(cfgs, lines)):
        got = json.loads(line)
        want = expected_plan(cfg)
        err = first_difference(want, got) or check_coverage(cfg, got) or check_ledger(got)
        if err:
            print("FAIL layout_oracle: config %d (%s): %s" % (k, " ".join(config_to_args(cfg)), err))
            return 1
        stats["buckets"] += len(got["buckets"])
        stats["multi_bucket"] += len(got["buckets"]) > 1
        stats["instances"] += cfg["instances"] > 1
        stats["views"] += sum(len(s["params"]) for s in got["shards"])
        stats["padding_only_shards"] += sum(1 for s in got["shards"] if not s["params"])
        pieces = {}
        for s in got["shards"]:
            for v in s["params"]:
                pieces[v["index"]] = pieces.get(v["index"], 0) + 1
        stats["split_params"] += sum(1 for c in pieces.values() if c > 1)
    # The generator must actually reach the interesting cases, or the comparison proves little.
    for key in ("multi_bucket", "padding_only_shards", "split_params", "instances"):
        if stats[key] == 0:
            print("FAIL layout_oracle: no configuration exercised %s" % key)
            return 1
    print("PASS layout_oracle: %d configurations match (%d buckets, %d views, %d padding-only shards, "
          "%d multi-bucket, %d split params, %d with instances)" % (
              len(cfgs), stats["buckets"], stats["views"], stats["padding_only_shards"], stats["multi_bucket"],
              stats["split_params"], stats["instances"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
