#!/usr/bin/env python3
"""The real compiler's report on every kernel, against the budgets kept in the repository.

    check_compiler_report.py --budgets FILE [--cuobjdump PATH] [--json OUT] PRECISION:DIR ...

Each DIR is one nvcc build's `--keep-dir` with `-Xptxas -v` (scripts/check_cuda_build.sh makes
them): build.log (nvcc's output: ptxas' "Used N registers ..." per kernel), the *.ptx (the
kernels' __launch_bounds__, as .maxntid) and the *.sm_NN.cubin (the SASS, read with
cuobjdump where there is one: dev/test/cuda_cuobjdump.sh). A kernel built by several builds of
one precision is one row (its worst figures).

Checks, per kernel and precision (docs/gpu.md, "The compiler's report"):
  - no spill stores or loads, anywhere;
  - local memory (ptxas' stack frame) at most the budget's `local` (0 for a kernel without a
    row);
  - registers x the launch's block within the 65536 registers of an SM (a block that does not
    fit fails at launch): the block is the budget's `block`, else the kernel's launch bounds,
    else 1024 (the most a launch may ask, which a kernel without bounds must then fit);
  - the SASS holds what the budget's `sass` names: hmma (tensor-core instructions), ldg128 /
    stg128 (128-bit global loads / stores); SKIPPED, loudly, without cuobjdump;
  - every budget row names a kernel that was compiled (a renamed kernel keeps its budget).
Prints the table (registers, spills, local, shared, block, blocks per SM and occupancy of
sm_90, SASS counts) and one line per failure; exits 1 on any. --json writes the table as JSON
Lines (gpt2_cost --occupancy reads it).
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys

# sm_90 (H100/H200), CUDA's occupancy rules: registers are allocated per warp in units of 256,
# shared memory per block plus 1 KB the system reserves, at most 32 blocks and 64 warps an SM.
SM_REGISTERS = 65536
REG_UNIT_PER_WARP = 256
SM_SHARED = 233472
SHARED_RESERVED_PER_BLOCK = 1024
SM_MAX_WARPS = 64
SM_MAX_BLOCKS = 32
MAX_BLOCK = 1024
SASS_TAGS = ("hmma", "ldg128", "stg128")


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def short_name(demangled):
    """'void adamw_spans_kernel<float, false>(T, ...)' -> ('adamw_spans_kernel<float, false>', 'adamw_spans_kernel')."""
    depth = 0
    for i, ch in enumerate(demangled):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            demangled = demangled[:i]
            break
    if demangled.startswith("void "):  # a template instantiation carries its return type
        demangled = demangled[5:]
    return demangled, demangled.split("<")[0]


def parse_ptxas(path):
    """{mangled: {registers, spill_stores, spill_loads, local, shared}} of a build log's ptxas -v lines."""
    kernels, entry, props_of = {}, None, None
    for line in open(path, errors="replace"):
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            entry = m.group(1)
            kernels[entry] = dict(registers=0, spill_stores=0, spill_loads=0, local=0, shared=0)
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props_of = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and entry is not None and props_of == entry:
            k = kernels[entry]
            k["local"] = max(k["local"], int(m.group(1)))
            k["spill_stores"], k["spill_loads"] = int(m.group(2)), int(m.group(3))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and entry is not None:
            k = kernels[entry]
            k["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            k["shared"] = int(s.group(1)) if s else 0
            c = re.search(r"(\d+) bytes cumulative stack size", line)
            if c:
                k["local"] = max(k["local"], int(c.group(1)))
    return kernels


def parse_ptx_bounds(path):
    """{mangled: threads} of the entries with .maxntid or .reqntid (__launch_bounds__)."""
    text = open(path, errors="replace").read()
    bounds = {}
    for m in re.finditer(r"\.entry\s+([\w$]+)\s*\(", text):
        head = text[m.end():text.find("{", m.end())]
        b = re.search(r"\.(?:maxntid|reqntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", head)
        if b:
            bounds[m.group(1)] = int(b.group(1)) * int(b.group(2) or 1) * int(b.group(3) or 1)
    return bounds


def parse_sass(cuobjdump, path):
    """{mangled: Counter of hmma, ldg128, stg128, local (LDL/STL), ldsm} from a cubin's SASS."""
    out = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("check_compiler_report: %s -sass %s failed: %s" % (cuobjdump, path, out.stderr.strip()))
    counts, current = {}, None
    for line in out.stdout.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = counts.setdefault(m.group(1), collections.Counter())
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if not m or current is None:
            continue
        op = m.group(1)
        parts = op.split(".")
        if parts[0] == "HMMA":
            current["hmma"] += 1
        elif parts[0] == "LDG" and "128" in parts:
            current["ldg128"] += 1
        elif parts[0] == "STG" and "128" in parts:
            current["stg128"] += 1
        elif parts[0] in ("LDL", "STL"):
            current["local_ops"] += 1
        elif parts[0] == "LDSM":
            current["ldsm"] += 1
    return counts


def read_budgets(path):
    rows = []
    for n, line in enumerate(open(path), 1):
        words = line.split("#")[0].split()
        if not words:
            continue
        if len(words) != 5:
            sys.exit("%s:%d: want KERNEL PRECISION BLOCK LOCAL SASS, got %r" % (path, n, line.strip()))
        kernel, precision, block, local, sass = words
        if precision not in ("BF16", "FP32", "any"):
            sys.exit("%s:%d: precision %r: want BF16, FP32 or any" % (path, n, precision))
        tags = [] if sass == "-" else sass.split(",")
        for t in tags:
            if t not in SASS_TAGS:
                sys.exit("%s:%d: sass %r: want - or a comma list of %s" % (path, n, t, ", ".join(SASS_TAGS)))
        rows.append(dict(kernel=kernel, precision=precision, block=None if block == "-" else int(block),
                         local=int(local), sass=tags, line=n, used=False))
    return rows


def occupancy(registers, shared, block):
    """(registers the block takes, blocks per SM) on sm_90."""
    warps = -(-block // 32)
    per_warp = -(-max(registers, 1) * 32 // REG_UNIT_PER_WARP) * REG_UNIT_PER_WARP
    by_regs = (SM_REGISTERS // per_warp) // warps
    by_shared = SM_SHARED // (shared + SHARED_RESERVED_PER_BLOCK)
    return warps * per_warp, min(by_regs, by_shared, SM_MAX_WARPS // warps, SM_MAX_BLOCKS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", required=True)
    ap.add_argument("--cuobjdump", default="", help="cuobjdump for the SASS checks (none: SKIPPED)")
    ap.add_argument("--json", default="", help="write the table as JSON Lines")
    ap.add_argument("builds", nargs="+", metavar="PRECISION:DIR")
    a = ap.parse_args()

    budgets = read_budgets(a.budgets)
    found = collections.OrderedDict()  # (precision, mangled) -> figures
    bounds, sass = {}, {}
    for spec in a.builds:
        precision, _, d = spec.partition(":")
        if precision not in ("BF16", "FP32") or not os.path.isdir(d):
            sys.exit("check_compiler_report: %r: want BF16:DIR or FP32:DIR of an existing directory" % spec)
        log = os.path.join(d, "build.log")
        if not os.path.isfile(log):
            sys.exit("check_compiler_report: no build.log in %s" % d)
        for name, k in parse_ptxas(log).items():
            old = found.setdefault((precision, name), k)
            for key in k:
                old[key] = max(old[key], k[key])
        for ptx in glob.glob(os.path.join(d, "*.ptx")):
            for name, threads in parse_ptx_bounds(ptx).items():
                bounds[(precision, name)] = threads
        if a.cuobjdump:
            for cubin in glob.glob(os.path.join(d, "*.cubin")):
                for name, c in parse_sass(a.cuobjdump, cubin).items():
                    old = sass.setdefault((precision, name), collections.Counter())
                    for t, v in c.items():
                        old[t] = max(old[t], v)
    if not found:
        sys.exit("check_compiler_report: no ptxas report in the build logs (built without -Xptxas -v?)")

    names = demangle(sorted({n for _, n in found}))
    failures, rows = [], []
    for (precision, mangled), k in sorted(found.items(), key=lambda kv: (kv[0][0], names[kv[0][1]])):
        full, base = short_name(names[mangled])
        budget = None
        for b in budgets:
            if b["kernel"] in (base, full) and b["precision"] in (precision, "any"):
                budget, b["used"] = b, True
        if budget and budget["block"]:
            block, source = budget["block"], "budget"
        elif (precision, mangled) in bounds:
            block, source = bounds[(precision, mangled)], "bounds"
        else:
            block, source = MAX_BLOCK, "max"
        block_registers, per_sm = occupancy(k["registers"], k["shared"], block)
        if source == "max":  # the register check's worst case, not the launch: no occupancy to tell
            per_sm = None
        local_budget = budget["local"] if budget else 0
        s = sass.get((precision, mangled))
        why = []
        if k["spill_stores"] or k["spill_loads"]:
            why.append("spills (%d bytes stored, %d loaded)" % (k["spill_stores"], k["spill_loads"]))
        if k["local"] > local_budget:
            why.append("%d bytes of local memory, budget %d" % (k["local"], local_budget))
        if block_registers > SM_REGISTERS:
            why.append("%d registers x %d threads (%s) = %d registers, more than an SM's %d: the launch fails"
                       % (k["registers"], block, {"budget": "the budget's block", "bounds": "its launch bounds",
                                                  "max": "no launch bounds: up to 1024"}[source],
                          block_registers, SM_REGISTERS))
        skipped = []
        for tag in budget["sass"] if budget else []:
            if s is None:
                skipped.append(tag)
            elif s[tag] == 0:
                why.append("no %s instruction in its SASS" % {"hmma": "tensor-core (HMMA)", "ldg128": "128-bit global "
                           "load (LDG.E.128)", "stg128": "128-bit global store (STG.E.128)"}[tag])
        note = ""
        if budget and local_budget and k["local"] < local_budget:
            note = "budget local %d can tighten to %d" % (local_budget, k["local"])
        row = dict(kernel=full, precision=precision, registers=k["registers"], spill_stores=k["spill_stores"],
                   spill_loads=k["spill_loads"], local=k["local"], shared=k["shared"], block=block,
                   block_source=source, block_registers=block_registers, blocks_per_sm=per_sm,
                   occupancy=None if per_sm is None else per_sm * -(-block // 32) / SM_MAX_WARPS,
                   **{t: None if s is None else s[t] for t in SASS_TAGS + ("local_ops", "ldsm")}, status="FAIL" if why else "ok", why=why,
                   sass_skipped=skipped, note=note)
        rows.append(row)
        failures += ["%s %s: %s" % (precision, full, w) for w in why]
    for b in budgets:
        if not b["used"]:
            failures.append("%s:%d: budget for %s (%s) names no compiled kernel (renamed or gone?)"
                            % (a.budgets, b["line"], b["kernel"], b["precision"]))

    fmt = "%-5s %-46s %4s %9s %5s %6s %5s %-6s %4s %4s | %5s %6s %6s %5s  %s"
    print(fmt % ("prec", "kernel", "regs", "spill s/l", "local", "shared", "block", "from", "blk", "occ",
                 "HMMA", "LDG128", "STG128", "LDL", "status"))
    for r in rows:
        cnt = lambda key: "-" if r[key] is None else str(r[key])
        status = r["status"] + ("" if not r["note"] else " (%s)" % r["note"])
        print(fmt % (r["precision"], r["kernel"][:46], r["registers"], "%d/%d" % (r["spill_stores"], r["spill_loads"]),
                     r["local"], r["shared"], r["block"], r["block_source"], cnt("blocks_per_sm"),
                     "-" if r["occupancy"] is None else "%d%%" % round(100 * r["occupancy"]), cnt("hmma"), cnt("ldg128"), cnt("stg128"),
                     cnt("local_ops"), status))
    print("(block from: budget = the budget's, bounds = __launch_bounds__, max = neither: 1024 assumed for the "
          "register check; blk: blocks per SM of sm_90, occ: warps resident of 64; LDL: local loads and stores)")
    wanted = sum(len(b["sass"]) for b in budgets)
    if not a.cuobjdump:
        print("SKIPPED: the SASS checks (%d in the budgets: tensor cores, 128-bit accesses): no cuobjdump "
              "(dev/test/cuda_cuobjdump.sh fetches it from PyPI)" % wanted)
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    for line in failures:
        print("FAIL: " + line)
    print("check_compiler_report: %d kernels (%s), %d failures%s" % (
        len(rows), ", ".join(sorted({r["precision"] for r in rows})), len(failures),
        "" if a.cuobjdump else "; SASS checks SKIPPED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
