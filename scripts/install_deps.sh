#!/usr/bin/env bash
# Installs the Debian packages hyserve builds with (when missing). Each is header-only
# or linked statically, so the binary runs where none of them is installed, except Gloo
# (shared: scripts/make_gpu_deps.sh carries it to the GPU machine).
#   nlohmann-json3-dev  JSON (configs, safetensors headers, HTTP bodies)
#   libcli11-dev        command line
#   libxxhash-dev       hashing (logit hashes, prefix-cache block hashes)
#   libpcre2-dev        regex (tokenizer split patterns)
#   libspdlog-dev       logging (util/log.h), header-only with libfmt-dev (formatting)
#   libboost1.81-dev    Boost.Asio, header-only: the HTTP server's event loop
#   zlib1g-dev          deflate for the PNG plots of `hyserve bench sweep` (static libz.a)
#   libopenblas-pthread-dev  the CPU backend's GEMMs (static libopenblas.a, pthread build; optional
#                       to CMake: without it the CPU runs its reference loops only)
#   libgloo-dev         CPU collectives for tensor/context parallelism (parallel/gloo/)
#   libgtest-dev        tests
#   python3-venv        .venv-build (CUTLASS's headers, scripts/install_cutlass.sh) and
#                       .venv-test (the server suite)
#   cmake, ninja-build, g++, clang-format
set -euo pipefail
pkgs=(cmake ninja-build g++ nlohmann-json3-dev libcli11-dev libxxhash-dev libpcre2-dev libspdlog-dev libfmt-dev libboost1.81-dev zlib1g-dev libopenblas-pthread-dev libgloo-dev libgtest-dev python3-venv clang-format)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
