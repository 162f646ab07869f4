#!/usr/bin/env bash
# test: timeout=60 lane=cpu tier=fast
# The docs test's static checks alone (docs_check.py static: links, anchors, markers, no
# paragraph said twice); the full tier's docs script runs them with the pages' blocks.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
check "docs_check.py static ." python3 dev/test/docs_check.py static .
done_testing
