"""Checks the trainers' TensorBoard event files with TensorBoard's own reader.

    tensorboard_check.py LOGDIR MAIN_LOG [--files N]
    tensorboard_check.py --records FILE


Loads LOGDIR with the real `tensorboard` package's EventAccumulator (on PYTHONPATH:
dev/test/tensorboard_peer.sh) and compares every scalar it shows with main.log, parsed here
on its own with its own key -> tag map (docs/formats.md): the same (tag, step) pairs, each
step once per tag (a resumed run's repeated steps dropped), and the same values to the
precision main.log prints them at. --files N: LOGDIR holds N event files (one per run
segment). Prints one summary line; exit 1 with the differences.
--records FILE: walks FILE's TFRecord framing itself, each masked CRC32C checked with
dev/test/crc32c_reference.py's bitwise CRC: prints the number of whole records; exit 1 when
a CRC is wrong or the file does not end at a record's end (a cut record).
"""
import argparse
import collections
import decimal
import glob
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crc32c_reference import crc32c_bitwise  # noqa: E402


def masked_crc(data):
    c = crc32c_bitwise(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def walk_records(path):
    data, at, n = open(path, "rb").read(), 0, 0
    while at < len(data):
        if len(data) - at < 16:
            return n, f"{len(data) - at} bytes after record {n}: a cut record"
        length, length_crc = struct.unpack_from("<QI", data, at)
        if length_crc != masked_crc(data[at:at + 8]) or at + 16 + length > len(data):
            return n, f"record {n + 1} at byte {at}: bad length or a cut record"
        body = data[at + 12:at + 12 + length]
        if struct.unpack_from("<I", data, at + 12 + length)[0] != masked_crc(body):
            return n, f"record {n + 1} at byte {at}: wrong data CRC"
        at, n = at + 16 + length, n + 1
    return n, None

# main.log's train-line keys -> tags; "slow" and the busy_ms line's fields are split below.
TRAIN_TAGS = {"trl": "train/loss", "norm": "train/grad_norm", "lr": "train/lr", "ms": "train/step_ms",
              "tps": "perf/tokens_per_s", "mfu": "perf/mfu_percent", "comm": "perf/comm_wait_ms",
              "mem": "memory/host_peak_mib", "gmem": "memory/device_peak_mib"}
AT_STEP_TAGS = {"tel": "val/loss", "eval": "eval/hellaswag"}
SPREAD = {"busy_ms": ("straggler/busy_ms", "straggler/busy_max_rank"),
          "comm_ms": ("straggler/comm_ms", "straggler/comm_max_rank")}


def half_unit(text):
    """Half a unit in the last digit main.log printed: how far the exact value may be."""
    return decimal.Decimal(5).scaleb(decimal.Decimal(text).as_tuple().exponent - 1)


def parse_main_log(path):
    """{(tag, step): printed text}; a pair logged twice is an error."""
    expected, errors, skipped, train_steps = {}, [], set(), set()

    def put(tag, step, text):
        if (tag, step) in expected:
            errors.append(f"main.log: {tag} at step {step} twice")
        expected[(tag, step)] = text

    for line in open(path):
        words = line.split()
        step = int(words[0][2:])
        fields = dict(w.split(":", 1) for w in words[1:] if ":" in w)
        if "trl" in fields:
            train_steps.add(step)
            for key, tag in TRAIN_TAGS.items():
                if key in fields:
                    put(tag, step, fields[key])
            ms, rank = fields["slow"].split("@")
            put("straggler/slowest_busy_ms", step, ms)
            put("straggler/slowest_rank", step, rank)
        elif "skp" in fields:
            skipped.add(step)
        elif "busy_ms" in fields:
            for key, (prefix, rank_tag) in SPREAD.items():
                values, rank = fields[key].split("@")
                for name, text in zip(("min", "median", "max"), values.split("/")):
                    put(f"{prefix}_{name}", step, text)
                put(rank_tag, step, rank)
        for key, tag in AT_STEP_TAGS.items():
            if key in fields:
                put(tag, step, fields[key])
    for step in train_steps:
        put("train/skipped", step, "1" if step in skipped else "0")
    return expected, errors


def main():
    if sys.argv[1:2] == ["--records"]:
        n, problem = walk_records(sys.argv[2])
        print(f"{n} whole records" + (f"; {problem}" if problem else ""))
        sys.exit(1 if problem else 0)
    from tensorboard.backend.event_processing import event_accumulator
    ap = argparse.ArgumentParser()
    ap.add_argument("logdir")
    ap.add_argument("main_log")
    ap.add_argument("--files", type=int)
    a = ap.parse_args()
    expected, errors = parse_main_log(a.main_log)
    files = sorted(glob.glob(os.path.join(a.logdir, "events.out.tfevents.*")))
    if a.files is not None and len(files) != a.files:
        errors.append(f"{len(files)} event files, expected {a.files}: {[os.path.basename(f) for f in files]}")
    acc = event_accumulator.EventAccumulator(a.logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    if acc.file_version != 2.0:
        errors.append(f"file_version {acc.file_version}, expected 2 (brain.Event:2)")
    shown = {}
    for tag in acc.Tags()["scalars"]:
        counts = collections.Counter(e.step for e in acc.Scalars(tag))
        for step, n in counts.items():
            if n > 1:
                errors.append(f"TensorBoard shows {tag} at step {step} {n} times")
        for e in acc.Scalars(tag):
            shown[(tag, e.step)] = e.value
    for key in sorted(set(expected) - set(shown)):
        errors.append(f"in main.log, not in TensorBoard: {key[0]} at step {key[1]}")
    for key in sorted(set(shown) - set(expected)):
        errors.append(f"in TensorBoard, not in main.log: {key[0]} at step {key[1]}")
    for key in sorted(set(shown) & set(expected)):
        text, value = expected[key], shown[key]
        tol = float(half_unit(text)) + 1e-6 * abs(float(text))  # the log's rounding, then float32's
        if abs(value - float(text)) > tol:
            errors.append(f"{key[0]} at step {key[1]}: TensorBoard {value!r}, main.log {text}")
    tags = {k[0] for k in expected}
    print(f"{len(shown)} scalars of {len(tags)} tags in {len(files)} event files; main.log has {len(expected)}")
    for e in errors[:20]:
        print("  " + e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
