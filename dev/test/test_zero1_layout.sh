#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=fast,full
# zero1's layout, shards and ledger: hand-worked layouts, invalid arguments and 3,000 random
# configurations (dev/test/test_zero1_layout.c, which prints the TAP).
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
exec ./test_zero1_layout
