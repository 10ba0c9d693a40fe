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
# GPU machine:    bench/kernels/run_step26_gpu.sh      (BUILD=DIR for another build folder)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/meshtrain_step26}
mkdir -p "$OUT"
B=${BUILD:-build-cuda}
for f in bench/kernels/bench_grouped_gemm bench/kernels/bench_optimizer; do
  [ -x "$B/$f" ] || { echo "run_step26_gpu.sh: $B/$f is missing: build it on the build machine"; exit 2; }
done
# Shared libraries as run_gpu.sh finds them: the bundle, the CUDA toolkit, Python's wheels.
LIBS="$B/bundle:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib"
for d in $(python3 -c 'import glob,site; print(" ".join(glob.glob(site.getsitepackages()[0]+"/nvidia/*/lib")))' 2>/dev/null); do
  LIBS="$LIBS:$d"
done
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$B/bench/kernels/bench_grouped_gemm" | grep -q "not found"; then
  echo "run_step26_gpu.sh: libraries not found:"; ldd "$B/bench/kernels/bench_grouped_gemm" | grep "not found"
  if [ -d "$B/bundle/stdcxx" ]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$B/bundle/stdcxx"; fi
fi

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,memory.used \
  --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
rc=0
timeout 120 "$B/bench/kernels/bench_grouped_gemm" --tsv "$OUT/grouped_gemm.tsv" \
  > "$OUT/bench_grouped_gemm.txt" 2>&1
s=$?; echo "bench_grouped_gemm: exit $s"; [ $s = 0 ] || rc=1
timeout 120 python3 bench/kernels/grouped_mm_torch.py > "$OUT/grouped_mm_torch.jsonl" \
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
