#!/usr/bin/env python3
"""Independent checks of gpt2_cost (dev/cost/cost_model.h) from GPT-2's shapes, written without
reading the tool's numbers: every expected value below is computed here from B, T, L, C, NH,
V and the definitions (2 M N K per matmul, bytes read + written per kernel, ring sends
(n-1)/n of a buffer, nccl-tests' bus bandwidth).

  cost_reference.py --binary ./gpt2_cost     prints one summary line, exits 1 on a failure

Checks, for a sweep of models, batch sizes, sequence lengths (a multiple of the flash tile
and not) and paths:
  1. the linear layers' matmul FLOPs are 6 x tokens x (weight-matrix parameters), and with
     the other parameters' 6 x tokens they make 6N x tokens;
  2. attention FLOPs: naive = the full T x T square, 12 L C T per token; flash = the tiles
     at or below the diagonal (counted here per query row), 4 tile matmuls forward, 7 back;
  3. a few kernels' bytes, by hand from the tensor shapes;
  4. the roofline re-derived from the rows, MFU from its definition, MFU <= 1, H200 <= H100,
     flash moves fewer bytes than naive at T = 1024;
  5. communication: reduce-scatter / all-gather / all-reduce times from (n-1)/n x the padded
     buffer at the bus bandwidth of the link the group spans (ranks fill nodes of P GPUs) plus
     NCCL's steps x latency per step (ring: n-1 or 2(n-1) steps, those between nodes at the
     network's latency; tree: 2 x the buffer, 2((n/m-1) + floor(log2 m)) steps), per bucket;
     with --instances K the group's DP/K layout and each shard's all-reduce across the K
     groups; the padding's bounds, the overlap's two limits (one bucket: all exposed), and two
     hand-worked times; the headline (--brief, at_dp) is the table's step at --dp;
  6. measured inputs (--profile, --occupancy) from small files written here: a covered row's
     achievable time from its sectors / ideal sectors, the flash forward's from its shared-memory
     wavefronts per tensor-core FLOP at one wavefront per clock per SM and from its waves of
     blocks (the instance for d12's head size, not the <128> one); uncovered rows, FP32 and
     unknown occupancy rows, and the roofline unchanged.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

H100 = dict(tc=989e12, cc=67e12, bw=3.35e12)
# NCCL's latency per step, Simple protocol (NVIDIA/nccl src/graph/tuning.cc, hwLat, NCCL 2.2x),
# us, by algorithm: (NVLink, network); the default bus bandwidths, GB/s.
NCCL_STEP_US = {"ring": (3.4, 14.0), "tree": (4.0, 14.0)}
BUSBW = (370e9, 50e9)
H200 = dict(tc=989e12, cc=67e12, bw=4.8e12)


def flash_tiles():
    """The BF16 build's flash tiles, read from llmc/attention_flash.cuh (not from the cost
    model): forward FLASH_QUERY_TILE (16 rows a warp) x FLASH_KEY_TILE, backward FLASH_BWD_TILE."""
    import re
    text = open("llmc/attention_flash.cuh").read()
    bf16 = text[text.index("#if FLOATX_IS_BF16\n#define FLASH_WARPS"):]
    bf16 = bf16[:bf16.index("#else")]
    val = lambda name: int(re.search(r"#define %s (\d+)" % name, bf16).group(1))
    return 16 * val("FLASH_WARPS"), val("FLASH_KEY_TILE"), val("FLASH_BWD_TILE")


FWD_ROWS, FWD_COLS, BWD_TILE = flash_tiles()

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def run(binary, *args):
    out = subprocess.run([binary, "--json", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def shape(depth):
    C = {12: 768, 24: 1024, 36: 1280, 48: 1600}.get(depth, 64 * depth)
    return depth, C, C // 64


def param_counts(L, C, Vp, maxT):
    weights = L * (3 * C * C + C * C + 4 * C * C + 4 * C * C) + Vp * C  # qkv, attproj, fc, fcproj, wte
    biases = L * (3 * C + C + 4 * C + C)
    layernorms = L * 4 * C + 2 * C
    wpe = maxT * C
    return weights, weights + biases + layernorms + wpe


def flash_area(T, rows, cols):
    # per query row q: every key through the last key tile that reaches the last row of q's tile
    last = lambda q: min(T, (q // rows + 1) * rows)
    return sum(min(T, -(-last(q) // cols) * cols) for q in range(T))


def rows(j, pred):
    return [k for k in j["kernels"] if pred(k["name"])]


def total(ks, field):
    return sum(k[field] * k["count"] for k in ks)


def check_step(j, label):
    L, C, NH, T, B = j["L"], j["C"], j["NH"], j["T"], j["B"]
    V, Vp, N = j["V"], j["Vp"], j["N"]
    BT, BTC, H, hs = B * T, B * T * C, B * NH, C // NH
    weights, n_all = param_counts(L, C, Vp, j["maxT"])
    check(N == n_all, f"{label}: N {N} != {n_all} from the shapes")

    # 1. linear layers
    lin = total(rows(j, lambda n: n.startswith("matmul ")), "tc_flops")
    check(close(lin, 6 * BT * weights), f"{label}: linear matmul FLOPs {lin} != 6 x {BT} x {weights}")
    check(close(lin + 6 * BT * (N - weights), 6 * N * BT), f"{label}: 6N identity")

    # 2. attention
    att = total(rows(j, lambda n: n.startswith("attention")), "tc_flops")
    if j["attention"] == "naive":
        check(close(att, 12 * L * BT * T * C), f"{label}: naive attention FLOPs {att} != 12 L C T x tokens")
    else:
        fwd, bwd = flash_area(T, FWD_ROWS, FWD_COLS), flash_area(T, BWD_TILE, BWD_TILE)
        for area, tile in ((fwd, FWD_ROWS), (bwd, BWD_TILE)):
            check(T * (T + 1) // 2 <= area <= T * (T + 1) // 2 + T * tile, f"{label}: flash area {area} out of bounds")
        check(j["flash_tiles"] == [FWD_ROWS, FWD_COLS, BWD_TILE],
              f"{label}: the cost model's flash tiles {j['flash_tiles']} are not llmc/attention_flash.cuh's")
        check(close(att, L * H * hs * (fwd * 2 * 2 + bwd * 2 * 7)), f"{label}: flash attention FLOPs {att}")

    # 3. bytes by hand (bf16 activations: 2 bytes, fp32 statistics: 4)
    def one(name):
        r = rows(j, lambda n: n == name)
        check(len(r) == 1, f"{label}: no single row '{name}'")
        return r[0]["bytes"] if r else float("nan")

    check(one("matmul qkv") == BTC * 2 + 3 * C * C * 2 + 3 * C * 2 + BT * 3 * C * 2, f"{label}: qkv bytes")
    check(one("adamw") == j["opt_numel"] / (j["dp"] if j["zero_stage"] == 1 else 1) * (4 * 4 + 3 * 4 + 2),
          f"{label}: adamw bytes")
    check(one("encoder backward (wpe, wte)") == 2 * BTC * 2 + 2 * T * C * 4 + 3 * BT * 4 + 2 * min(BT, V) * C * 4,
          f"{label}: encoder backward bytes")
    if j["attention"] == "naive":
        check(one("attention softmax") == H * T * (T + 1) // 2 * 4 + H * T * T * 2, f"{label}: softmax bytes")
    else:
        fwd = "attention cudnn fwd (as flash)" if j["attention"] == "cudnn" else "attention flash fwd"
        check(one(fwd) == 3 * BTC * 2 + BTC * 2 + H * T * 4, f"{label}: flash fwd bytes")
    if j["fused"]:
        check(one("classifier softmax+CE+dlogits (fused)") == BT * V * 2 + 4 * BT + BT * Vp * 2 + 8 * BT,
              f"{label}: fused classifier bytes")
        check(one("matmul fc +GELU_AUX_BIAS") == BTC * 2 + 4 * C * C * 2 + 4 * C * 2 + 2 * BT * 4 * C * 2,
              f"{label}: fc + GELU epilogue bytes")
    else:
        check(one("layernorm ln1") == 2 * BTC * 2 + 2 * C * 2 + 2 * BT * 4, f"{label}: layernorm bytes")
        check(one("crossentropy forward") == 2 * BT * V * 2 + BT * 4 + 2 * BT * 4, f"{label}: CE forward bytes")
        check(one("residual add (attn)") == 3 * BTC * 2, f"{label}: residual bytes")

    # 4. roofline and MFU from their definitions
    fpt = 6 * N + 6 * L * C * T
    check(close(j["model_flops_per_token"], fpt), f"{label}: model FLOPs per token")
    for name, g in (("H100", H100), ("H200", H200)):
        st = j["step"][name]
        roof = sum(k["count"] * max(k["tc_flops"] / g["tc"] + k["cc_flops"] / g["cc"], k["bytes"] / g["bw"])
                   for k in j["kernels"])
        check(close(st["roofline_s"], roof), f"{label}: {name} roofline {st['roofline_s']} != {roof}")
        check(close(st["roofline_mfu"], BT * fpt / st["roofline_s"] / 989e12), f"{label}: {name} MFU")
        check(0 < st["roofline_mfu"] <= 1 and st["achievable_mfu"] <= st["roofline_mfu"], f"{label}: {name} MFU range")
        check(st["achievable_s"] >= st["roofline_s"], f"{label}: achievable faster than the roofline")
    check(j["step"]["H200"]["roofline_s"] <= j["step"]["H100"]["roofline_s"], f"{label}: H200 slower than H100")
    return j


def nodes_of(ranks, P):
    return len({r // P for r in ranks})


def steps_s(algo, steps, inter):
    nv, ib = NCCL_STEP_US[algo]
    return ((steps - inter) * nv + inter * ib) * 1e-6


def all_reduce_s(algo, n, m, buffer_bytes):
    if n < 2:
        return 0.0
    bw = BUSBW[m > 1]
    if algo == "tree":
        depth = int(math.floor(math.log2(m))) if m > 1 else 0
        return 2 * buffer_bytes / bw + steps_s("tree", 2 * (n // m - 1 + depth), 2 * depth)
    return 2 * (n - 1) / n * buffer_bytes / bw + steps_s("ring", 2 * (n - 1), 2 * (m - 1))


def check_comm(j, label):
    N, algo = j["N"], j["net"]["allreduce"]
    check(j["net"]["ring_latency_us"] == list(NCCL_STEP_US["ring"]) and
          j["net"]["tree_latency_us"] == list(NCCL_STEP_US["tree"]), f"{label}: latencies are not NCCL's")
    per_dp = {}
    for r in j["comm"]:
        dp, K, P, nb = r["dp"], r["instances"], r["gpus_per_node"], r["buckets"]
        G, numel, gb = dp // K, r["numel"], j["grad_bytes"]
        check(P == (dp if r["link"] == "nvlink" else j["net"]["gpus_per_node"]), f"{label}: DP {dp} row's node size")
        div = G * 128 // math.gcd(G, 128)
        check(numel % div == 0, f"{label}: DP {dp} numel {numel} not a multiple of lcm(G,128)")
        check(N <= numel < N + nb * div + 64 * (12 * j["L"] + 4), f"{label}: DP {dp} padding out of bounds")
        mg, mc, mw = nodes_of(range(G), P), nodes_of(range(0, dp, G), P), nodes_of(range(dp), P)
        check(r["group"] == [G, mg] and r["cross"] == [K, mc] and r["world"] == [dp, mw],
              f"{label}: DP {dp} groups {r['group']} {r['cross']} {r['world']} != {[G, mg]} {[K, mc]} {[dp, mw]}")
        frac = (G - 1) / G
        lat = nb * steps_s("ring", G - 1, mg - 1) if G > 1 else 0
        check(close(r["rs_s"], frac * numel * gb / BUSBW[mg > 1] + lat), f"{label}: DP {dp} reduce-scatter time")
        check(close(r["ag_s"], frac * numel * 2 / BUSBW[mg > 1] + lat), f"{label}: DP {dp} all-gather time")
        # each bucket's shard (its elements / G) all-reduced across the K groups
        cross = all_reduce_s(algo, K, mc, numel / G * gb) if K > 1 else 0
        if K > 1:
            lat1 = all_reduce_s(algo, K, mc, 0)  # one bucket's latency alone
            cross += (nb - 1) * lat1
        check(close(r["cross_s"], cross) if cross else r["cross_s"] == 0, f"{label}: DP {dp} cross all-reduce time")
        check(close(r["ar_s"], all_reduce_s(algo, dp, mw, numel * gb)), f"{label}: DP {dp} all-reduce time")
        if K == 1:  # bandwidth part / ((n-1)/n x numel) is one constant per link: bytes per element
            per_dp.setdefault((r["link"], mg > 1), []).append((r["rs_s"] - lat) / numel / frac * BUSBW[mg > 1])
        for g in ("H100", "H200"):
            e = r[g]
            rs_all = r["rs_s"] + r["cross_s"]
            check(0 <= e["exposed_rs_s"] <= rs_all * (1 + 1e-12), f"{label}: DP {dp} exposed RS range")
            check(0 <= e["exposed_ag_s"] <= r["ag_s"] * (1 + 1e-12), f"{label}: DP {dp} exposed AG range")
            if nb == 1:  # fires after the whole backward; needed by the first block
                check(close(e["exposed_rs_s"], rs_all), f"{label}: DP {dp} one bucket: RS not all exposed")
                check(close(e["exposed_ag_s"], r["ag_s"]), f"{label}: DP {dp} one bucket: AG not all exposed")
    for link, v in per_dp.items():
        check(all(close(x, v[0]) for x in v), f"{label}: {link} time does not scale with (n-1)/n")


def check_headline(binary):
    """The step at --dp (--brief and --json's at_dp) is the DP table's row for that placement, MFU
    from its definition, and by hand: d12 at DP 64 on 8 nodes of 8, 2 buckets of the default
    layout (no padding): each rank sends 63/64 x 124,475,904 x 4 B = 490,123,872 B of grads,
    9.80247744 ms at 50 GB/s, plus 2 buckets x (56 NVLink steps x 3.4 us + 7 network steps x
    14 us) = 0.5768 ms: 10.37927744 ms; --instances 8 (a group per node, 2 buckets): the group's
    reduce-scatter 7/8 x 124,475,904 x 4 B at 370 GB/s + 2 x 7 x 3.4 us = 1.225074768 ms, the
    shards' ring all-reduce across 8 nodes 2 x 7/8 x 15,559,488 x 4 B = 108,916,416 B at 50
    GB/s + 2 x 14 x 14 us = 2.57032832 ms."""
    flat, inst = run(binary, "--dp", "64"), run(binary, "--dp", "64", "--instances", "8")
    row = lambda j, link: [r for r in j["comm"] if r["dp"] == 64 and r["link"] == link][0]
    check(close(row(flat, "ib")["rs_s"], 10.37927744e-3), f"hand-worked: DP 64 RS {row(flat, 'ib')['rs_s']}")
    check(close(row(inst, "ib")["rs_s"], 1.225074768e-3), f"hand-worked: DP 64 K 8 RS {row(inst, 'ib')['rs_s']}")
    check(close(row(inst, "ib")["cross_s"], 2.57032832e-3), f"hand-worked: DP 64 K 8 xAR {row(inst, 'ib')['cross_s']}")
    for j in (flat, inst):
        for gpu in ("H100", "H200"):
            h, r = j["at_dp"][gpu], row(j, "ib")[gpu]
            check(close(h["step_s"], r["step_s"]), f"headline: {gpu} step {h['step_s']} != the table's {r['step_s']}")
            check(close(h["exposed_s"], h["step_s"] - j["step"][gpu]["achievable_s"]), f"headline: {gpu} exposed")
            check(close(h["mfu"], j["B"] * j["T"] * j["model_flops_per_token"] / h["step_s"] / 989e12),
                  f"headline: {gpu} MFU")
            check(h["mfu"] < j["step"][gpu]["achievable_mfu"], f"headline: {gpu} MFU not below compute-only")
    check(inst["at_dp"]["H100"]["step_s"] < flat["at_dp"]["H100"]["step_s"], "headline: instances not faster")
    one = run(binary, "--dp", "64", "--gpus-per-node", "64")  # one NVLink domain: the NVLink row
    check(close(one["at_dp"]["H100"]["step_s"], row(one, "nvlink")["H100"]["step_s"]), "headline: one NVLink domain")
    brief = subprocess.run([binary, "--dp", "64", "--brief"], capture_output=True, text=True, check=True).stdout
    for line, gpu in zip(brief.splitlines(), ("H100", "H200")):
        f = dict(kv.split("=") for kv in line.split() if "=" in kv)
        check(f["dp"] == "64" and f["nodes"] == "8x8", f"--brief: {line}")
        check(abs(float(f["step_ms"]) - flat["at_dp"][gpu]["step_s"] * 1e3) < 0.006, f"--brief step_ms: {line}")
        check(abs(float(f["mfu"]) - flat["at_dp"][gpu]["mfu"]) < 6e-5, f"--brief mfu: {line}")


def profile_line(kernel, sectors, ideal, wavefronts=0, wmma_flops=0):
    z = dict(kernel=kernel, launches=1, global_load_sectors=sectors, global_load_ideal_sectors=ideal,
             global_store_sectors=0, global_store_ideal_sectors=0, shared_load_wavefronts=wavefronts,
             shared_store_wavefronts=0, wmma_flops=wmma_flops)
    return json.dumps(z)


def check_measured(binary):
    """6. gpt2_cost with a profile and a compiler report made here, against the plain run."""
    d = tempfile.mkdtemp(prefix="cost_reference.")
    prof, occ = os.path.join(d, "profile.jsonl"), os.path.join(d, "occupancy.jsonl")
    with open(prof, "w") as f:  # the fused LayerNorm at 3 sectors per ideal one; flash 1.5, 0.1 wavefronts/FLOP
        f.write(profile_line("layernorm_fused_residual_forward_kernel", 300, 100) + "\n")
        f.write(profile_line("flash_attention_forward_kernel", 150, 100, 10**6, 10**7) + "\n")
        # the instance for head sizes above 64, which d12 (64) does not run: ignored
        f.write(profile_line("flash_attention_forward_kernel<128>", 900, 100, 10**7, 10**7) + "\n")
    with open(occ, "w") as f:  # the flash forward at 4 blocks per SM in BF16 (its <64> instance, then
        # the <128> one, ignored); an FP32 row and an unknown one
        f.write(json.dumps(dict(kernel="flash_attention_forward_kernel<64>", precision="BF16", blocks_per_sm=4)) + "\n")
        f.write(json.dumps(dict(kernel="flash_attention_forward_kernel<128>", precision="BF16", blocks_per_sm=1)) + "\n")
        f.write(json.dumps(dict(kernel="flash_attention_forward_kernel", precision="FP32", blocks_per_sm=1)) + "\n")
        f.write(json.dumps(dict(kernel="layernorm_forward_kernel", precision="BF16", blocks_per_sm=None)) + "\n")
    args = ["--model", "d12", "-b", "16", "-t", "1024", "--path", "new"]
    plain, meas = run(binary, *args), run(binary, *args, "--profile", prof, "--occupancy", occ)
    for f in (prof, occ):
        os.remove(f)
    os.rmdir(d)
    B, T, NH = 16, 1024, 12
    g = H100
    sms, eff_tc, eff_bw, launch = 132, meas["flash_efficiency"], meas["bandwidth_efficiency"], meas["launch_us"] * 1e-6
    clock = g["tc"] / (sms * 4 * 1024)  # 4 tensor cores an SM, 1024 dense bf16 FLOPs a clock each
    by_name = lambda j: {k["name"]: k for k in j["kernels"]}
    p, m = by_name(plain), by_name(meas)
    ln = m["residual + layernorm ln2 (fused)"]
    want = max(ln["cc_flops"] / g["cc"], 3 * ln["bytes"] / (g["bw"] * eff_bw)) + launch
    check(close(ln["achievable_s"]["H100"], want), f"measured: fused LayerNorm {ln['achievable_s']['H100']} != {want}")
    fl = m["attention flash fwd"]
    compute = fl["tc_flops"] / (g["tc"] * eff_tc) + fl["cc_flops"] / g["cc"]
    memory = 1.5 * fl["bytes"] / (g["bw"] * eff_bw)
    shared = fl["tc_flops"] * 0.1 / (sms * clock)
    waves = B * NH * math.ceil(T / FWD_ROWS) / (4 * sms)
    want = max(compute, memory, shared) * math.ceil(waves) / waves + launch
    check(close(fl["achievable_s"]["H100"], want), f"measured: flash forward {fl['achievable_s']['H100']} != {want}")
    check(shared > compute, "measured: 0.1 wavefronts per FLOP should bind the flash forward")
    for name in ("matmul qkv", "layernorm ln1 (block 0)", "attention flash bwd dQ", "encoder"):
        check(close(m[name]["achievable_s"]["H100"], p[name]["achievable_s"]["H100"]),
              f"measured: '{name}' (not measured) changed")
    for name, k in m.items():
        check(close(k["roofline_s"]["H100"], p[name]["roofline_s"]["H100"]), f"measured: roofline of '{name}' changed")
    for gpu in ("H100", "H200"):
        step = sum(k["count"] * k["achievable_s"][gpu] for k in meas["kernels"])
        check(close(meas["step"][gpu]["achievable_s"], step), f"measured: {gpu} step is not the sum of its rows")
    check(meas["step"]["H100"]["achievable_s"] > plain["step"]["H100"]["achievable_s"], "measured: step not slower")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="./gpt2_cost")
    a = ap.parse_args()
    n = 0
    configs = [
        ("d12", 16, 1024, "naive"), ("d12", 16, 1024, "new"), ("d12", 64, 1024, "naive"), ("d12", 64, 1024, "new"),
        ("d2", 1, 100, "naive"), ("d2", 3, 100, "new"), ("d24", 4, 1024, "new"), ("d48", 2, 1000, "new"),
        ("d36", 1, 64, "naive"), ("d6", 2, 257, "new"),
    ]
    results = {}
    for model, B, T, path in configs:
        label = f"{model} B={B} T={T} {path}"
        results[(model, B, T, path)] = check_step(run(a.binary, "--model", model, "-b", str(B), "-t", str(T),
                                                      "--path", path), label)
        n += 1
    for extra in (["--attention", "naive"], ["--fused-kernels", "0"], ["-r", "0"], ["--attention", "cudnn"]):
        check_step(run(a.binary, "-b", "8", *extra), f"d12 B=8 {' '.join(extra)}")
        n += 1
    zero = check_step(run(a.binary, "-b", "8", "--dp", "8", "-z", "1"), "d12 B=8 DP=8 -z 1")
    check_comm(zero, "d12 DP table")
    check_comm(run(a.binary, "--model", "d4", "-b", "2", "-t", "256", "--grad-dtype", "bf16", "--bucket-size", "100000"),
               "d4 bf16 grads, 100k buckets")
    check_comm(run(a.binary, "--model", "d12", "--bucket-size", "none"), "d12 one bucket")
    check_comm(run(a.binary, "--model", "d4", "-b", "2", "-t", "256", "--dp", "8", "--instances", "4", "--allreduce", "tree",
                   "--gpus-per-node", "3"), "d4 4 instances, tree, 3 GPUs a node")
    check_comm(run(a.binary, "--dp", "16", "--instances", "2", "--gpus-per-node", "16"), "d12 2 instances, 16 a node")
    check_headline(a.binary)
    n += 6
    check_measured(a.binary)
    n += 2
    # flash moves fewer bytes than naive at T = 1024, in attention and in the whole step
    for B in (16, 64):
        naive, new = results[("d12", B, 1024, "naive")], results[("d12", B, 1024, "new")]
        att = lambda j: total(rows(j, lambda s: s.startswith("attention")), "bytes")
        check(att(new) < att(naive) / 10, f"B={B}: flash attention bytes {att(new)} not << naive {att(naive)}")
        check(new["step"]["H100"]["bytes"] < naive["step"]["H100"]["bytes"], f"B={B}: new step bytes >= naive")
        check(new["step"]["H100"]["roofline_s"] < naive["step"]["H100"]["roofline_s"], f"B={B}: new not faster")
    if failures:
        for f in failures[:20]:
            print("FAIL", f)
        print(f"cost_reference: {len(failures)} failures in {n} runs")
        return 1
    print(f"cost_reference: {n} runs of gpt2_cost agree with the shapes (FLOPs, bytes, roofline, MFU, comm, "
          "measured inputs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
