#!/usr/bin/env bash
# Configures and builds hyserve into build/ (CUDA backend when nvcc is found).
# Extra arguments go to cmake's configure step, e.g. -DHYSERVE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
# CUTLASS headers for the CUDA build (scripts/install_cutlass.sh).
if command -v nvcc >/dev/null; then bash scripts/install_cutlass.sh; fi
cmake -S . -B build -G Ninja -DHYSERVE_WERROR=ON "$@"
cmake --build build -j "$(nproc)"
