#!/usr/bin/env python3
"""The kernels' memory-efficiency budgets: the CPU layer's profile against the repository's bounds.

    check_kernel_budgets.py PROFILE.jsonl BUDGETS.txt       check (exit 1 on any failure)
    check_kernel_budgets.py --write PROFILE.jsonl           print budget lines for a profile

PROFILE.jsonl: what CUDA_CPU_PROFILE=FILE writes (docs/cuda_cpu.md). BUDGETS.txt: one line per
kernel and metric, "KERNEL METRIC TODAY BOUND" ('#' comments), the metrics being

    global_load_sectors_per_request    global_store_sectors_per_request
    shared_load_wavefronts_per_request shared_store_wavefronts_per_request

(for every kind of access the kernel makes). A kernel fails when a metric exceeds its bound,
when it has a metric without a budget (a new kernel, or a new kind of access), or when a
budget names what the profile does not have (a kernel renamed or gone). --write gives the
measured values with bound = today x 1.10 (rounded up to 0.01): the margin for a change that
moves a kernel's numbers a little; a padding removed or a strided load moves them far more.
"""
import json
import math
import sys

METRICS = [
    ("global_load", "sectors"),
    ("global_store", "sectors"),
    ("shared_load", "wavefronts"),
    ("shared_store", "wavefronts"),
]
MARGIN = 1.10


def measured(path):
    """{kernel: {metric: units per request}} of a profile, for the kinds of access it made."""
    out = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            k = json.loads(line)
            m = {}
            for what, unit in METRICS:
                requests = k["%s_requests" % what]
                if requests:
                    m["%s_%s_per_request" % (what, unit)] = k["%s_%s" % (what, unit)] / requests
            if m:
                out[k["kernel"]] = m
    return out


def budgets(path):
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            words = line.split("#")[0].split()
            if not words:
                continue
            if len(words) != 4:
                sys.exit("%s:%d: want KERNEL METRIC TODAY BOUND, got %r" % (path, n, line.strip()))
            kernel, metric, today, bound = words
            out.setdefault(kernel, {})[metric] = (float(today), float(bound))
    return out


def write(profile):
    print("# kernel metric today bound  (bound = today x %.2f; dev/test/check_kernel_budgets.py)" % MARGIN)
    for kernel, m in sorted(measured(profile).items()):
        for metric, value in sorted(m.items()):
            bound = math.ceil(value * MARGIN * 100 - 1e-9) / 100
            print("%-44s %-36s %7.2f %7.2f" % (kernel, metric, value, bound))


def check(profile, budget_file):
    have, want = measured(profile), budgets(budget_file)
    failures = []
    for kernel, m in sorted(have.items()):
        if kernel not in want:
            failures.append("%s: no budget (a new kernel: add its lines from --write)" % kernel)
            continue
        for metric, value in sorted(m.items()):
            if metric not in want[kernel]:
                failures.append("%s: %s = %.2f has no budget" % (kernel, metric, value))
                continue
            today, bound = want[kernel][metric]
            if value > bound + 1e-9:
                failures.append("%s: %s = %.2f over its budget %.2f (%.2f when the budget was set)"
                                % (kernel, metric, value, bound, today))
    for kernel, m in sorted(want.items()):
        for metric in sorted(m):
            if metric not in have.get(kernel, {}):
                failures.append("%s: the budget's %s was not measured (kernel renamed or gone?)" % (kernel, metric))
    for f in failures:
        print("FAIL " + f)
    if failures:
        return 1
    print("PASS %d kernels within their budgets (%s)" % (len(have), budget_file))
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--write":
        write(argv[2])
        return 0
    if len(argv) == 3:
        return check(argv[1], argv[2])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
