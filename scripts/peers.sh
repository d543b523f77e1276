#!/usr/bin/env bash
# Makes the virtual environment the Python peer tests run in (.venv-test, or
# $NABLA_PEER_VENV) and installs the pinned peers of
# scripts/peers-requirements.txt into it. Quick when nothing changed: the venv
# keeps a copy of the requirements it was built from.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${NABLA_PEER_VENV:-$PWD/.venv-test}
req=scripts/peers-requirements.txt
if [ -x "$venv/bin/python" ] && cmp -s "$req" "$venv/nabla-requirements.txt"; then
  exit 0
fi
echo "making the Python peer venv $venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
cp "$req" "$venv/nabla-requirements.txt"
