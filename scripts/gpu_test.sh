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
#   scripts/gpu_test.sh pack DIR    on the build machine: the bundle, then it and the binaries
#                                   (meshtrain, the CUDA tests, the parity test; stripped) in
#                                   DIR/pack.tar.xz with build-cuda's layout (~17 MiB); carry DIR
#                                   and set MESHTRAIN_GPU_BIN_DIR=DIR there (unpacked on first use)
#   scripts/gpu_test.sh layouts [REGEX]
#                                   on the GPU machine: the seed's layouts over NCCL
#                                   (tests/dist/parity/cuda_layouts.txt, or those whose name
#                                   matches REGEX), float32 and bfloat16 against the 1-rank CUDA
#                                   run; one GPU per rank when the machine has enough, else the
#                                   ranks share GPUs (MESHTRAIN_SHARE_GPU=1). Prints one line per
#                                   layout and precision, writes $OUT/layouts.tsv and .json
#   scripts/gpu_test.sh traces      on the GPU machine: profiled FSDP 2 + TP 2 + EP 2 and HSDP
#                                   2x2 + TP 2 + EP 2 runs, per-rank Chrome traces under
#                                   $OUT/traces, summarised by scripts/trace_summary.py
#
# What to carry to the GPU machine: build-cuda/tests/meshtrain_cuda_tests and build-cuda/bundle
# (about 50 MiB together); the rest of build-cuda is object files. For layouts and traces: the
# folder `pack` made. MESHTRAIN_LAYOUT_RANKS (default 8) bounds the ranks of the layout jobs that
# run at once; MESHTRAIN_LAYOUT_TIMEOUT (default 540 s) bounds each job; MESHTRAIN_LAYOUT_TABLE and
# MESHTRAIN_LAYOUT_PRECISIONS replace the table and the precisions (a CPU dry run of the mode).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=${MESHTRAIN_GPU_BIN_DIR:-$ROOT/build-cuda}
case "$BIN_DIR" in /*) ;; *) BIN_DIR=$ROOT/$BIN_DIR ;; esac
BIN=${MESHTRAIN_CUDA_TESTS:-$BIN_DIR/tests/meshtrain_cuda_tests}
BUNDLE=$BIN_DIR/bundle
MODE=${1:-}

if [ "$MODE" = "bundle" ] || [ "$MODE" = "pack" ]; then
  if [ "$MODE" = "pack" ]; then
    [ -n "${2:-}" ] || { echo "gpu_test.sh pack DIR: DIR missing" >&2; exit 2; }
    BIN_DIR=$ROOT/build-cuda; BIN=$BIN_DIR/tests/meshtrain_cuda_tests; BUNDLE=$BIN_DIR/bundle
  fi
  [ -x "$BIN" ] || { echo "gpu_test.sh: $BIN is not built (ninja -C build-cuda meshtrain_cuda_tests)" >&2; exit 2; }
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/stdcxx"
  for exe in "$BIN" "$BIN_DIR/meshtrain" "$BIN_DIR/tests/dist/meshtrain_dist_parity"; do
    [ -x "$exe" ] && ldd "$exe"
  done | awk '$3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
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
  if [ "$MODE" = "pack" ]; then
    dest=$2
    stage=$(mktemp -d)
    mkdir -p "$stage/tests/dist" "$dest"
    cp -r "$BUNDLE" "$stage/bundle"
    for rel in meshtrain tests/meshtrain_cuda_tests tests/dist/meshtrain_dist_parity; do
      [ -x "$BIN_DIR/$rel" ] || { echo "gpu_test.sh: $BIN_DIR/$rel is not built" >&2; exit 2; }
      strip -o "$stage/$rel" "$BIN_DIR/$rel"
    done
    # Compressed: the binaries and the bundle are ~80 MiB, over what a call carries (64 MiB).
    tar -C "$stage" -cJf "$dest/pack.tar.xz" .
    rm -rf "$stage"
    du -sh "$dest/pack.tar.xz"
  fi
  exit 0
fi

# A folder `pack` made holds pack.tar.xz: unpack it in place once.
if [ -f "$BIN_DIR/pack.tar.xz" ] && [ ! -x "$BIN_DIR/tests/dist/meshtrain_dist_parity" ]; then
  tar -C "$BIN_DIR" -xJf "$BIN_DIR/pack.tar.xz"
fi
if [ "$MODE" = "layouts" ] || [ "$MODE" = "traces" ]; then
  BIN=$BIN_DIR/tests/dist/meshtrain_dist_parity  # the libraries below are the same for meshtrain
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

# The build's C++ runtime only if the system's is too old to load the binary (ldd names the
# missing symbol versions).
if ldd "$BIN" 2>&1 | grep -q "GLIBCXX\|CXXABI\|GCC_"; then
  export LD_LIBRARY_PATH="$BUNDLE/stdcxx:$LD_LIBRARY_PATH"
fi
nvidia-smi -L 2>/dev/null || echo "gpu_test.sh: nvidia-smi not available"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
if [ "$MODE" = "layouts" ] || [ "$MODE" = "traces" ]; then
  # shellcheck source=scripts/gpu_layouts.sh
  . "$ROOT/scripts/gpu_layouts.sh"
  if [ "$MODE" = "layouts" ]; then run_layouts "${2:-}"; else run_traces; fi
  exit $?
fi
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
