"""Shared fixtures of the operator tests: the generated CRD schema and an API-server stand-in.

`api_server_errors(obj)` does what the API server does with a create request, minus the parts that need a
server: default the object from the schema, validate it against the openAPIV3Schema (jsonschema, draft 4,
as OpenAPI v3.0 is), then evaluate every CEL rule (cel-python) on the defaulted object.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the test extra")
celpy = pytest.importorskip("celpy", reason="cel-python is in the test extra")

from evolving_infra.operator import crdgen  # noqa: E402
from evolving_infra.operator.schema import apply_defaults, iter_rules  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "manifests" / "examples"


@functools.cache
def object_schema() -> dict[str, Any]:
    crd = crdgen.build_crd()
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


_CEL = celpy.Environment()  # created at import: it raises the recursion limit once, outside any test


@functools.cache
def _program(rule: str) -> Any:
    return _CEL.program(_CEL.compile(rule))


def cel_failures(obj: dict[str, Any]) -> list[str]:
    """Messages of the CEL rules that reject the (defaulted) object; an evaluation error counts as a rejection."""
    failures = []
    for path, rule, value in iter_rules(object_schema(), obj):
        result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(result, celpy.CELEvalError) or not bool(result):
            failures.append(rule["message"])
    return failures


def schema_errors(obj: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(dotted path, failing keyword, message) of every openAPIV3Schema violation."""
    validator = jsonschema.Draft4Validator(object_schema())
    return sorted(
        (".".join(str(p) for p in err.absolute_path), str(err.validator), err.message)
        for err in validator.iter_errors(obj)
    )


def api_server_errors(obj: dict[str, Any]) -> list[str]:
    """Schema violations as `path: keyword`, then CEL messages (only when the schema accepts the object,
    since the API server needs well-typed values to evaluate rules)."""
    defaulted = apply_defaults(object_schema(), obj)
    errors = [f"{path}: {keyword}" for path, keyword, _ in schema_errors(defaulted)]
    return errors or cel_failures(defaulted)


def load_example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))


@pytest.fixture
def nine_nodes() -> dict[str, Any]:
    """A fresh copy of the 9-node example object."""
    return copy.deepcopy(load_example("cluster-9-nodes.yaml"))


@pytest.fixture(scope="session")
def apiserver() -> Any:
    """The stand-in's functions, for tests (conftest modules are not importable under importlib mode)."""
    import types

    return types.SimpleNamespace(
        errors=api_server_errors,
        schema_errors=schema_errors,
        cel_failures=cel_failures,
        schema=object_schema(),
        load_example=load_example,
        repo=REPO,
    )
