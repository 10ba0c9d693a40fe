#!/usr/bin/env bash
# The step-graph dump, checked for structure: `plan BIN CONFIG ARGS...` runs `meshtrain plan
# --dump-graph` on an FSDP + EP layout; `train BIN CONFIG OUTDIR WORLD ARGS...` trains on WORLD
# local ranks with [job] dump_graph, and OUTDIR/step_graph.txt must equal what `plan --world
# WORLD --rank 0 --dump-graph` prints for the same keys. Both need: a step and an optimizer
# section whose node lines match the node count in their header, FSDP all_gathers and
# reduce_scatters on fsdp in the summary table, recomputed (re-gathered) nodes marked, and the
# summary line; the plan (EP 2) also lists the token exchange on ep.
set -euo pipefail
mode="$1"; bin="$2"; config="$3"; shift 3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; echo "--- dump (first 40 lines):"; head -40 "$out"; exit 1; }

if [ "$mode" = plan ]; then
  "$bin" plan --config "$config" "$@" --dump-graph >"$out" || fail "plan exited $?"
  expect_ep=1
else
  dir="$1"; world="$2"; shift 2
  rm -rf "$dir"
  "$bin" train --config "$config" --nproc "$world" --job.dump_folder "$dir" --job.dump_graph true \
    "$@" >/dev/null 2>&1 || fail "train exited $?"
  [ -f "$dir/step_graph.txt" ] || fail "$dir/step_graph.txt was not written"
  cp "$dir/step_graph.txt" "$out"
  # The plan command shows the graphs the trainer runs.
  "$bin" plan --config "$config" --world "$world" --rank 0 --dump-graph "$@" |
    sed -n '/^== step graph/,$p' | diff -q - "$out" >/dev/null ||
    fail "step_graph.txt differs from plan --dump-graph of the same layout"
  expect_ep=0
fi

# Node lines per section equal the count in the section's header.
awk '
  /^== / { if (title != "") check(); title = $0; want = $0; sub(/.*: /, "", want); sub(/ nodes.*/, "", want); got = 0; next }
  title != "" && /^ +[0-9]+ [ *](forward|backward|recompute|optimizer) / { got++ }
  function check() { if (got != want + 0 || want + 0 == 0) { printf "section \"%s\": %d node lines, header says %s\n", title, got, want; bad = 1 } }
  END { if (title != "") check(); exit bad }
' "$out" || fail "node lines do not match the headers"
grep -q '^== step graph ' "$out" || fail "no step graph section"
grep -q '^== optimizer graph ' "$out" || fail "no optimizer graph section"
grep -qE '^  all_gather +fsdp +[0-9]+ ' "$out" || fail "no all_gather on fsdp in the summary table"
grep -qE '^  reduce_scatter +fsdp +[0-9]+ ' "$out" || fail "no reduce_scatter on fsdp in the summary table"
grep -qE '^summary: [0-9]+ collectives \([0-9]+ all_gather, [0-9]+ reduce_scatter, [0-9]+ all_reduce, [0-9]+ exchange\), ' "$out" ||
  fail "no summary line"
grep -qE '^ +[0-9]+ \*recompute s[0-9]+ +all_gather .*\| all_gather fsdp ' "$out" ||
  fail "no re-gathered (recompute-marked) all_gather on fsdp"
grep -qE ' forward +s[0-9]+ +all_gather +%[0-9]+ float32\[[0-9, ]+\] arena@[0-9]+\+' "$out" ||
  fail "no forward all_gather line with dtype, shape and arena offset"
if [ "$expect_ep" = 1 ]; then
  grep -qE '^  exchange +ep +[0-9]+ ' "$out" || fail "no exchange on ep in the summary table"
  for op in ep_to_experts ep_from_experts; do
    grep -qE " $op +%[0-9]+ .*\| ws arena@[0-9]+\+.*\| exchange ep " "$out" ||
      fail "no $op line with its workspace and the ep group"
  done
fi
echo "ok: $(grep -c '^ *[0-9]* [ *]\(forward\|backward\|recompute\|optimizer\) ' "$out") node lines; $(grep '^summary:' "$out" | head -1)"
