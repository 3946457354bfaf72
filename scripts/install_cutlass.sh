#!/usr/bin/env bash
# Installs CUTLASS / CuTe (header-only C++ templates: the Hopper grouped GEMMs of the MoE,
# src/kernels/moe/cuda/grouped_gemm_bf16.cu) from PyPI's nvidia-cutlass wheel, which ships
# them under cutlass_library/source/include, into .venv-build (without the wheel's Python
# dependencies: only the headers are used). CMakeLists.txt finds them there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-build
VERSION=4.2.0.0
if [[ ! -f "$VENV/.nvidia-cutlass-$VERSION" ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --no-deps "nvidia-cutlass==$VERSION"
  touch "$VENV/.nvidia-cutlass-$VERSION"
fi
