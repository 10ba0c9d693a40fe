# Sourced by the GPU-machine scripts (run_step26_gpu.sh, bench/e2e/run.sh) with B set to a build
# folder carried from the build machine: unpacks a `scripts/gpu_test.sh pack` archive found there
# (once), then puts the shared libraries on LD_LIBRARY_PATH the way run_gpu.sh finds them: the
# bundle, the CUDA toolkit, Python's nvidia-* wheels; the bundle's C++ runtime only when needed.
if [ -f "$B/pack.tar.xz" ] && [ ! -d "$B/bundle" ]; then
  tar -C "$B" -xJf "$B/pack.tar.xz"
fi
_mt_libs="$B/bundle:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib"
for _mt_d in $(python3 -c 'import glob,site; print(" ".join(glob.glob(site.getsitepackages()[0]+"/nvidia/*/lib")))' 2>/dev/null); do
  _mt_libs="$_mt_libs:$_mt_d"
done
export LD_LIBRARY_PATH="$_mt_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# gpu_libs_check BINARY: adds the bundle's libstdc++ when BINARY still misses libraries.
gpu_libs_check() {
  if ldd "$1" | grep -q "not found"; then
    echo "libraries not found for $1:"; ldd "$1" | grep "not found"
    if [ -d "$B/bundle/stdcxx" ]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$B/bundle/stdcxx"; fi
  fi
}
