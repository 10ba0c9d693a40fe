#!/usr/bin/env bash
# bench/checkpoint/run.sh [OUT_DIR]: the cost of a checkpoint save on the DeepSeek-V3 16B 4-layer
# bench model (configs/bench_deepseek_v3_16b_4l.toml, one GPU), async and then synchronous: each
# run trains 14 steps, saves the full training state (fp32 masters and AdamW moments) at step 10
# and the model-only bf16 export at step 14, and the trainer's own log lines carry the figures:
#   checkpoint: step 10 saved to ... (async), snapshot S s (stall), write W s, B GB at R GB/s; ...
# (stall = the step loop's wait for the device-to-host snapshot; write = the slowest rank's file
# writing, fsync included; R = bytes / write). The step times around step 10 show what the step
# loop paid. BUILD (default build-cuda) is a CUDA build; MT_ARGS adds meshtrain overrides. Each
# full save is ~12 bytes per parameter on disk: the folder is removed after each mode.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-outputs/bench_checkpoint}
BUILD=${BUILD:-build-cuda}
mkdir -p "$OUT"
if [ -z "${MT_ARGS:-}" ] && [ ! -d /usr/share/games/fortunes ]; then
  # The config reads fortunes; a GPU machine without the Debian package gets random tokens
  # (llm.c's token file: a 256 × int32 header, uint16 tokens). The save cost does not depend on them.
  python3 bench/random_tokens.py "$OUT/random_tokens.bin" $((4 * 4097 * 32))
  MT_ARGS="--training.dataset tokens --training.dataset_path $OUT/random_tokens.bin"
fi
for mode in async disabled; do
  dump="$OUT/$mode"
  rm -rf "$dump"
  echo "== async_mode $mode"
  "$BUILD/meshtrain" train --config configs/bench_deepseek_v3_16b_4l.toml --job.dump_folder "$dump" \
    --training.steps 14 --profiling.enable_profiling false --metrics.log_freq 1 \
    --checkpoint.enable true --checkpoint.interval 10 --checkpoint.async_mode "$mode" \
    --checkpoint.last_save_model_only true --checkpoint.export_dtype bfloat16 \
    ${MT_ARGS:-} > "$OUT/$mode.log" 2>&1 || { tail -5 "$OUT/$mode.log"; continue; }
  grep -E '^parameters:|^checkpoint:|^step: +(9|10|11|12|14) ' "$OUT/$mode.log"
  du -sh "$dump/checkpoint"/step-* 2>/dev/null
  rm -rf "$dump/checkpoint"
done
