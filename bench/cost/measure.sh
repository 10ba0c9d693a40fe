#!/usr/bin/env bash
# The scheduling measurements (issue 17) on the DeepSeek-V3 debug model, on CPU ranks or on
# ranks sharing one GPU (DEVICE=cuda, WRAP=a per-rank launcher such as scripts/share_gpu_rank.sh):
#  1. fits the cost model's throughput table of the device from a profiled 1-rank run (
#     OUT/<device>_table.txt);
#  2. runs FSDP 2 + EP 2, FSDP 4 + EP 2 and HSDP 2x2 + EP 2 with the scheduling passes on and off,
#     profiled, and prints per layout: collectives per step, the measured step-graph time (trace
#     span, mean over ranks) and what `meshtrain plan` predicts with the fitted table.
# Usage: [DEVICE=cpu|cuda] [WRAP=cmd] bench/cost/measure.sh BUILD_DIR OUT_DIR
# (CPU: 1 OpenBLAS thread per rank)
set -euo pipefail
BUILD=${1:?usage: measure.sh BUILD_DIR OUT_DIR}
OUT=${2:?usage: measure.sh BUILD_DIR OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
MT="$BUILD/meshtrain"
CFG="$ROOT/configs/deepseek_v3_debug.toml"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
DEVICE=${DEVICE:-cpu}
WRAP=${WRAP:-}
TABLE="$OUT/${DEVICE}_table.txt"
mkdir -p "$OUT"
COMMON=(--job.device "$DEVICE" --training.steps 4 --profiling.enable_profiling true --profiling.profile_freq 4
        --metrics.log_freq 4)
# GPU images have no fortunes corpus: there the text dataset reads a file of the checkout.
[ "$DEVICE" = cuda ] && COMMON+=(--training.dataset text --training.dataset_path "$ROOT/ARCHITECTURE.md")

run() {  # name np overrides...
  local name=$1 np=$2
  shift 2
  rm -rf "${OUT:?}/$name"
  if [ "$np" = 1 ]; then
    $WRAP "$MT" train --config "$CFG" "${COMMON[@]}" --job.dump_folder "$OUT/$name" "$@" \
      > "$OUT/$name.log" 2>&1
  else
    mpirun --oversubscribe --bind-to none -np "$np" $WRAP "$MT" train --config "$CFG" "${COMMON[@]}" \
      --job.dump_folder "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  fi
}
traces() { find "$OUT/$1" -path '*iteration_4*' -name 'rank*_trace.json' | sort; }

run calib_1rank 1
echo "== calibration (1 rank)"
python3 "$HERE/trace_stats.py" $(traces calib_1rank) | tail -1
python3 "$HERE/fit_table.py" "$TABLE" \
  "$DEVICE table fitted by bench/cost/measure.sh from a 1-rank DeepSeek-V3 debug run ($(date -u +%F), $(getconf _NPROCESSORS_ONLN) cores, 1 thread)" \
  $(traces calib_1rank)

# Validation on 1 rank at another shape (batch 2 x seq 256: attention's share doubles).
run val_1rank_b2_s256 1 --training.local_batch_size 2 --training.seq_len 256
echo "== 1 rank, local batch 2 x seq 256"
python3 "$HERE/trace_stats.py" $(traces val_1rank_b2_s256) | tail -1
"$MT" plan --config "$CFG" --job.device "$DEVICE" --training.local_batch_size 2 --training.seq_len 256 \
  --cost-table "$TABLE" | grep -E "^  step"

P=--parallelism
for layout in "fsdp2_ep2 2 $P.data_parallel_shard_degree 2 $P.expert_parallel_degree 2" \
              "fsdp4_ep2 4 $P.data_parallel_shard_degree 4 $P.expert_parallel_degree 2" \
              "hsdp2x2_ep2 4 $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2 $P.expert_parallel_degree 2"; do
  read -r name np rest <<< "$layout"
  read -r -a mesh <<< "$rest"
  for passes in transformer_block_bucketing none; do
    run "${name}_$passes" "$np" "${mesh[@]}" --compile.graph_passes "$passes"
    echo "== $name, graph_passes $passes ($np ranks)"
    python3 "$HERE/trace_stats.py" $(traces "${name}_$passes") | tail -1
    "$MT" plan --config "$CFG" --job.device "$DEVICE" "${mesh[@]}" --compile.graph_passes "$passes" \
      --cost-table "$TABLE" --dump-graph > "$OUT/${name}_${passes}.plan"
    grep -E "^  step|^  compute|^  communication|scheduling" "$OUT/${name}_${passes}.plan"
    awk '/^summary:/ && !s {print "step graph " $0; s = 1}' "$OUT/${name}_${passes}.plan"
    grep '^step:' "$OUT/${name}_${passes}.log" | tail -1
  done
done
