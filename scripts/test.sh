#!/usr/bin/env bash
# Install the project with its test extras into .venv and run the whole test suite (the README's test
# command, and what CI runs). With arguments, pytest runs just those (one process).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test]'
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# The whole suite: the `live` tests (real processes checked in wall-clock time, tests/conftest.py) in front, and
# alongside them the rest on two workers at the lowest CPU priority, so they take only the time the live tests
# leave idle. The rest's report follows the live tests' report.
rest_log=$(mktemp)
nice -n 19 .venv/bin/python -m pytest -n 2 -m "not live" > "$rest_log" 2>&1 &
rest_pid=$!
trap 'kill "$rest_pid" 2>/dev/null || true; rm -f "$rest_log"' EXIT
live=0
.venv/bin/python -m pytest -m live || live=$?
rest=0
wait "$rest_pid" || rest=$?
echo
echo "=== the rest of the suite (two workers, alongside the live tests) ==="
cat "$rest_log"
if [ "$live" -ne 0 ]; then exit "$live"; fi
exit "$rest"
