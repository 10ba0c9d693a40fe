#!/usr/bin/env bash
# Installs every build, test and data dependency of meshtrain from Debian/Ubuntu packages.
# Safe to run again; uses sudo only when not already root.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  libfmt-dev
  clang-format
  libprotobuf-dev protobuf-compiler libisal-dev
  zlib1g-dev
  fortunes fortunes-min
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all packages present"
fi
# PyTorch for the independent reference cross-check (tests labelled `reference`). Best effort: where
# the distribution has no python3-torch the test command excludes those tests and says how many.
if ! dpkg -s python3-torch >/dev/null 2>&1; then
  echo "install_deps: installing python3-torch (the reference cross-check)"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends python3-torch ||
    echo "install_deps: python3-torch is not available here: the reference tests will be excluded"
fi
