#!/usr/bin/env bash
# Runs the server test suite (tests/server) against a built hyserve binary.
# Creates .venv-test on first use and installs the pinned tests/server/requirements.txt.
# Usage: scripts/test_server.sh [pytest args...]   (HYSERVE_BINARY overrides build/hyserve)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-test
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q -r tests/server/requirements.txt

export HYSERVE_BINARY="${HYSERVE_BINARY:-build/hyserve}"
exec "$VENV/bin/python" -m pytest tests/server -q "$@"
