#!/usr/bin/env bash
# Draws the training picture: train loss (trl) and validation loss (tel) against the step,
# for one or several main.log files written by the trainers' -o DIR, into one PNG.
#
#   scripts/plot_loss.sh LOG... [-o loss.png] [--title TEXT]
#
# LOG is a main.log or a directory holding one. Each log gets one colour: a solid line
# for its train loss, dashed with points for its validation loss; the legend names it by
# its directory (the full directory path when two would share a name). Prints one line
# per log with what it found. Needs gnuplot (Debian: gnuplot-nox; GNUPLOT=path picks
# another). A missing, empty or loss-free log is an error (exit 1, nothing written).
set -euo pipefail
say() { echo "plot_loss: $*"; }
die() { echo "plot_loss: error: $*" >&2; exit 1; }

out=loss.png
title="train and validation loss"
logs=()
while [ $# -gt 0 ]; do
    case "$1" in
        -o) [ $# -ge 2 ] || die "-o needs a file name"; out=$2; shift 2 ;;
        --title) [ $# -ge 2 ] || die "--title needs a text"; title=$2; shift 2 ;;
        -h | --help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1 (usage: scripts/plot_loss.sh LOG... [-o loss.png] [--title TEXT])" ;;
        *) logs+=("$1"); shift ;;
    esac
done
[ ${#logs[@]} -gt 0 ] || die "no log given (usage: scripts/plot_loss.sh LOG... [-o loss.png] [--title TEXT])"
GNUPLOT=${GNUPLOT:-gnuplot}
command -v "$GNUPLOT" >/dev/null 2>&1 ||
    die "$GNUPLOT not found: install gnuplot (apt-get install gnuplot-nox, or bash scripts/install_deps.sh)"
out_dir=$(dirname "$out")
[ -d "$out_dir" ] || die "the output directory $out_dir does not exist"

work=$(mktemp -d /tmp/plot_loss.XXXXXX)
# The image is written next to $out and renamed when complete: never a half-written PNG.
partial=$out_dir/.$(basename "$out").partial.$$
trap 'rm -rf "$work" "$partial"' EXIT

# "s:12 trl:4.123456 ..." -> "12 4.123456" for kind trl (or tel); other lines are skipped.
series() {
    awk -v kind="$1" '$1 ~ /^s:[0-9]+$/ && index($2, kind ":") == 1 { print substr($1, 3), substr($2, length(kind) + 2) }' "$2"
}
# Gnuplot string literal: single quotes, an inner single quote doubled.
gp_quote() { printf "'%s'" "${1//\'/\'\'}"; }

# Every log: its train and val series as "step loss" files, and its label.
labels=()
dirs=()
for i in "${!logs[@]}"; do
    log=${logs[i]}
    [ -d "$log" ] && log=$log/main.log
    [ -e "$log" ] || die "$log: no such file"
    [ -f "$log" ] && [ -r "$log" ] || die "$log: not a readable file"
    [ -s "$log" ] || die "$log: empty (did the run write any step?)"
    series trl "$log" >"$work/$i.trl"
    series tel "$log" >"$work/$i.tel"
    ntrain=$(wc -l <"$work/$i.trl")
    nval=$(wc -l <"$work/$i.tel")
    [ $((ntrain + nval)) -gt 0 ] || die "$log: no loss lines (expected 's:N trl:LOSS ...' or 's:N tel:LOSS')"
    dir=$(cd "$(dirname "$log")" && pwd)
    dirs+=("$(dirname "$log")")
    labels+=("$(basename "$dir")")
    say "$log as '${labels[i]}': $ntrain train points, $nval val points"
done
# Two logs from directories with the same name: tell them apart by the path.
if [ "$(printf '%s\n' "${labels[@]}" | sort | uniq -d)" != "" ]; then labels=("${dirs[@]}"); fi

# The gnuplot program. pngcairo draws smoother lines; plain png is the fallback.
terminal=png
"$GNUPLOT" -e "set terminal pngcairo" >/dev/null 2>&1 && terminal=pngcairo
{
    echo "set terminal $terminal size 960,600 noenhanced"
    echo "set output $(gp_quote "$partial")"
    echo "set title $(gp_quote "$title")"
    echo "set xlabel 'step'; set ylabel 'loss'; set grid; set key top right"
    plots=()
    for i in "${!labels[@]}"; do
        color=$((i + 1))
        [ -s "$work/$i.trl" ] && plots+=("$(gp_quote "$work/$i.trl") using 1:2 with lines lw 2 lc $color title $(gp_quote "${labels[i]} train")")
        [ -s "$work/$i.tel" ] && plots+=("$(gp_quote "$work/$i.tel") using 1:2 with linespoints dt 2 pt 7 lw 2 lc $color title $(gp_quote "${labels[i]} val")")
    done
    printf 'plot %s' "${plots[0]}"
    for p in "${plots[@]:1}"; do printf ', \\\n     %s' "$p"; done
    echo
} >"$work/plot.gp"
"$GNUPLOT" "$work/plot.gp" 2>"$work/gnuplot.err" || die "gnuplot failed: $(head -c 500 "$work/gnuplot.err")"
[ -s "$partial" ] || die "gnuplot wrote no image"
mv "$partial" "$out"
say "wrote $out (${#logs[@]} log(s))"
