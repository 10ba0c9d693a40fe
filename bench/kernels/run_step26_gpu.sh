#!/usr/bin/env bash
# Issue 26's kernel baselines in one call on the GPU machine, from binaries built on the build
# machine: bench_grouped_gemm (today's grouped GEMM op) and grouped_mm_torch.py (torch._grouped_mm)
# at the same shapes, merged into one table; then bench_optimizer (AdamW, the grad norm and the
# weight cast against the copy bandwidth). Logs land in $OUT (default /tmp/meshtrain_step26); the
# tables print last. About 1-2 minutes on an H100/H200 (well under 4).
#
# Build machine:  ninja -C build-cuda bench_grouped_gemm bench_optimizer meshtrain_cuda_tests &&
#                 scripts/gpu_test.sh bundle
# Carry:          build-cuda/bench/kernels/{bench_grouped_gemm,bench_optimizer}, build-cuda/bundle
# GPU machine:    bench/kernels/run_step26_gpu.sh      (BUILD=DIR for another build folder; a DIR
#                 holding a `scripts/gpu_test.sh pack` archive is unpacked there first)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/meshtrain_step26}
mkdir -p "$OUT"
B=${BUILD:-build-cuda}
TORCH_LD=${LD_LIBRARY_PATH:-}  # PyTorch keeps the caller's: its own CUDA libraries, not ours
. bench/kernels/gpu_libs.sh      # unpacks a pack archive, sets LD_LIBRARY_PATH
for f in bench/kernels/bench_grouped_gemm bench/kernels/bench_optimizer; do
  [ -x "$B/$f" ] || { echo "run_step26_gpu.sh: $B/$f is missing: build it on the build machine"; exit 2; }
done
gpu_libs_check "$B/bench/kernels/bench_grouped_gemm"

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,memory.used \
  --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
rc=0
timeout 120 "$B/bench/kernels/bench_grouped_gemm" --tsv "$OUT/grouped_gemm.tsv" \
  > "$OUT/bench_grouped_gemm.txt" 2>&1
s=$?; echo "bench_grouped_gemm: exit $s"; [ $s = 0 ] || rc=1
LD_LIBRARY_PATH="$TORCH_LD" timeout 120 python3 bench/kernels/grouped_mm_torch.py > "$OUT/grouped_mm_torch.jsonl" \
  2> "$OUT/grouped_mm_torch.err"
s=$?; echo "grouped_mm_torch.py: exit $s"; [ $s = 0 ] || { rc=1; tail -5 "$OUT/grouped_mm_torch.err"; }
timeout 90 "$B/bench/kernels/bench_optimizer" > "$OUT/bench_optimizer.txt" 2>&1
s=$?; echo "bench_optimizer: exit $s"; [ $s = 0 ] || rc=1

echo
cat "$OUT/bench_grouped_gemm.txt"
echo
if [ -s "$OUT/grouped_gemm.tsv" ]; then
  python3 bench/kernels/grouped_mm_torch.py table "$OUT/grouped_gemm.tsv" \
    "$OUT/grouped_mm_torch.jsonl" | tee "$OUT/grouped_gemm_table.txt"
fi
echo
cat "$OUT/bench_optimizer.txt"
exit $rc
