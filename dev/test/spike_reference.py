"""An independent re-implementation of the spike rule (run/spikes.h) over a main.log.

  spike_reference.py check LOG F G W N
      replays the log's train lines (s:S trl:L norm:N) through the rule with
      --spike-loss-factor F, --spike-norm-factor G, --spike-window W, --max-spike-steps N,
      and compares every step with what the trainer logged: its spike lines
      (s:S skp:1 ... spk:WHAT rl:R rn:R: the same steps, what spiked, the ratios to 1e-5),
      and that the log ends at the step where the rule stops (or goes on past it never).
      Prints one line per spike and "stop S" or "no stop"; exit 1 on any difference.
  spike_reference.py margin LOG F G W
      the largest loss and grad norm ratios of the steps that did not spike, and how far
      below F and G they stayed: "max loss ratio R at step S (threshold F, margin M x)".

Written from the rule's words in docs/training.md, not from the C: the median from
Python's statistics module, the history a deque of the last W good steps.
"""
import math
import re
import statistics
import sys
from collections import deque


def train_steps(path):
    steps = {}
    for line in open(path):
        m = re.match(r"s:(\d+) trl:(\S+) norm:(\S+) ", line)
        if m:
            steps[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return [(s, *steps[s]) for s in sorted(steps)]


def logged_spikes(path):
    out = {}
    for line in open(path):
        m = re.match(r"s:(\d+) skp:1 .* spk:(\S+) rl:(\S+) rn:(\S+)$", line)
        if m:
            out[int(m.group(1))] = (m.group(2), float(m.group(3)), float(m.group(4)))
    return out


def replay(steps, F, G, W, N=None):
    """Yields (step, loss ratio, norm ratio, what spiked or '', stop?) for every step."""
    losses, norms = deque(maxlen=W), deque(maxlen=W)
    spikes_in_streak = 0
    for step, loss, norm in steps:
        if not (math.isfinite(loss) and math.isfinite(norm)):
            yield step, math.nan, math.nan, "", False  # a non-finite step: in the streak, not a spike
            continue
        rl = loss / statistics.median(losses) if losses else math.nan
        rn = norm / statistics.median(norms) if norms else math.nan
        what = "+".join(w for w, hit in (("loss", F > 0 and rl > F), ("norm", G > 0 and rn > G)) if hit)
        if what:
            spikes_in_streak += 1
        else:
            spikes_in_streak = 0
            losses.append(loss)
            norms.append(norm)
        yield step, rl, rn, what, N is not None and spikes_in_streak > N


def close(a, b):
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-5 * max(abs(a), abs(b))


def check(path, F, G, W, N):
    steps = train_steps(path)
    logged = logged_spikes(path)
    bad, stop = 0, None
    for step, rl, rn, what, stops in replay(steps, F, G, W, N):
        if what:
            print(f"step {step} spike {what} loss ratio {rl:.6g} norm ratio {rn:.6g}")
            got = logged.pop(step, None)
            if got is None or got[0] != what or not close(got[1], rl) or not close(got[2], rn):
                print(f"DIFFERS at step {step}: the trainer logged {got}")
                bad += 1
        if stops:
            stop = step
            break
    for step, got in sorted(logged.items()):
        print(f"DIFFERS at step {step}: the trainer logged a spike {got}, the rule none")
        bad += 1
    last = steps[-1][0] if steps else 0
    print(f"stop {stop}" if stop else "no stop")
    if stop is not None and last != stop:
        print(f"DIFFERS: the rule stops at step {stop}, the log goes on to step {last}")
        bad += 1
    return 1 if bad else 0


def margin(path, F, G, W):
    best = {"loss": (0.0, 0), "norm": (0.0, 0)}
    for step, rl, rn, what, _ in replay(train_steps(path), F, G, W):
        if what:
            print(f"step {step}: a spike ({what})")
            continue
        for key, r in (("loss", rl), ("norm", rn)):
            if r > best[key][0]:
                best[key] = (r, step)
    for key, threshold in (("loss", F), ("norm", G)):
        r, step = best[key]
        print(f"max {key} ratio {r:.4f} at step {step} (threshold {threshold:g}, margin {threshold / r:.2f}x)")
    return 0


def main():
    mode, path = sys.argv[1], sys.argv[2]
    F, G, W = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    if mode == "check":
        sys.exit(check(path, F, G, W, int(sys.argv[6])))
    if mode == "margin":
        sys.exit(margin(path, F, G, W))
    sys.exit("usage: spike_reference.py check LOG F G W N | margin LOG F G W")


if __name__ == "__main__":
    main()
