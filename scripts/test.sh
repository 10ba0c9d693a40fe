#!/usr/bin/env bash
# Installs dependencies, builds meshtrain and runs every test with ctest (CI runs exactly this).
# Tests labelled `gpu` run only where a GPU is visible; otherwise they are excluded and counted.
# Tests labelled `soak` (long drills, minutes each) never run here: `ctest -L soak` runs them.
# Tests labelled `reference` (the PyTorch cross-check) run with the first of $PYTHON, python3 and
# /usr/bin/python3 that imports torch; where none does they are excluded and counted.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build
n_soak=$(ctest --test-dir build -N -L soak | sed -n 's/^Total Tests: //p')
echo "test.sh: excluding ${n_soak:-0} test(s) labelled soak (run them with ctest -L soak)"
excluded=soak
if ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'); then
  n_gpu=$(ctest --test-dir build -N -L gpu | sed -n 's/^Total Tests: //p')
  echo "test.sh: no GPU visible: excluding ${n_gpu:-0} test(s) labelled gpu"
  excluded="gpu|$excluded"
fi
torch_python=
for py in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import torch' >/dev/null 2>&1; then
    torch_python=$py
    break
  fi
done
if [ -n "$torch_python" ]; then
  export PYTHON=$torch_python
else
  n_ref=$(ctest --test-dir build -N -L reference | sed -n 's/^Total Tests: //p')
  echo "test.sh: no Python with torch: excluding ${n_ref:-0} test(s) labelled reference"
  excluded="reference|$excluded"
fi
ctest --test-dir build --output-on-failure -j2 -LE "$excluded"
