#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# test_multirank.sh's rows on the plugin build with ZeRO-1 (-z 1).
TRAIN_BIN=./train_gpt2 Z=1 exec bash "$(dirname "${BASH_SOURCE[0]}")/test_multirank.sh"
