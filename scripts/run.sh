#!/usr/bin/env bash
# One command from a fresh machine: install, build, and run the main job
# (greedy generation on the bundled tiny kimi_k3 model: a prompt typed as text, its
# continuation printed as ids and as text).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/hyserve info
./build/hyserve generate --prompt "The Python interpreter reads" --max-tokens 24
