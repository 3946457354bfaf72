#!/usr/bin/env bash
# Runs the server test suite (tests/server) against a built hyserve binary.
# Creates .venv-test on first use and installs the pinned tests/server/requirements.txt, then
# the peer benchmark clients (aiperf, guidellm) of tests/server/requirements-peers.txt, a complete
# lock installed with --no-deps (see its header: their pins conflict on click only).
# Usage: scripts/test_server.sh [pytest args...]   (HYSERVE_BINARY overrides build/hyserve)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-test
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q -r tests/server/requirements.txt
"$VENV/bin/python" -m pip install -q --no-deps -r tests/server/requirements-peers.txt

export HYSERVE_BINARY="${HYSERVE_BINARY:-build/hyserve}"
# -p no:dash: aiperf's dash dependency registers a pytest plugin the suite does not use.
exec "$VENV/bin/python" -m pytest -p no:dash tests/server -q "$@"
