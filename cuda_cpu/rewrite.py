#!/usr/bin/env python3
"""cuda_cpu/rewrite.py: the build-time rewrite that lets g++ compile CUDA sources.

    rewrite.py OUT_DIR FILE...     writes OUT_DIR/FILE for each FILE (only when it changed)

Two constructs of CUDA C++ are not C++ and are rewritten, on the same lines (so every
line number stays; a `#line 1 "FILE"` at the top makes g++ name the original file):

  k<<<grid, block, shmem, stream>>>(args)
      -> cudacpu_kernel(k, "k", __FILE__, __LINE__).config(grid, block, shmem, stream).launch(args)
  __shared__ T a[8][33], b[8][33];
      -> static thread_local T a__cudacpu_storage[8][33], b__cudacpu_storage[8][33];
         auto& a = *CUDA_CPU_SHARED_VIEW(&a__cudacpu_storage); cudacpu::shared_declared(&a, sizeof(a), "a"); ...
  extern __shared__ T buf[];
      -> T* buf = (T*)cudacpu::dynamic_shared();

  #pragma unroll [N]
      -> CUDA_CPU_UNROLL / CUDA_CPU_UNROLL_N(N): nothing (g++ ignored it before), but a
         request to unroll in builds with the layer's tools, so that their model of a
         thread's local memory sees nvcc's unrolling (cuda_cpu/cuda_cpu.h)

Comments and string literals are never rewritten. Everything else is left alone: the
rest of CUDA C++ compiles as C++ with cuda_cpu/cuda_cpu.h force-included.
"""
import os
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def code_mask(text):
    """The text with comments and string/char literals blanked (same length, newlines kept)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if text[k] != "\n":
                    out[k] = " "
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                if text[k] != "\n":
                    out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def kernel_name_start(mask, lt):
    """Start of the kernel expression ending right before `<<<` at lt (name, ::, <template args>)."""
    i = lt
    while i > 0 and mask[i - 1] in " \t":
        i -= 1
    if i > 0 and mask[i - 1] == ">":  # template arguments: match back to their `<`
        depth, i = 0, i - 1
        while i >= 0:
            if mask[i] == ">":
                depth += 1
            elif mask[i] == "<":
                depth -= 1
                if depth == 0:
                    break
            i -= 1
    while i > 0 and (mask[i - 1].isalnum() or mask[i - 1] in "_:"):
        i -= 1
    return i


def config_end(mask, start):
    """Index of the `>>>` closing the launch configuration that starts at start."""
    depth, i = 0, start
    while i < len(mask):
        c = mask[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and mask.startswith(">>>", i):
            return i
        i += 1
    raise SyntaxError("unterminated <<<...>>>")


def split_top(s):
    """s split at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return parts


def shared_replacement(is_extern, body):
    """The text for one `[extern] __shared__ BODY;` declaration (without the `;`)."""
    decls = split_top(body)
    first = decls[0]
    cut = first.find("[")
    head = first if cut < 0 else first[:cut]
    names = IDENT.findall(head)
    if not names:
        raise SyntaxError("cannot read the __shared__ declaration '%s'" % body.strip())
    name = names[-1]
    name_at = head.rfind(name)
    type_text = first[:name_at].strip()
    if is_extern:
        return "%s* %s = (%s*)cudacpu::dynamic_shared()" % (type_text, name, type_text)
    # Each variable's storage gets a name of its own; the kernel's name is a reference to it
    # (through an opaque pointer in builds with the layer's tools: cuda_cpu/tools.h).
    renamed = [first[:name_at] + name + STORAGE + first[name_at + len(name):]]
    all_names = [name]
    for d in decls[1:]:
        m = IDENT.search(d)
        if not m:
            raise SyntaxError("cannot read the __shared__ declaration '%s'" % body.strip())
        all_names.append(m.group(0))
        renamed.append(d[:m.end()] + STORAGE + d[m.end():])
    out = "static thread_local " + ",".join(renamed).strip() + ";"
    for nm in all_names:
        out += " auto& %s = *CUDA_CPU_SHARED_VIEW(&%s%s);" % (nm, nm, STORAGE)
        out += ' cudacpu::shared_declared(&%s, sizeof(%s), "%s");' % (nm, nm, nm)
    return out[:-1] if out.endswith(";") else out


SHARED = re.compile(r"(extern\s+)?__shared__\s+([^;]*);")
UNROLL = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+unroll(?:[ \t]+(\w+))?[ \t]*$", re.M)
STORAGE = "__cudacpu_storage"


def rewrite(text, display_name):
    edits = []  # (start, end, replacement), non-overlapping
    mask = code_mask(text)
    pos = 0
    while True:
        lt = mask.find("<<<", pos)
        if lt < 0:
            break
        start = kernel_name_start(mask, lt)
        name = text[start:lt].strip()
        gt = config_end(mask, lt + 3)
        cfg = text[lt + 3:gt]
        edits.append((start, gt + 3, 'cudacpu_kernel(%s, "%s", __FILE__, __LINE__).config(%s).launch' % (name, name, cfg)))
        pos = gt + 3
    for m in SHARED.finditer(mask):
        body = text[m.start(2):m.end(2)]
        if "\n" in body:
            raise SyntaxError("a __shared__ declaration over several lines is not supported")
        edits.append((m.start(), m.end(), shared_replacement(bool(m.group(1)), body) + ";"))
    for m in UNROLL.finditer(mask):
        n = m.group(1)
        edits.append((m.start(), m.end(), "CUDA_CPU_UNROLL_N(%s)" % n if n else "CUDA_CPU_UNROLL"))
    edits.sort()
    out, last = [], 0
    for s, e, r in edits:
        if s < last:
            raise SyntaxError("overlapping rewrites")
        out.append(text[last:s])
        out.append(r)
        last = e
    out.append(text[last:])
    return '#line 1 "%s"\n' % display_name + "".join(out)


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: rewrite.py OUT_DIR FILE...\n")
        return 2
    out_dir = argv[1]
    for path in argv[2:]:
        text = open(path, encoding="utf-8").read()
        try:
            new = rewrite(text, path)
        except SyntaxError as e:
            sys.stderr.write("%s: error: cuda_cpu rewrite: %s\n" % (path, e))
            return 1
        dest = os.path.join(out_dir, path)
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        old = open(dest, encoding="utf-8").read() if os.path.exists(dest) else None
        if old != new:
            # A temp name of this process's own: make -j runs several of us at once.
            tmp = "%s.%d.tmp" % (dest, os.getpid())
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(new)
            os.replace(tmp, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
