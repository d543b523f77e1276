#!/usr/bin/env bash
# Runs one Python peer test (tests/<lib>/peer_*.py) with the peer venv's
# python: `scripts/py-peer.sh SCRIPT [ARGS...]`; ctest calls it. Without the
# venv the test fails and says how to make it, unless NABLA_SKIP_PY_PEERS=1,
# which skips every peer test (exit 77, reported by ctest as skipped).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${NABLA_PEER_VENV:-$root/.venv-test}
if [ "${NABLA_SKIP_PY_PEERS:-0}" = 1 ]; then
  echo "skipped: NABLA_SKIP_PY_PEERS=1"
  exit 77
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "error: no Python peer venv at $venv: run scripts/peers.sh (scripts/test.sh does)," \
       "or set NABLA_SKIP_PY_PEERS=1 to skip the Python peer tests" >&2
  exit 1
fi
exec "$venv/bin/python" "$@"
