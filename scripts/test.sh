#!/usr/bin/env bash
# One command from a fresh machine: install, build, and run every test. GPU tests
# (ctest label gpu) skip themselves where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
