#!/usr/bin/env bash
# Proves the layer check can fail. On fresh copies of src/, apps/ and ARCHITECTURE.md it plants
# (1) an upward include, (2) a CUDA-only include in a backend-neutral op file, (3) a layer table
# with ir/ moved below ops/, (4) a forward declaration of a higher layer's type; check_layers.sh
# must exit non-zero and name each violation.
# Usage: check_layers_fails.sh ROOT
set -euo pipefail
root="$1"
check="$root/scripts/check_layers.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fresh_copy() {
  rm -rf "$work/tree"
  mkdir -p "$work/tree"
  cp -r "$root/src" "$root/apps" "$root/ARCHITECTURE.md" "$work/tree/"
}

# expect_failure WHAT EXPECTED_LINE: the check fails on the copy and prints EXPECTED_LINE.
expect_failure() {
  local what="$1" expected="$2" out rc=0
  out=$("$check" "$work/tree" 2>&1) || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "FAIL ($what): the check passed; output:"
    echo "$out"
    exit 1
  fi
  if ! grep -qxF "$expected" <<<"$out"; then
    echo "FAIL ($what): exit $rc but no line '$expected'; output:"
    echo "$out"
    exit 1
  fi
  echo "ok ($what, exit $rc): $expected"
}

plant() {  # plant FILE LINE_TEXT: appends the line, prints its number
  echo "$2" >>"$1"
  wc -l <"$1" | tr -d ' '
}

fresh_copy
n=$(plant "$work/tree/src/meshtrain/core/shape.cpp" '#include "meshtrain/train/trainer.h"')
expect_failure "upward include" \
  "src/meshtrain/core/shape.cpp:$n includes layer train above its own layer core"

fresh_copy
n=$(plant "$work/tree/src/meshtrain/ops/rmsnorm.cpp" '#include "meshtrain/ops/cuda/cuda_workspace.h"')
expect_failure "cuda include" \
  "src/meshtrain/ops/rmsnorm.cpp:$n includes ops/cuda/cuda_workspace.h, built only with CUDA, from a file built without CUDA too"

fresh_copy
# The order comes from the table alone: move the ir/ row below the ops/ rows.
awk '/^\| `ir\/`/ { held = $0; next } { print } /^\| `ops\/`/ { print held }' \
  "$root/ARCHITECTURE.md" >"$work/tree/ARCHITECTURE.md"
first=$(grep -n '#include "meshtrain/ir/' "$work/tree/src/meshtrain/ops/rmsnorm.h" | head -1 | cut -d: -f1)
expect_failure "reordered table" \
  "src/meshtrain/ops/rmsnorm.h:$first includes layer ir above its own layer ops"

fresh_copy
# Reaching upward without an include: core/ names train/'s Trainer.
n=$(plant "$work/tree/src/meshtrain/core/shape.cpp" 'class Trainer;')
expect_failure "forward declaration" \
  "src/meshtrain/core/shape.cpp:$n forward-declares Trainer, defined in layer train above its own layer core"
