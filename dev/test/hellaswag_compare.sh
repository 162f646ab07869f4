#!/usr/bin/env bash
# hellaswag_compare.sh A B TOL [MIN_ITEMS]: two eval dumps (--hellaswag-dump or
# hellaswag_oracle.py's, lines "k index label predicted loss0 loss1 loss2 loss3") agree:
# the same items, the first four fields equal, every loss within TOL (absolute), and at
# least MIN_ITEMS items (default 1). Prints one line; exits 1 on any difference.
set -u
[ $# -ge 3 ] || { echo "usage: $0 A B TOL [MIN_ITEMS]" >&2; exit 2; }
[ -s "$1" ] && [ -s "$2" ] || { echo "missing or empty dump: $1 or $2"; exit 1; }
[ "$(wc -l <"$1")" = "$(wc -l <"$2")" ] || { echo "$1 has $(wc -l <"$1") items, $2 has $(wc -l <"$2")"; exit 1; }
paste -d ' ' "$1" "$2" | awk -v tol="$3" -v min="${4:-1}" '
    { n++
      for (i = 1; i <= 4; i++) if ($i != $(i + 8)) { print "item " $1 ": field " i " is " $i " against " $(i + 8); bad = 1 }
      for (i = 5; i <= 8; i++) { d = $i - $(i + 8); if (d < 0) d = -d; if (d > m) m = d } }
    END { if (n < min) { print n " items, fewer than " min; bad = 1 }
          if (m > tol) { print "largest loss difference " m " exceeds " tol; bad = 1 }
          if (!bad) printf "%d items: predictions equal, losses within %.1e (tolerance %g)\n", n, m, tol
          exit bad }'
