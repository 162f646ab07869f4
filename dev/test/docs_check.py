#!/usr/bin/env python3
"""Checks the documentation (README.md and docs/*.md) against itself; test_docs.sh runs it.

  docs_check.py static ROOT       the README's length, every relative link and #anchor (in
                                  the folders' pointer READMEs too), every docs page linked
                                  from the README, no paragraph explained twice; one line
                                  per problem, exit 1 if any
  docs_check.py blocks FILE DIR   writes FILE's runnable blocks to DIR/block_NN.sh
  docs_check.py outputs FILE DIR  writes FILE's verbatim-output blocks to DIR/output_NN.cmd
                                  and DIR/output_NN.txt

Markers, each on the line right before a fenced block:
  <!-- runnable -->            the block is a shell script the quick start means to be run
  <!-- output: COMMAND -->     the block is COMMAND's exact standard output
"""
import os
import re
import sys

README_MAX_LINES = 350
SHINGLE = 8          # words per shingle
MIN_WORDS = 25       # paragraphs shorter than this are not compared
OVERLAP = 0.4        # shared shingles / the smaller paragraph's: above this, explained twice
SHARED_RUN = 30      # or this many shared shingles, whatever the paragraphs' lengths

FENCE = re.compile(r"^\s*(```|~~~)")
MARKER = re.compile(r"^<!--\s*(runnable|output:\s*(.+?))\s*-->\s*$")
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


def marked_blocks(path, kind):
    """(marker argument, block text) for each fenced block right after a marker of kind."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        if m and i + 1 < len(lines) and FENCE.match(lines[i + 1]):
            is_output = m.group(1).startswith("output:")
            j = i + 2
            body = []
            while j < len(lines) and not FENCE.match(lines[j]):
                body.append(lines[j])
                j += 1
            if (kind == "output") == is_output:
                out.append((m.group(2), "\n".join(body) + "\n"))
            i = j + 1
            continue
        if m:
            sys.exit(f"{path}:{i + 1}: a marker must be followed by a fenced block")
        i += 1
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "static":
        root = sys.argv[2]
        files = doc_files(root)
        problems = []
        check_readme(root, files, problems)
        check_links(root, files + other_readmes(root), problems)
        check_duplicates(root, files, problems)
        for p in problems:
            print(p)
        print(f"docs_check: {len(files)} files, {len(problems)} problems")
        return 1 if problems else 0
    if len(sys.argv) == 4 and sys.argv[1] in ("blocks", "outputs"):
        kind = "runnable" if sys.argv[1] == "blocks" else "output"
        found = marked_blocks(sys.argv[2], kind)
        for n, (arg, body) in enumerate(found, 1):
            stem = os.path.join(sys.argv[3], f"{'block' if kind == 'runnable' else 'output'}_{n:02d}")
            if kind == "runnable":
                with open(stem + ".sh", "w") as f:
                    f.write(body)
            else:
                with open(stem + ".cmd", "w") as f:
                    f.write(arg + "\n")
                with open(stem + ".txt", "w") as f:
                    f.write(body)
        print(len(found))
        return 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
