#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=fast,full
# Every CPU kernel against naive double references and finite differences
# (dev/test/test_kernels.c, which prints the TAP).
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
exec ./test_kernels
