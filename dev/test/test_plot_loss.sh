#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# scripts/plot_loss.sh on real logs: two short runs of ./train_gpt2 (d2, with validation)
# write main.log files; one log and then both are plotted. Checks: the PNG signature,
# the 960x600 size in its header, a non-trivial file, the points read per log equal the
# log's lines, and (decoding the image) pixels of the first log's colour in both plots
# and of the second log's colour only in the two-log plot. Bad input (a missing, empty or
# loss-free log, an unknown option, no gnuplot) must end with one `error:` line, exit 1,
# and no image written.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

[ -x ./train_gpt2 ] || fatal "./train_gpt2 is built"
command -v gnuplot >/dev/null 2>&1 || fatal "gnuplot is installed (gnuplot-nox)"

# ---- two real logs (8 steps, validation at 0, 4, 8) ------------------------------------
for run in alpha beta; do
    lr=1e-3
    [ $run = beta ] && lr=2e-4
    ./train_gpt2 -e d2 -b 2 -t 32 -x 8 -v 4 -m 2 -s 0 -l $lr -o "$TMP/$run" >"$TMP/$run.stdout" 2>&1 ||
        fatal "the trainer writes run $run" "$TMP/$run.stdout"
done
ntrain=$(grep -c '^s:[0-9]* trl:' "$TMP/alpha/main.log")
nval=$(grep -c '^s:[0-9]* tel:' "$TMP/alpha/main.log")
[ "$ntrain" = 8 ] && [ "$nval" = 3 ] || not_ok "the run logged $ntrain train and $nval val lines, expected 8 and 3"

# png_facts FILE: "width height pixels_of_colour1 pixels_of_colour2", colours 1 and 2 being
# gnuplot's first two line colours (#9400d3, #009e73). A small PNG decoder (RGB, RGBA or
# palette, 8 bits), independent of the plotting tool.
png_facts() {
    $PY - "$1" <<'EOF'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit("not a PNG signature")
pos, idat, info, palette = 8, b"", None, None
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR": info = struct.unpack(">IIBBBBB", body)
    if kind == b"PLTE": palette = [tuple(body[i:i + 3]) for i in range(0, n, 3)]
    if kind == b"IDAT": idat += body
    pos += 12 + n
w, h, depth, ctype, _, _, interlace = info
if depth != 8 or interlace or ctype not in (2, 3, 6):
    sys.exit(f"unsupported PNG: depth {depth} colour type {ctype} interlace {interlace}")
bpp = {2: 3, 3: 1, 6: 4}[ctype]
raw, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
def rgb(line, x):
    return palette[line[x]] if ctype == 3 else tuple(line[x * bpp:x * bpp + 3])
counts = {(0x94, 0x00, 0xd3): 0, (0x00, 0x9e, 0x73): 0}
for line in rows:
    for x in range(w):
        px = rgb(line, x)
        if px in counts: counts[px] += 1
print(w, h, *counts.values())
EOF
}

check_png() {  # check_png FILE LOGS: signature, size, colours for that many logs
    local file=$1 logs=$2 facts bytes
    bytes=$(stat -c %s "$file" 2>/dev/null || echo 0)
    facts=$(png_facts "$file" 2>&1) || { not_ok "$file: $facts"; return; }
    read -r w h c1 c2 <<<"$facts"
    [ "$w" = 960 ] && [ "$h" = 600 ] || not_ok "$file is ${w}x$h, expected 960x600"
    [ "$bytes" -gt 10000 ] || not_ok "$file has only $bytes bytes"
    [ "$c1" -gt 200 ] || not_ok "$file: only $c1 pixels in the first log's colour"
    if [ "$logs" = 1 ]; then
        [ "$c2" = 0 ] || not_ok "$file: one log, but $c2 pixels in the second log's colour"
    else
        [ "$c2" -gt 200 ] || not_ok "$file: two logs, but only $c2 pixels in the second log's colour"
    fi
    ok "$file: PNG ${w}x$h, $bytes bytes, $c1/$c2 pixels in the two logs' colours"
}

# ---- one log, then two --------------------------------------------------------------
if out=$(bash scripts/plot_loss.sh "$TMP/alpha/main.log" -o "$TMP/one.png" 2>&1); then
    grep -q "as 'alpha': $ntrain train points, $nval val points" <<<"$out" &&
        ok "one log: its $ntrain train and $nval val points read" ||
        not_ok "one log: unexpected report: $out"
    check_png "$TMP/one.png" 1
else
    not_ok "plotting one log failed: $out"
fi
if out=$(bash scripts/plot_loss.sh "$TMP/alpha" "$TMP/beta/main.log" -o "$TMP/two.png" 2>&1); then
    [ "$(grep -c "train points, $nval val points" <<<"$out")" = 2 ] && ok "two logs: both read (a directory and a file)" ||
        not_ok "two logs: unexpected report: $out"
    check_png "$TMP/two.png" 2
else
    not_ok "plotting two logs failed: $out"
fi

# ---- bad input ----------------------------------------------------------------------
: >"$TMP/empty.log"
printf 'hello\nstep 1 loss 3.0\n' >"$TMP/noloss.log"
plot_refuses() {  # plot_refuses WHAT KEYWORD [ENV=value...] -- ARGS...
    local what=$1 keyword=$2 envs=()
    shift 2
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    rm -f "$TMP/bad.png"
    local out rc
    out=$(env "${envs[@]}" bash scripts/plot_loss.sh "$@" -o "$TMP/bad.png" 2>&1)
    rc=$?
    if [ $rc = 1 ] && [ "$(grep -c '^plot_loss: error:' <<<"$out")" = 1 ] && grep -q "$keyword" <<<"$out" &&
       [ ! -e "$TMP/bad.png" ] && [ -z "$(ls -A "$TMP" | grep partial)" ]; then
        ok "$what: $(grep 'error:' <<<"$out")"
    else
        not_ok "$what (rc=$rc, image $( [ -e "$TMP/bad.png" ] && echo written || echo absent)): $out"
    fi
}
plot_refuses "missing log" "no such file" -- "$TMP/nothere/main.log"
plot_refuses "empty log" "empty" -- "$TMP/empty.log"
plot_refuses "log without losses" "no loss lines" -- "$TMP/noloss.log"
plot_refuses "a good log next to a missing one" "no such file" -- "$TMP/alpha/main.log" "$TMP/missing.log"
plot_refuses "unknown option" "unknown option" -- "$TMP/alpha/main.log" --width 3
plot_refuses "no gnuplot" "not found" GNUPLOT=/nonexistent/gnuplot -- "$TMP/alpha/main.log"
out=$(bash scripts/plot_loss.sh 2>&1); rc=$?
[ $rc = 1 ] && grep -q "error: no log given" <<<"$out" && ok "no log: $out" || not_ok "no log (rc=$rc): $out"

done_testing
