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

and each kernel registers what cudaFuncGetAttributes reports and the launch checks, before main:
  template <int N> __global__ void __launch_bounds__(256, 2) k(float* x) { __shared__ float s[N]; ...
      -> ... k(float* x) { (void)::cudacpu::KernelBounds<&k<N>, (256), (2)>::registered; ...
         (the __shared__ rewrite as above) (void)::cudacpu::KernelStaticShared<&k<N>, ID, sizeof(s__cudacpu_storage)>::registered;
     (a static data member of a class template, odr-used in the body: every instantiation's
     initializer runs before main; cuda_cpu/cuda_cpu.h, kernel_attributes.cpp)

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


def shared_declarators(body):
    """Each variable of a `__shared__ BODY;` declaration: (its name, where it ends in its
    declarator, the declarator), the first declarator carrying the type."""
    out = []
    for i, d in enumerate(split_top(body)):
        if i == 0:
            cut = d.find("[")
            head = d if cut < 0 else d[:cut]
            names = IDENT.findall(head)
            at = head.rfind(names[-1]) + len(names[-1]) if names else -1
        else:
            m = IDENT.search(d)
            names, at = ([m.group(0)], m.end()) if m else ([], -1)
        if not names:
            raise SyntaxError("cannot read the __shared__ declaration '%s'" % body.strip())
        out.append((names[-1], at, d))
    return out


def shared_names(body):
    return [name for name, _, _ in shared_declarators(body)]


def shared_replacement(is_extern, body):
    """The text for one `[extern] __shared__ BODY;` declaration (without the `;`)."""
    decls = shared_declarators(body)
    name, end, first = decls[0]
    if is_extern:
        type_text = first[:end - len(name)].strip()
        return "%s* %s = (%s*)cudacpu::dynamic_shared()" % (type_text, name, type_text)
    # Each variable's storage gets a name of its own; the kernel's name is a reference to it
    # (through an opaque pointer in builds with the layer's tools: cuda_cpu/tools.h).
    renamed = [d[:e] + STORAGE + d[e:] for _, e, d in decls]
    all_names = [n for n, _, _ in decls]
    out = "static thread_local " + ",".join(renamed).strip() + ";"
    for nm in all_names:
        out += " auto& %s = *CUDA_CPU_SHARED_VIEW(&%s%s);" % (nm, nm, STORAGE)
        out += ' cudacpu::shared_declared(&%s, sizeof(%s), "%s");' % (nm, nm, nm)
    return out[:-1] if out.endswith(";") else out


def matching(mask, at, opener, closer, step=1):
    """Index of the bracket paired with the one at `at`: forward (step 1) from an opener, or
    back (step -1) from a closer."""
    depth, i = 0, at
    while 0 <= i < len(mask):
        if mask[i] == opener:
            depth += step
        elif mask[i] == closer:
            depth -= step
        if depth == 0:
            return i
        i += step
    raise SyntaxError("unbalanced '%s'" % (opener if step > 0 else closer))


def template_arguments(params):
    """'typename T, int N = 4, class... Ts' -> '<T, N, Ts...>' (the instantiation's own arguments)."""
    args = []
    for p in split_top(params):
        p = p.split("=")[0]
        names = IDENT.findall(p)
        if names:
            args.append(names[-1] + ("..." if "..." in p else ""))
    return "<%s>" % ", ".join(args)


GLOBAL = re.compile(r"\b__global__\b")
BOUNDS = re.compile(r"\b__launch_bounds__\s*\(")


def kernel_definitions(mask):
    """Each __global__ function defined here: (body_open, body_close, pointer, bounds), where pointer
    names this instantiation (&k, or &k<T, N> inside a template) and bounds is the text of its
    __launch_bounds__ arguments (None without them)."""
    out = []
    for g in GLOBAL.finditer(mask):
        # The declaration starts after the previous statement, block or preprocessor line.
        start = max(mask.rfind(c, 0, g.start()) for c in ";{}\n#") + 1
        while True:  # back over whole lines that belong to the declaration (template <...>, static)
            line_start = mask.rfind("\n", 0, start - 1) + 1 if start > 0 else 0
            prev = mask[line_start:start].strip()
            if start == 0 or not prev or prev[-1] in ";{}" or prev.startswith("#"):
                break
            start = line_start
        i = g.end()
        name_end = None
        while i < len(mask):  # the name: the identifier before the first '(' not of an attribute
            if mask[i] == "(":
                before = mask[:i].rstrip()
                word = IDENT.findall(before[-40:])
                if word and before.endswith(word[-1]) and word[-1] in ("__launch_bounds__", "__align__", "__attribute__"):
                    i = matching(mask, i, "(", ")") + 1
                    continue
                name_end = i
                break
            if mask[i] in ";{}":
                break
            i += 1
        if name_end is None:
            continue
        params_close = matching(mask, name_end, "(", ")")
        j = params_close + 1
        while j < len(mask) and mask[j].isspace():
            j += 1
        if j >= len(mask) or mask[j] != "{":
            continue  # a declaration
        head = mask[start:name_end].rstrip()
        explicit = ""
        if head.endswith(">"):  # an explicit specialization: k<float>(...)
            lt = matching(head, len(head) - 1, "<", ">", -1)
            explicit, head = head[lt:], head[:lt].rstrip()
        name = IDENT.findall(head)[-1]
        tmpl = re.match(r"\s*template\s*<", mask[start:g.start()])
        targs = explicit
        if tmpl and not explicit:
            lt = start + tmpl.end() - 1
            targs = template_arguments(mask[lt + 1:matching(mask, lt, "<", ">")])
        b = BOUNDS.search(mask, start, name_end)
        bounds = None
        if b:
            bounds = " ".join(mask[b.end():matching(mask, b.end() - 1, "(", ")")].split())
        out.append((j, matching(mask, j, "{", "}"), "&%s%s" % (name, targs), bounds))
    return out


def kernel_registration(pointer, bounds):
    """The statement at the top of a kernel's body that registers its launch bounds before main
    (cuda_cpu.h: KernelBounds; the launch refuses a block larger than maxThreadsPerBlock)."""
    args = split_top(bounds) if bounds else []
    if len(args) > 3:
        raise SyntaxError("__launch_bounds__ takes at most 3 arguments")
    max_threads = "(%s)" % args[0].strip() if args else "0"
    min_blocks = "(%s)" % args[1].strip() if len(args) > 1 else "0"
    return " (void)::cudacpu::KernelBounds<%s, %s, %s>::registered;" % (pointer, max_threads, min_blocks)


SHARED = re.compile(r"(extern\s+)?__shared__\s+([^;]*);")
UNROLL = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+unroll(?:[ \t]+(\w+))?[ \t]*$", re.M)
STORAGE = "__cudacpu_storage"


def rewrite(text, display_name):
    edits = []  # (start, end, replacement), non-overlapping
    mask = code_mask(text)
    kernels = kernel_definitions(mask)
    for body_open, _, pointer, bounds in kernels:
        edits.append((body_open + 1, body_open + 1, kernel_registration(pointer, bounds)))
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
        replacement = shared_replacement(bool(m.group(1)), body) + ";"
        # A static __shared__ variable in a kernel's own body counts to its sharedSizeBytes
        # before main (cuda_cpu.h: KernelStaticShared); those of __device__ functions as they run.
        kernel = [k for k in kernels if k[0] < m.start() < k[1]]
        if kernel and not m.group(1):
            for name in shared_names(body):
                replacement += " (void)::cudacpu::KernelStaticShared<%s, %du, sizeof(%s%s)>::registered;" % (
                    kernel[0][2], m.start(), name, STORAGE)
        edits.append((m.start(), m.end(), replacement))
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
