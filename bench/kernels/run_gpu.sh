#!/usr/bin/env bash
# One call on the GPU machine: build the CUDA tree, replay the attention kernels' index math on the
# host, check the kernels' SASS, run the GPU tests of matmul and attention (optionally under
# compute-sanitizer), then bench_gemm and bench_attention.
# Logs land in $OUT (default /tmp/meshtrain_gpu); the tables print last.
#
#   bench/kernels/run_gpu.sh                 # tests + benchmarks
#   SANITIZE=1 bench/kernels/run_gpu.sh      # also memcheck + racecheck on the small attention tests
#   BENCH_ONLY=1 bench/kernels/run_gpu.sh    # skip the tests
set -uo pipefail
OUT=${OUT:-/tmp/meshtrain_gpu}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv \
  > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if ! { cmake -S . -B build-cuda -G Ninja -DMESHTRAIN_ENABLE_CUDA=ON > "$OUT/cmake.log" 2>&1 &&
       ninja -C build-cuda meshtrain_cuda_tests bench_gemm bench_attention check_attention_layout \
         > "$OUT/build.log" 2>&1; }; then
  echo "build failed; tail of $OUT/build.log:"; tail -30 "$OUT/build.log"; exit 1
fi

# Host-only replay of the kernels' fragment index math (no GPU involved).
./build-cuda/bench/kernels/check_attention_layout > "$OUT/layout.txt" 2>&1
tail -1 "$OUT/layout.txt"

# Tensor-core mma (HMMA), ldmatrix (LDSM), cp.async (LDGSTS) present; local memory (LDL/STL) absent.
if command -v cuobjdump > /dev/null; then
  for f in attention_fwd attention_bwd_dkdv attention_bwd_dq; do
    obj=build-cuda/CMakeFiles/meshtrain_lib.dir/src/meshtrain/ops/cuda/$f.cu.o
    echo "$f: $(cuobjdump --dump-sass "$obj" | grep -oE '\b(HMMA|LDSM|LDGSTS|LDL|STL)\b' | sort | uniq -c | tr '\n' ' ')"
  done | tee "$OUT/sass.txt"
fi

if [ -z "${BENCH_ONLY:-}" ]; then
  ./build-cuda/tests/meshtrain_cuda_tests --gtest_filter='*Matmul*:*Attention*' > "$OUT/tests.log" 2>&1
  echo "tests: exit $?"; grep -E '^\[  (PASSED|FAILED) |^\[==========\]|Failure|Expected|‖|max \|' "$OUT/tests.log" | head -60
  if [ -n "${SANITIZE:-}" ] && command -v compute-sanitizer > /dev/null; then
    small='Dtypes/CudaAttention.ForwardAndBackwardMatchCpu/*:CudaAttentionVariants.*'
    for tool in memcheck racecheck; do
      compute-sanitizer --tool $tool --error-exitcode 9 ./build-cuda/tests/meshtrain_cuda_tests \
        --gtest_filter="$small" > "$OUT/sanitize_$tool.log" 2>&1
      echo "compute-sanitizer $tool: exit $? ($(grep -c '========= ' "$OUT/sanitize_$tool.log") report lines)"
    done
  fi
fi

./build-cuda/bench/kernels/bench_gemm > "$OUT/bench_gemm.txt" 2>&1
./build-cuda/bench/kernels/bench_attention > "$OUT/bench_attention.txt" 2>&1
cat "$OUT/bench_gemm.txt" "$OUT/bench_attention.txt"
