#!/usr/bin/env bash
# test: timeout=300 lane=alone tier=fast,full
# `make data`: tinyshakespeare tokenized into data/ (docs/data.md).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
check "make data" make data
done_testing
