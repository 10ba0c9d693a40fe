#!/usr/bin/env bash
# The GPU half of issue 17's measurements, for the H200: ranks sharing the one GPU (through
# scripts/share_gpu_rank.sh), DeepSeek-V3 debug model. Fits the GPU throughput table from a
# profiled 1-rank run (OUT/cuda_table.txt: what `meshtrain plan --cost-table` reads), then runs
# FSDP 2 + EP 2 and FSDP 4 + EP 2 with [compile] graph_passes on and off and prints, per layout,
# the collectives per step, the measured step-graph time (trace span, mean over ranks), the
# predicted step and the step line. Per-rank Chrome traces stay under OUT/<run>/profile_traces.
# Usage: scripts/sched_gpu_bench.sh [BUILD_DIR (default build-cuda)] [OUT (default $OUT/sched)]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build-cuda}
DEST=${2:-${OUT:-/tmp}/sched}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
DEVICE=cuda WRAP="$ROOT/scripts/share_gpu_rank.sh" "$ROOT/bench/cost/measure.sh" "$BUILD" "$DEST"
# Keep what comes back small: the tables, logs, plans and rank 0/1 traces of FSDP 4 + EP 2.
find "$DEST" -name 'rank[2-9]*_trace.json' -path '*fsdp2*' -delete
find "$DEST" -type d -name checkpoint -prune -exec rm -rf {} +
