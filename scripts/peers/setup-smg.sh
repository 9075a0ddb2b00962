#!/usr/bin/env bash
# Side virtual environment with the SGLang Model Gateway (`smg` 1.13.0, a Rust binary on PyPI, ~40 MB), used by
# `evolving-infra local --gateway smg`, the gateway differential check and tests/peers. Kept out of .venv.
#   scripts/peers/setup-smg.sh [VENV]     (default .peers/smg-venv; idempotent; ~20 s)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="$(realpath -m "${1:-.peers/smg-venv}")"
PY="${PYTHON:-python3}"
cd /  # the repository's operator/ folder would shadow the standard library's operator module (python -c, -m)
if [ -x "$VENV/bin/smg" ] && "$VENV/bin/smg" --help >/dev/null 2>&1; then
    echo "ok: $VENV already has smg"
    exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check smg==1.13.0
"$VENV/bin/smg" --help >/dev/null
echo "ok: $VENV has smg 1.13.0"
