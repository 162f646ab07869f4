#!/usr/bin/env bash
# test: timeout=60 lane=cpu tier=fast,full
# The house's rules (docs/design.md, "Architecture"), read off the sources:
#   - llmc/ is the model and its kernels: it includes only llmc/ (and system, MPI-free CUDA
#     headers), and no file of it opens a file, reads a flag or the environment, knows a rank
#     or handles a signal;
#   - run/ includes only llmc/, run/ and zero1/layout.h (--bucket-size's parser);
#   - zero1/ and tools/ include no trainer, and no product file includes dev/;
# and a negative control: each rule, shown a planted file that breaks it, reports it.
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

# includes ROOM: "file: included" for every project header a room's files include.
includes() {
    grep -rHo '^#include "[^"]*"' "$1" --include='*.h' --include='*.c' --include='*.cu' --include='*.cuh' \
        --include='*.cpp' | sed 's/:#include "/: /; s/"$//'
}
# What llmc/ must not do: open a file, read the environment or argv, name MPI or a rank, or a signal.
LLMC_FORBIDDEN='fopen|getenv|argv|MPI_|<mpi\.h>|utils_rank|TrainConfig|signal\(|sigaction|raise\('
# violations ROOT: every line of ROOT's files (a tree like the repository's) that breaks a rule.
violations() {
    local root=$1
    (cd "$root" && includes llmc | grep -v ': llmc/')
    (cd "$root" && grep -rnE "$LLMC_FORBIDDEN" llmc | grep -vE ':[0-9]+:\s*(//|\*)')
    (cd "$root" && includes run | grep -vE ': (llmc|run)/|: zero1/layout\.h$')
    (cd "$root" && includes zero1 tools | grep -E ': (train_gpt2|dev/)')
    (cd "$root" && includes llmc run zero1 tools | grep -E ': dev/')
    (cd "$root" && grep -Ho '^#include "dev/[^"]*"' train_gpt2.c train_gpt2.cu)
}

out=$(violations .)
if [ -z "$out" ]; then
    ok "llmc/, run/, zero1/, tools/ and the trainers keep the house's rules"
else
    not_ok "the house's rules are broken:"
    sed 's/^/    | /' <<<"$out"
fi

# The negative control: a copy of the rooms with one planted file per rule.
mkdir -p "$TMP/tree" && cp -r llmc run zero1 tools train_gpt2.c train_gpt2.cu "$TMP/tree/"
printf '#include "run/config.h"\n' >"$TMP/tree/llmc/planted_include.h"
printf 'static int x(void) { return getenv("X") != 0; }\n' >"$TMP/tree/llmc/planted_env.h"
printf '#include "zero1/runtime.h"\n' >"$TMP/tree/run/planted.c"
printf '#include "dev/test/check.h"\n' >"$TMP/tree/zero1/planted.c"
got=$(violations "$TMP/tree")
missing=()
for planted in llmc/planted_include.h llmc/planted_env.h run/planted.c zero1/planted.c; do
    grep -q "^$planted:" <<<"$got" || missing+=("$planted")
done
if [ ${#missing[@]} -eq 0 ]; then
    ok "negative control: the 4 planted violations are reported"
else
    not_ok "negative control: not reported: ${missing[*]}"
fi

done_testing
