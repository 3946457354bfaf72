#!/usr/bin/env bash
# One command from a fresh machine: install, build, and run the main job
# (greedy generation on the bundled tiny kimi_k3 model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/hyserve info
./build/hyserve generate --prompt-ids 1,2,3,4,5 --max-tokens 16
