#!/usr/bin/env python3
"""Checks the documentation (README.md and docs/*.md) against itself; test_docs.sh runs it.

  docs_check.py static ROOT       the README's length, every relative link and #anchor (in
                                  the folders' pointer READMEs too), every docs page linked
                                  from the README, no paragraph explained twice, every
                                  shell block marked, every section in its page's contents
                                  line; one line per problem, exit 1 if any
  docs_check.py summary ROOT      per page: its blocks by kind (runnable, output, not
                                  runnable by reason, text)
  docs_check.py plan FILE DIR     FILE's runnable and output blocks in document order:
                                  DIR/NN.sh (runnable) or DIR/NN.cmd + DIR/NN.txt (output),
                                  and DIR/NN.kind: run, run-pypi, exact or approx
  docs_check.py compare WANT GOT  an `output approx:` block against what its command printed

Markers, each on the line right before a fenced block:
  <!-- runnable -->               a shell script that runs as written (test_docs.sh runs it)
  <!-- runnable: pypi -->         the same, needing the pinned transformers
                                  (scripts/install_hf_client.sh): SKIPPED only where PyPI
                                  cannot be reached outside CI
  <!-- output: COMMAND -->        the block is COMMAND's exact standard output
  <!-- output approx: COMMAND --> the same, numbers within 0.1% (float rounding of another
                                  CPU's kernels), times and rates (N ms, N tok/s, ms:N) any
  <!-- not runnable: REASON -->   a command that cannot run in the suite; REASON starts with
                                  one of NOT_RUNNABLE_REASONS
A fenced block whose info string names a language other than a shell's (text, c, json,
python) is no command; any other block needs a marker.
"""
import os
import re
import sys

README_MAX_LINES = 350
SHINGLE = 8          # words per shingle
MIN_WORDS = 25       # paragraphs shorter than this are not compared
OVERLAP = 0.4        # shared shingles / the smaller paragraph's: above this, explained twice
SHARED_RUN = 30      # or this many shared shingles, whatever the paragraphs' lengths

FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
MARKER = re.compile(r"^<!--\s*(runnable(?::\s*(pypi))?|output( approx)?:\s*(.+?)|not runnable:\s*(.+?))\s*-->\s*$")
SHELL_INFO = ("", "sh", "bash", "shell", "console")
# Why a command cannot run in the suite: it needs a GPU, the network, a Slurm cluster or
# several hosts reached over ssh; it is the suite or one of its steps; or it runs for minutes
# (the suite's blocks are small runs).
NOT_RUNNABLE_REASONS = ("GPU", "network", "Slurm", "hosts", "the suite", "long")
APPROX_REL = 1e-3
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def doc_files(root):
    docs = sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    return ["README.md"] + docs


def other_readmes(root):
    """The pointer READMEs in the tree's folders: their links are checked too."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in ("build", "data", "out", "__pycache__"))
        if "README.md" in files and os.path.relpath(d, root) != ".":
            out.append(os.path.relpath(os.path.join(d, "README.md"), root))
    return out


def strip_code(lines):
    """Yields (line number, text) outside fenced blocks; inline code is kept."""
    fenced = False
    for i, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(lines):
    seen = {}
    out = set()
    for _, line in strip_code(lines):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def check_links(root, files, problems):
    cache = {}

    def anchors_of(path):
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = anchors(f.read().split("\n"))
        return cache[path]

    for rel in files:
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for n, line in strip_code(lines):
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...
                    continue
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(dest):
                    problems.append(f"{rel}:{n}: broken link {target}: no {os.path.relpath(dest, root)}")
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors_of(dest):
                    problems.append(f"{rel}:{n}: broken link {target}: no heading #{anchor} in {os.path.relpath(dest, root)}")


def check_readme(root, files, problems):
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        text = f.read()
    n = text.count("\n")
    if n > README_MAX_LINES:
        problems.append(f"README.md: {n} lines, more than {README_MAX_LINES}")
    linked = {os.path.normpath(t.partition("#")[0]) for t in LINK.findall(text)}
    for rel in files[1:]:
        if rel not in linked:
            problems.append(f"README.md: does not link {rel}")


def check_contents(root, files, problems):
    """A page with a "Contents:" line lists every one of its ## sections there."""
    for rel in files:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            text = f.read()
        m = re.search(r"^Contents:(.*?)\n\n", text, re.S | re.M)
        if not m:
            continue
        listed = {t.partition("#")[2] for t in LINK.findall(m.group(1))}
        for n, line in strip_code(text.split("\n")):
            if line.startswith("## ") and slug(line[3:]) not in listed:
                problems.append(f"{rel}:{n}: section '{line[3:].strip()}' is missing from the page's contents line")


def paragraphs(rel, lines):
    """Blocks of prose: paragraphs, list items and table rows, outside code blocks."""
    blocks, cur, start = [], [], 0

    def flush():
        if cur:
            blocks.append((rel, start, " ".join(cur)))
            cur.clear()

    for n, line in strip_code(lines):
        s = line.strip()
        if not s or s.startswith("#") or s.startswith("<!--"):
            flush()
            continue
        item = re.match(r"^([-*]|\d+\.)\s", s) or s.startswith("|")
        if item or not cur:
            flush()
            start = n
        cur.append(s)
        if s.startswith("|"):
            flush()
    flush()
    return blocks


def words(text):
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets are not prose
    return re.findall(r"[a-z0-9_]+(?:[.'-][a-z0-9_]+)*", text.lower())


def check_duplicates(root, files, problems):
    blocks = []
    for rel in files:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            blocks.extend(paragraphs(rel, f.read().split("\n")))
    shingles = []
    index = {}
    for b, (_, _, text) in enumerate(blocks):
        w = words(text)
        s = {" ".join(w[i:i + SHINGLE]) for i in range(len(w) - SHINGLE + 1)} if len(w) >= MIN_WORDS else set()
        shingles.append(s)
        for sh in s:
            index.setdefault(sh, []).append(b)
    shared = {}
    for owners in index.values():
        for i in range(len(owners)):
            for j in range(i + 1, len(owners)):
                if owners[i] != owners[j]:
                    key = (owners[i], owners[j])
                    shared[key] = shared.get(key, 0) + 1
    for (a, b), n in sorted(shared.items()):
        ratio = n / min(len(shingles[a]), len(shingles[b]))
        if ratio > OVERLAP or n >= SHARED_RUN:
            (fa, la, ta), (fb, lb, _) = blocks[a], blocks[b]
            problems.append(f"{fa}:{la} and {fb}:{lb}: the same text twice ({n} shared {SHINGLE}-word runs, "
                            f"{ratio:.0%} of the shorter): \"{ta[:70]}...\"")


def fenced_blocks(path):
    """(line, info string, marker match or None, body) for every fenced block of a file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
        out.append((i + 1, m.group(2).lower(), marker, "\n".join(lines[i + 1:j]) + "\n"))
        i = j + 1
    return out


def block_kind(info, marker):
    """run, run-pypi, exact, approx, not runnable, text; or None for an unmarked shell block."""
    if marker:
        if marker.group(1).startswith("runnable"):
            return "run-pypi" if marker.group(2) else "run"
        if marker.group(1).startswith("output"):
            return "approx" if marker.group(3) else "exact"
        return "not runnable"
    return None if info in SHELL_INFO else "text"


def check_blocks(root, files, problems):
    for rel in files:
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for n, line in enumerate(lines, 1):  # a marker must sit on a block
            if MARKER.match(line.strip()) and not (n < len(lines) and FENCE.match(lines[n])):
                problems.append(f"{rel}:{n}: a marker must be followed by a fenced block")
        for n, info, marker, _ in fenced_blocks(path):
            kind = block_kind(info, marker)
            if kind is None:
                problems.append(f"{rel}:{n}: a shell block without a marker (runnable, output: COMMAND, not "
                                f"runnable: REASON), or an info string such as text if it is no command")
            elif kind == "not runnable" and not marker.group(5).startswith(NOT_RUNNABLE_REASONS):
                problems.append(f"{rel}:{n}: 'not runnable: {marker.group(5)}': the reason must start with one of "
                                f"{', '.join(NOT_RUNNABLE_REASONS)}")


def summary(root):
    total = {}
    for rel in doc_files(root):
        counts, reasons = {}, {}
        for _, info, marker, _ in fenced_blocks(os.path.join(root, rel)):
            kind = block_kind(info, marker) or "unmarked"
            kind = "runnable" if kind.startswith("run") else "output" if kind in ("exact", "approx") else kind
            counts[kind] = counts.get(kind, 0) + 1
            total[kind] = total.get(kind, 0) + 1
            if kind == "not runnable":
                reason = next(r for r in NOT_RUNNABLE_REASONS if marker.group(5).startswith(r))
                reasons[reason] = reasons.get(reason, 0) + 1
        why = f" ({', '.join(f'{r} {k}' for r, k in sorted(reasons.items()))})" if reasons else ""
        print(f"{rel}: {counts.get('runnable', 0)} runnable, {counts.get('output', 0)} output, "
              f"{counts.get('not runnable', 0)} not runnable{why}, {counts.get('text', 0)} text"
              + (f", {counts['unmarked']} unmarked" if "unmarked" in counts else ""))
    print(f"all pages: {total.get('runnable', 0)} runnable, {total.get('output', 0)} output, "
          f"{total.get('not runnable', 0)} not runnable, {total.get('text', 0)} text")


def plan(path, out_dir):
    n = 0
    for _, info, marker, body in fenced_blocks(path):
        kind = block_kind(info, marker)
        if kind not in ("run", "run-pypi", "exact", "approx"):
            continue
        n += 1
        stem = os.path.join(out_dir, f"{n:02d}")
        with open(stem + ".kind", "w") as f:
            f.write(kind + "\n")
        if kind.startswith("run"):
            with open(stem + ".sh", "w") as f:
                f.write(body)
        else:
            with open(stem + ".cmd", "w") as f:
                f.write(marker.group(4) + "\n")
            with open(stem + ".txt", "w") as f:
                f.write(body)
    return n


TIMING = (re.compile(r"\bms:[0-9][0-9.]*"), re.compile(r"(?<![\w.:+-])[0-9][0-9.]* (ms|tok/s)(?![\w:])"))
NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def approx_equal(want, got):
    """Line by line: the same text once times and rates are blanked, every number within
    APPROX_REL of the block's (relative, or absolute below 1). -> (ok, first difference)."""
    a, b = want.rstrip("\n").split("\n"), got.rstrip("\n").split("\n")
    if len(a) != len(b):
        return False, f"{len(a)} lines in the block, {len(b)} printed"
    for x, y in zip(a, b):
        for t in TIMING:
            x, y = t.sub("TIME", x), t.sub("TIME", y)
        if NUMBER.sub("N", x) != NUMBER.sub("N", y):
            return False, f"block: {x!r}\n  printed: {y!r}"
        for u, v in zip(NUMBER.finditer(x), NUMBER.finditer(y)):
            p, q = float(u.group(0)), float(v.group(0))
            if abs(p - q) > APPROX_REL * max(1.0, abs(p)):
                return False, f"{u.group(0)} in the block, {v.group(0)} printed: {x!r}"
    return True, ""


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "static":
        root = sys.argv[2]
        files = doc_files(root)
        problems = []
        check_readme(root, files, problems)
        check_links(root, files + other_readmes(root), problems)
        check_duplicates(root, files, problems)
        check_blocks(root, files, problems)
        check_contents(root, files, problems)
        for p in problems:
            print(p)
        print(f"docs_check: {len(files)} files, {len(problems)} problems")
        return 1 if problems else 0
    if len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "plan":
        print(plan(sys.argv[2], sys.argv[3]))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        with open(sys.argv[2]) as f, open(sys.argv[3]) as g:
            ok, why = approx_equal(f.read(), g.read())
        if not ok:
            print(why)
        return 0 if ok else 1
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
