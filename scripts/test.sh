#!/usr/bin/env bash
# Install the project with its test extras into .venv and run the whole test suite (the README's test
# command, and what CI runs). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test]'
exec .venv/bin/python -m pytest "$@"
