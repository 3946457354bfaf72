#!/usr/bin/env bash
# One command from a fresh machine: install, build, and run every test: the C++ tests
# (ctest; those labelled gpu skip themselves where no GPU is present), then the server
# suite (pytest with the openai SDK, in .venv-test).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
# The OpenAI server suite: pytest + the openai SDK against the real binary.
bash scripts/test_server.sh
