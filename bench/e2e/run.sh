#!/usr/bin/env bash
# bench/e2e/run.sh [OUT_DIR]: on one GPU, meshtrain and every variant of the PyTorch baseline
# (eager and torch.compile, each with bf16 autocast and with bf16 weights over fp32 masters; one
# process per variant, so each starts from an empty GPU) on the same shapes — DeepSeek-V3 16B and
# Llama-3 8B cut to 4 layers, local batch 4 × seq 4096, bf16 — then the side-by-side table and
# meshtrain's per-op breakdown (from its trace). BUILD (default build-cuda) is a CUDA build of meshtrain; STEPS (default 12) per run;
# MT_ARGS: extra meshtrain overrides. By default meshtrain reads a token file of uniform random
# ids written here, the same synthetic data the PyTorch baseline draws: for a MoE model the data
# matters (it decides how evenly tokens route, hence the expert GEMM shapes), so both sides see
# the same kind. MT_ARGS="--training.dataset fortunes" measures on real text instead.
# BASELINE=0 skips the PyTorch runs (meshtrain's rows and breakdown only, for quick iterations);
# TORCH_VARIANTS (default "eager compile eager-bf16 compile-bf16") picks the PyTorch variants;
# MT_ATTENTION (default "auto") the [model] attention_backend of each meshtrain row, e.g.
# "auto meshtrain" for cuDNN's fused attention beside meshtrain's own kernels. The
# table's baseline row (*) is the fastest PyTorch variant; peak memory and its parts per row.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-outputs/bench_e2e}
BUILD=${BUILD:-build-cuda}
STEPS=${STEPS:-12}
FLAVORS=${FLAVORS:-"deepseek_v3_16b llama3_8b"}
TORCH_VARIANTS=${TORCH_VARIANTS:-"eager compile eager-bf16 compile-bf16"}
MT_ATTENTION=${MT_ATTENTION:-auto}
mkdir -p "$OUT"
: > "$OUT/results.jsonl"
# meshtrain's shared libraries (a carried bundle or `scripts/gpu_test.sh pack` archive in BUILD, the
# CUDA toolkit, Python's nvidia wheels), set for its runs only: PyTorch keeps the caller's.
MT_LD=$(B=$BUILD; . bench/kernels/gpu_libs.sh; gpu_libs_check "$BUILD/meshtrain" >&2
        echo "$LD_LIBRARY_PATH")
if [ -z "${MT_ARGS:-}" ]; then
  # llm.c's token file: a 256 × int32 header (magic 20240520, version 1, count), uint16 tokens.
  python3 bench/random_tokens.py "$OUT/random_tokens.bin" $((4 * 4097 * 64))
  MT_ARGS="--training.dataset tokens --training.dataset_path $OUT/random_tokens.bin"
fi
declare -A CONFIG=([deepseek_v3_16b]=configs/bench_deepseek_v3_16b_4l.toml
                   [llama3_8b]=configs/bench_llama3_8b_4l.toml)
for flavor in $FLAVORS; do
 for attn in $MT_ATTENTION; do
  # The first attention backend keeps the plain names (mt_FLAVOR, "meshtrain"); others get a suffix.
  tag=""; system="meshtrain"
  [ "$attn" = "${MT_ATTENTION%% *}" ] || { tag="_attn_$attn"; system="meshtrain (attention $attn)"; }
  dump="$OUT/mt_$flavor$tag"
  echo "== $system $flavor"
  if LD_LIBRARY_PATH="$MT_LD" "$BUILD/meshtrain" train --config "${CONFIG[$flavor]}" --job.dump_folder "$dump" \
       --training.steps "$STEPS" --profiling.profile_freq "$STEPS" --model.attention_backend "$attn" \
       ${MT_ARGS:-} > "$dump.log" 2>&1; then
    python3 bench/e2e/report.py meshtrain "$flavor" "$dump" "$dump.log" "$system" >> "$OUT/results.jsonl"
  else
    tail -3 "$dump.log"
    echo "{\"system\": \"$system\", \"flavor\": \"$flavor\", \"error\": \"see $(basename "$dump").log\"}" >> "$OUT/results.jsonl"
  fi
 done
  [ "${BASELINE:-1}" = 0 ] && continue
  for variant in $TORCH_VARIANTS; do
    echo "== pytorch $flavor $variant"
    row="$OUT/torch_${flavor}_$variant.jsonl"
    python3 bench/e2e/torch_baseline.py --flavor "$flavor" --n-layers 4 --batch 4 --seq-len 4096 \
      --steps 10 --warmup 3 --variants "$variant" > "$row" 2> "$OUT/torch_${flavor}_$variant.err" ||
      tail -3 "$OUT/torch_${flavor}_$variant.err"
    # A process that died without its JSON line (a crash, a kill) still gets a row.
    if grep -q . "$row"; then
      cat "$row" >> "$OUT/results.jsonl"
    else
      echo "{\"system\": \"pytorch $variant\", \"flavor\": \"$flavor\", \"error\": \"no result: see torch_${flavor}_$variant.err\"}" >> "$OUT/results.jsonl"
    fi
  done
done
echo
python3 bench/e2e/report.py table "$OUT/results.jsonl" | tee "$OUT/table.txt"
for flavor in $FLAVORS; do
  trace=$(ls "$OUT"/mt_"$flavor"/profile_traces/iteration_*/rank0_trace.json 2>/dev/null | tail -1)
  [ -n "$trace" ] || continue
  echo
  echo "meshtrain $flavor: per-op time of one step ($trace)"
  python3 bench/e2e/report.py breakdown "$trace" 25 | tee "$OUT/breakdown_$flavor.txt"
done
