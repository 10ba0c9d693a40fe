#!/usr/bin/env bash
# One call on the GPU machine, from binaries built on the build machine (the GPU image has no
# build toolchain): replay the attention kernels' index math on the host, check their SASS, run
# the GPU tests of matmul and attention (optionally under compute-sanitizer), then bench_gemm and
# bench_attention. Logs land in $OUT (default /tmp/meshtrain_gpu); the tables print last.
#
# Build machine:  ninja -C build-cuda meshtrain_cuda_tests bench_gemm bench_attention \
#                   check_attention_layout && scripts/gpu_test.sh bundle
# Carry:          build-cuda/tests/{meshtrain_cuda_tests,check_attention_layout},
#                 build-cuda/bench/kernels/{bench_gemm,bench_attention[,bench_attention_cudnn]},
#                 build-cuda/bundle (when it exists),
#                 and the .cu.o objects below if you want the SASS check
# GPU machine:    bench/kernels/run_gpu.sh            tests + benchmarks
#                 SANITIZE=1 bench/kernels/run_gpu.sh also memcheck + racecheck, small attention
#                 BENCH_ONLY=1 bench/kernels/run_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/meshtrain_gpu}
mkdir -p "$OUT"
B=build-cuda
for f in tests/meshtrain_cuda_tests tests/check_attention_layout bench/kernels/bench_gemm \
         bench/kernels/bench_attention; do
  [ -x "$B/$f" ] || { echo "run_gpu.sh: $B/$f is missing: build it on the build machine"; exit 2; }
done
# Shared libraries: the bundle (scripts/gpu_test.sh bundle), the CUDA toolkit, Python's wheels.
LIBS="$B/bundle:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib"
for d in $(python3 -c 'import glob,site; print(" ".join(glob.glob(site.getsitepackages()[0]+"/nvidia/*/lib")))' 2>/dev/null); do
  LIBS="$LIBS:$d"
done
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$B/bench/kernels/bench_gemm" | grep -q "not found"; then
  echo "run_gpu.sh: libraries not found:"; ldd "$B/bench/kernels/bench_gemm" | grep "not found"
  if [ -d "$B/bundle/stdcxx" ]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$B/bundle/stdcxx"; fi
fi

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv \
  > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

# Host-only replay of the kernels' fragment index math (no GPU involved).
"$B/tests/check_attention_layout" > "$OUT/layout.txt" 2>&1
tail -1 "$OUT/layout.txt"

# Tensor-core mma (HMMA), ldmatrix (LDSM), cp.async (LDGSTS) present; local memory (LDL/STL) absent.
if command -v cuobjdump > /dev/null; then
  for f in attention_fwd attention_bwd_dkdv attention_bwd_dq; do
    obj=$B/CMakeFiles/meshtrain_lib.dir/src/meshtrain/ops/cuda/$f.cu.o
    [ -f "$obj" ] || continue
    echo "$f: $(cuobjdump --dump-sass "$obj" | grep -oE '\b(HMMA|LDSM|LDGSTS|LDL|STL)\b' | sort | uniq -c | tr '\n' ' ')"
  done | tee "$OUT/sass.txt"
fi

if [ -z "${BENCH_ONLY:-}" ]; then
  "$B/tests/meshtrain_cuda_tests" --gtest_filter='*Matmul*:*Attention*' > "$OUT/tests.log" 2>&1
  echo "tests: exit $?"
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|Failure|exception|‖|max \||NaN' "$OUT/tests.log" | head -60
  if [ -n "${SANITIZE:-}" ] && command -v compute-sanitizer > /dev/null; then
    small='Dtypes/CudaAttention.ForwardAndBackwardMatchCpu/*:CudaAttentionVariants.*'
    for tool in memcheck racecheck; do
      compute-sanitizer --tool $tool --error-exitcode 9 "$B/tests/meshtrain_cuda_tests" \
        --gtest_filter="$small" > "$OUT/sanitize_$tool.log" 2>&1
      echo "compute-sanitizer $tool: exit $? ($(grep -c '========= ' "$OUT/sanitize_$tool.log") report lines)"
    done
  fi
fi

"$B/bench/kernels/bench_gemm" > "$OUT/bench_gemm.txt" 2>&1
"$B/bench/kernels/bench_attention" > "$OUT/bench_attention.txt" 2>&1
cat "$OUT/bench_gemm.txt" "$OUT/bench_attention.txt"
# meshtrain's kernels against cuDNN's fused SDPA (built only where configure found cuDNN).
if [ -x "$B/bench/kernels/bench_attention_cudnn" ]; then
  "$B/bench/kernels/bench_attention_cudnn" > "$OUT/bench_attention_cudnn.txt" 2>&1
  cat "$OUT/bench_attention_cudnn.txt"
fi
