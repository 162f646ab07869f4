#!/usr/bin/env python3
"""Do a --trace file's gradient collectives overlap backward? Each collective is paired
with its own step's backward (dev/test/test_zero1.sh: the CPU trainer; dev/test/
run_gpu_tests.sh: the GPU trainer).

  trace_overlap.py TRACE.json PREFIX [--learned]   e.g. PREFIX "reduce-scatter b"
  trace_overlap.py --self-test                     hand-made traces: it fails where it must

A step's backward is a run of consecutive "backward ..." spans among the compute spans
("forward ..." and "backward ...", whatever the blocks are numbered); a collective belongs
to the last backward that began before it. It is early if it starts before that backward
ends. Asserts that some collective is early. --learned (the runtime learns on the first
step when each bucket is ready): none of step 1 is early, and some of step 2 starts before
its backward's last block begins.
"""
import json
import os
import sys
import tempfile


def backward_steps(events):
    """Per step: (start of its first backward span, start of its last, end of its last)."""
    compute = sorted((e for e in events if e["name"].startswith(("forward", "backward"))), key=lambda e: e["ts"])
    steps, run = [], []
    for e in compute + [None]:
        if e is not None and e["name"].startswith("backward"):
            run.append(e)
        elif run:
            steps.append((run[0]["ts"], run[-1]["ts"], max(b["ts"] + b["dur"] for b in run)))
            run = []
    return steps


def verdict(trace, prefix, learned):
    """None if the trace passes, else why not; prints what it found."""
    events = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    steps = backward_steps(events)
    colls = [e for e in events if e["name"].startswith(prefix)]
    if not steps or not colls:
        return f"no backward spans ({len(steps)}) or no '{prefix}' spans ({len(colls)})"
    early = [0] * len(steps)         # per step: collectives that start before its backward ends
    before_last = [0] * len(steps)   # ... before its last backward block begins
    for c in colls:
        own = [i for i, s in enumerate(steps) if s[0] <= c["ts"]]
        if not own:
            continue  # before any backward: not a gradient collective of this trace's steps
        _, last_begins, ends = steps[own[-1]]
        early[own[-1]] += c["ts"] < ends
        before_last[own[-1]] += c["ts"] < last_begins
    print(f"{len(colls)} '{prefix}' spans over {len(steps)} steps; per step, starting before its own "
          f"backward ends: {early}, before its last block begins: {before_last}")
    if not any(early):
        return "no gradient collective starts before its own step's backward ends"
    if learned:
        if len(steps) < 2:
            return "--learned needs two steps"
        if early[0]:
            return f"{early[0]} collective(s) of step 1 start during its backward (readiness is learned then)"
        if not before_last[1]:
            return "no collective of step 2 starts before its backward's last block"
    return None


def self_test():
    """Hand-made traces (times in us): the verdict must fail where the collectives start
    only after their own step's backward, even where each starts before the next step's
    backward ends (what pairing with any backward within 1 s let through)."""
    def trace(collective_starts):
        ev = []
        for k in range(3):  # steps every 100 ms: forward 0-30, backward 30-60 (two blocks)
            t = k * 100000
            ev += [{"ph": "X", "name": "forward 0", "ts": t, "dur": 30000},
                   {"ph": "X", "name": "backward 1", "ts": t + 30000, "dur": 15000},
                   {"ph": "X", "name": "backward 0", "ts": t + 45000, "dur": 15000}]
            ev += [{"ph": "X", "name": "reduce-scatter b0", "ts": t + s, "dur": 5000} for s in collective_starts]
        return {"traceEvents": ev}
    cases = [("collectives after their own backward", trace([62000, 70000]), False, False),
             ("one collective during its backward", trace([40000, 70000]), False, True),
             ("--learned: step 1 already early", trace([40000]), True, False)]
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        for name, t, learned, should_pass in cases:
            path = os.path.join(d, "trace.json")
            json.dump(t, open(path, "w"))
            why = verdict(path, "reduce-scatter b", learned)
            ok = (why is None) == should_pass
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {'passes' if why is None else 'fails: ' + why}")
    # The first case is the one the old rule (any backward span within 1 s) accepted.
    late = cases[0][1]["traceEvents"]
    bw = [e for e in late if e["name"] == "backward 0"]
    old_rule = any(r["ts"] < b["ts"] + b["dur"] and b["ts"] - r["ts"] < 1e6
                   for r in late if r["name"].startswith("reduce-scatter") for b in bw)
    if not old_rule:
        failures += 1
        print("FAIL the first case does not reproduce the old rule's blind spot")
    print(f"{'PASS' if not failures else 'FAIL'} trace_overlap self-test")
    return failures == 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    if len(sys.argv) not in (3, 4) or (len(sys.argv) == 4 and sys.argv[3] != "--learned"):
        sys.exit(__doc__)
    why = verdict(sys.argv[1], sys.argv[2], len(sys.argv) == 4)
    print(f"FAIL {why}" if why else "PASS gradient collectives overlap their own step's backward")
    sys.exit(1 if why else 0)
