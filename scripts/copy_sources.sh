#!/usr/bin/env bash
# scripts/copy_sources.sh DEST: the repository's sources into DEST, for a build that must
# share no object or stamp with this tree (check_cuda_build.sh's FP32 builds, the GPU
# suite's variants, the GPU mutations, check_openmpi5_build.sh, gpu_check.sh).
# In a git work tree: what git tracks or would track (the working tree's state, uncommitted
# changes included), without build/. Outside one (a copy without .git, as a lent GPU
# machine gets): everything but .git, build/, data/, out/, .device/, logs and the build
# stamps (so the copy rebuilds from scratch).
set -euo pipefail
dest=${1:?usage: scripts/copy_sources.sh DEST}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$dest"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    list=$(mktemp)
    git ls-files -co --exclude-standard | grep -v '^build/' | sort >"$list"
    tar -cf - -T "$list" | tar -xf - -C "$dest"
    # Into an earlier copy (an incremental build): a source removed here goes there too, or a
    # wildcard of the Makefile (run/*.c) would build it.
    (cd "$dest" && find . -path ./build -prune -o -type f -path './*/*' \
        \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.sh' -o -name '*.py' \) -print) |
        sed 's#^\./##' | sort | comm -23 - "$list" | (cd "$dest" && xargs -r rm -f --)
    rm -f "$list"
else
    tar -cf - --exclude=./.git --exclude=./build --exclude=./data --exclude=./out --exclude=./.device \
        --exclude='./.build-*.stamp' --exclude='./log*' . | tar -xf - -C "$dest"
fi
