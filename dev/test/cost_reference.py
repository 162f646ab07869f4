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
     buffer, the padding's bounds, and the overlap's two limits (one bucket: all exposed);
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


def check_comm(j, label):
    N = j["N"]
    per_dp = {}
    for r in j["comm"]:
        dp, bw = r["dp"], r["busbw_gbs"] * 1e9
        numel, gb = r["numel"], j["grad_bytes"]
        div = dp * 128 // math.gcd(dp, 128)
        check(numel % div == 0, f"{label}: DP {dp} numel {numel} not a multiple of lcm(DP,128)")
        check(N <= numel < N + r["buckets"] * div + 64 * (12 * j["L"] + 4), f"{label}: DP {dp} padding out of bounds")
        frac = (dp - 1) / dp
        check(close(r["rs_s"], frac * numel * gb / bw), f"{label}: DP {dp} reduce-scatter time")
        check(close(r["ag_s"], frac * numel * 2 / bw), f"{label}: DP {dp} all-gather time")
        check(close(r["ar_s"], 2 * frac * numel * gb / bw), f"{label}: DP {dp} all-reduce time")
        per_dp.setdefault(r["link"], []).append(r["rs_s"] / numel / frac * bw)
        for g in ("H100", "H200"):
            e = r[g]
            check(0 <= e["exposed_rs_s"] <= r["rs_s"] * (1 + 1e-12), f"{label}: DP {dp} exposed RS range")
            check(0 <= e["exposed_ag_s"] <= r["ag_s"] * (1 + 1e-12), f"{label}: DP {dp} exposed AG range")
            if r["buckets"] == 1:  # fires after the whole backward; needed by the first block
                check(close(e["exposed_rs_s"], r["rs_s"]), f"{label}: DP {dp} one bucket: RS not all exposed")
                check(close(e["exposed_ag_s"], r["ag_s"]), f"{label}: DP {dp} one bucket: AG not all exposed")
    for link, v in per_dp.items():  # time / ((n-1)/n x numel) is one constant: bytes per element
        check(all(close(x, v[0]) for x in v), f"{label}: {link} time does not scale with (n-1)/n")


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
    n += 3
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
