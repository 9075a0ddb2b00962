#!/usr/bin/env bash
# Regenerate the checked-in Python stubs of proto/v1/*.proto (run after editing a .proto file).
#
#   scripts/gen-proto.sh [OUT_DIR]      (default OUT_DIR: proto/v1, i.e. in place)
#
# The sources live in proto/v1/, the folder installed as `evolving_infra.proto.v1`. protoc derives the
# generated imports from a file's path under its include root, so each source is staged under
# <tmp>/evolving_infra/proto/v1/ and compiled with that include root: the stubs then import
# `from evolving_infra.proto.v1 import node_agent_pb2`, and the descriptors are registered as
# `evolving_infra/proto/v1/<name>.proto`. Needs grpcio-tools (the `test` extra); PYTHON picks the
# interpreter (default: .venv/bin/python, else python3). tests/node_agent/test_proto_stubs.py runs this
# into a temporary folder and fails when the checked-in stubs differ.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$repo/proto/v1}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/src/evolving_infra/proto/v1" "$stage/gen" "$out"
cp "$repo"/proto/v1/*.proto "$stage/src/evolving_infra/proto/v1/"
(
  cd "$stage/src"
  "$PYTHON" -m grpc_tools.protoc -I . \
    --python_out="$stage/gen" --pyi_out="$stage/gen" --grpc_python_out="$stage/gen" \
    evolving_infra/proto/v1/*.proto
)
cp "$stage"/gen/evolving_infra/proto/v1/*.py "$stage"/gen/evolving_infra/proto/v1/*.pyi "$out/"
