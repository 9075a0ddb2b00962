#!/usr/bin/env bash
# Side virtual environment with NVIDIA Dynamo's replay (ai-dynamo 1.6.1, CPU only), used by
# `evolving-infra evaluate peers` and tests/peers as a subprocess. Its pins differ from ours, so it never
# enters the project's .venv. ai-dynamo's `aisimulate` requirement is a stub that cannot install here:
# install both wheels with --no-deps, then the requirements the replay actually imports.
#   scripts/peers/setup-dynamo.sh [VENV]     (default .peers/dynamo-venv; idempotent; ~1 min, ~250 MB)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="$(realpath -m "${1:-.peers/dynamo-venv}")"
PY="${PYTHON:-python3}"
cd /  # the repository's operator/ folder would shadow the standard library's operator module (python -c, -m)
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import numpy, dynamo.replay" 2>/dev/null; then
    echo "ok: $VENV already has ai-dynamo"
    exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
"$VENV/bin/pip" install -q --disable-pip-version-check numpy aiohttp 'kubernetes<33' msgspec prometheus-client \
    pyzmq redis tqdm typing-extensions zstandard pyyaml
"$VENV/bin/python" -c "import numpy, dynamo.replay"
echo "ok: $VENV has ai-dynamo $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("ai-dynamo"))')"
