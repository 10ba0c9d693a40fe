#!/usr/bin/env bash
# Runs the GPU tests (tests/cuda, ctest label `gpu`) on a GPU machine from a build made elsewhere:
# nothing is configured or built there.
#
#   scripts/gpu_test.sh bundle      on the build machine, after `ninja -C build-cuda
#                                   meshtrain_cuda_tests`: copies the shared libraries the test
#                                   binary needs, except glibc, the driver and the big CUDA
#                                   libraries (cuBLAS, cuBLASLt, NCCL, cuDNN), to build-cuda/bundle
#   scripts/gpu_test.sh [gtest...]  on the GPU machine: finds the missing libraries (the bundle,
#                                   the CUDA toolkit, Python's nvidia-* wheels), runs
#                                   build-cuda/tests/meshtrain_cuda_tests with
#                                   --gtest_output=json:$OUT/cuda_tests.json, prints a summary
#
# What to carry to the GPU machine: build-cuda/tests/meshtrain_cuda_tests and build-cuda/bundle
# (about 50 MiB together); the rest of build-cuda is object files.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MESHTRAIN_CUDA_TESTS:-$ROOT/build-cuda/tests/meshtrain_cuda_tests}
BUNDLE=$ROOT/build-cuda/bundle

if [ "${1:-}" = "bundle" ]; then
  [ -x "$BIN" ] || { echo "gpu_test.sh: $BIN is not built (ninja -C build-cuda meshtrain_cuda_tests)" >&2; exit 2; }
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/stdcxx"
  ldd "$BIN" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libnvidia*) continue ;;
      libcublas*|libnccl*|libcudnn*) continue ;;  # hundreds of MiB; the GPU image has them
      # Used only when the GPU machine's own C++ runtime is older than the build's.
      libstdc++.so*|libgcc_s.so*) cp -L "$path" "$BUNDLE/stdcxx/$name" ;;
      *) cp -L "$path" "$BUNDLE/$name" ;;
    esac
  done
  du -sh "$BUNDLE"
  ls "$BUNDLE"
  exit 0
fi

[ -x "$BIN" ] || { echo "gpu_test.sh: $BIN not found: build it on the build machine and carry it" >&2; exit 2; }
OUT=${OUT:-$ROOT/gpu_test_out}
mkdir -p "$OUT"
# NVLink multicast stays off on the shared machines (the code sets it too when unset).
export NCCL_NVLS_ENABLE=0

missing() { ldd "$BIN" 2>/dev/null | awk '/not found/ {print $1}' || true; }
export LD_LIBRARY_PATH="$BUNDLE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
candidates="/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib"
candidates="$candidates $(python3 - <<'PY' 2>/dev/null || true
import glob, os, site
dirs = []
for s in site.getsitepackages() + [site.getusersitepackages()]:
    dirs += glob.glob(os.path.join(s, "nvidia", "*", "lib"))
print(" ".join(dirs))
PY
)"
for lib in $(missing); do
  for dir in $candidates; do
    if [ -e "$dir/$lib" ]; then
      export LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH"
      break
    fi
  done
done
still=$(missing)
if [ -n "$still" ]; then
  echo "gpu_test.sh: shared libraries not found: $still" >&2
  echo "  searched: $BUNDLE $candidates" >&2
  echo "  (run 'scripts/gpu_test.sh bundle' on the build machine and carry build-cuda/bundle)" >&2
  exit 2
fi

# The build's C++ runtime only if the system's is too old to load the binary.
if ! "$BIN" --gtest_list_tests >/dev/null 2>"$OUT/load_check.txt"; then
  if grep -q "GLIBCXX\|CXXABI\|GCC_" "$OUT/load_check.txt"; then
    export LD_LIBRARY_PATH="$BUNDLE/stdcxx:$LD_LIBRARY_PATH"
  fi
fi
nvidia-smi -L 2>/dev/null || echo "gpu_test.sh: nvidia-smi not available"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
set +e
"$BIN" --gtest_output=json:"$OUT/cuda_tests.json" "$@" 2>&1 | tee "$OUT/cuda_tests.log"
rc=${PIPESTATUS[0]}
set -e

python3 - "$OUT/cuda_tests.json" <<'PY' || echo "gpu_test.sh: no JSON summary (the binary may have crashed; see $OUT/cuda_tests.log)"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"\n== GPU tests: {r['tests']} run, {r['failures']} failed, {r.get('disabled', 0)} disabled, "
      f"{r['time']} ==")
for suite in r["testsuites"]:
    for t in suite["testsuite"]:
        if t.get("failures"):
            print(f"FAILED {suite['name']}.{t['name']}")
            for f in t["failures"]:
                lines = f["failure"].splitlines()
                for line in lines[:6]:
                    print("    " + line)
                if len(lines) > 6:
                    print(f"    ... ({len(lines) - 6} more lines in cuda_tests.log)")
PY
exit "$rc"
