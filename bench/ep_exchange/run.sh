#!/usr/bin/env bash
# The expert exchange with and without its host wait per MoE layer ([parallelism]
# expert_exchange = synced | padded, moe/padded_exchange.h), in one invocation: the DeepSeek-V3 debug
# model (local batch 4 × seq 128 per rank, 12 steps, step 12 profiled) on FSDP 2 + EP 2 and
# FSDP 4 + EP 4, each exchange at capacity factor 3 (so that the padded one fits). Prints per
# run: the mean step time over steps 3-12 (from the step lines' tokens/s: the same steps for
# both), the step graph's span in rank 0's trace of step 12, the steps the padded exchange redid
# synced, and the loss of step 12 (equal in both modes).
# Usage: [DEVICE=cpu|cuda] [WRAP=scripts/share_gpu_rank.sh] bench/ep_exchange/run.sh BUILD_DIR OUT
set -euo pipefail
BUILD=${1:?usage: run.sh BUILD_DIR OUT}
OUT=${2:?usage: run.sh BUILD_DIR OUT}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEVICE=${DEVICE:-cpu}
WRAP=${WRAP:-}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
ARGS=(--config "$ROOT/configs/deepseek_v3_debug.toml" --job.device "$DEVICE" --training.steps 12
      --metrics.log_freq 1 --profiling.enable_profiling true --profiling.profile_freq 12
      --parallelism.expert_capacity_factor 3)
# GPU images have no fortunes corpus: there the text dataset reads a file of the checkout.
[ "$DEVICE" = cuda ] && ARGS+=(--training.dataset text --training.dataset_path "$ROOT/ARCHITECTURE.md")
printf '%-14s %-7s %12s %14s %8s %10s\n' layout mode "step (3-12)" "span step 12" replays "loss 12"
for layout in "fsdp2_ep2 2" "fsdp4_ep4 4"; do
  read -r name np <<< "$layout"
  ep=${name#*_ep}
  for mode in synced padded; do
    dir="$OUT/${name}_$mode"
    rm -rf "$dir"
    mpirun --oversubscribe --bind-to none -np "$np" $WRAP "$BUILD/meshtrain" train "${ARGS[@]}" \
      --parallelism.data_parallel_shard_degree "$np" --parallelism.expert_parallel_degree "$ep" \
      --parallelism.expert_exchange "$mode" --job.dump_folder "$dir" > "$dir.log" 2>&1 ||
      { echo "$name $mode failed: $dir.log"; tail -5 "$dir.log"; continue; }
    # tokens/s per rank of each step line -> seconds per step (local batch 4 × 128 tokens).
    step_ms=$(awk '/^step:/ {s = $2 + 0; for (i = 1; i <= NF; ++i) if ($i == "tps:") {
                 t = $(i + 1); gsub(",", "", t); if (s >= 3) { sum += 512 / t; n++ } } }
               END { if (n) printf "%.1f ms", 1000 * sum / n; else print "-" }' "$dir.log")
    trace=$(find "$dir" -path '*iteration_12*' -name 'rank0_trace.json' | head -1)
    span=$([ -n "$trace" ] && python3 "$ROOT/bench/cost/trace_stats.py" "$trace" | tail -1 |
           awk '{print $3 " ms"}' || echo -)
    replays=$(grep -c "redoing the step with the synced exchange" "$dir.log" || true)
    loss=$(awk '/^step:/ && $2 == 12 {print $4}' "$dir.log")
    printf '%-14s %-7s %12s %14s %8s %10s\n' "$name" "$mode" "$step_ms" "$span" "$replays" "$loss"
  done
done
