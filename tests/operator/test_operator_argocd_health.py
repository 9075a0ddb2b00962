"""manifests/argocd/health.lua, run in a real Lua runtime (lupa) the way Argo CD runs it: `obj` in scope,
the script returns a table with `status` and `message`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

lupa = pytest.importorskip("lupa", reason="lupa (a Lua runtime) is in the test extra; without it health.lua is not run")

SCRIPT = (Path(__file__).resolve().parents[2] / "manifests/argocd/health.lua").read_text(encoding="utf-8")


def health(obj: dict[str, Any]) -> tuple[str, str]:
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    check = lua.execute(f"return function(obj)\n{SCRIPT}\nend")
    result = check(lua.table_from(obj, recursive=True))
    return result["status"], result["message"]


def _cond(kind: str, status: str, reason: str = "R", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}


def _obj(generation: int = 3, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "glm-9", "generation": generation}, "status": status}


def test_no_status_yet_is_progressing() -> None:
    assert health({"metadata": {"name": "x", "generation": 1}}) == ("Progressing", "Waiting for the operator to report status")


def test_ready_at_the_observed_generation_is_healthy() -> None:
    status, message = health(_obj(observedGeneration=3, split="4P5D", conditions=[_cond("Ready", "True")]))
    assert status == "Healthy" and message == "Serving at 4P5D"


def test_routine_resplit_stays_healthy() -> None:
    obj = _obj(
        observedGeneration=3,
        split="4P5D",
        adapting=True,
        targetSplit={"split": "5P4D", "prefill": 5, "decode": 4, "switchGeneration": 2},
        conditions=[_cond("Ready", "True"), _cond("Adapting", "True", "Switching")],
    )
    assert health(obj) == ("Healthy", "Serving at 4P5D, re-splitting to 5P4D")


def test_new_spec_generation_is_progressing_until_observed() -> None:
    status, message = health(_obj(generation=4, observedGeneration=3, split="4P5D", conditions=[_cond("Ready", "True")]))
    assert status == "Progressing" and "generation 4" in message
    status, _ = health(_obj(generation=4, conditions=[_cond("Ready", "True")]))
    assert status == "Progressing"


def test_invalid_spec_is_degraded_even_before_it_is_observed() -> None:
    obj = _obj(generation=4, observedGeneration=3, conditions=[_cond("Invalid", "True", "UnknownProfile", "engine.profile 'x' is not known")])
    assert health(obj) == ("Degraded", "Invalid spec: engine.profile 'x' is not known")


def test_not_ready_and_degraded_is_degraded() -> None:
    obj = _obj(observedGeneration=3, conditions=[_cond("Ready", "False", "NoRouter"), _cond("Degraded", "True", "SwitchRolledBack", "n7 rolled back")])
    assert health(obj) == ("Degraded", "n7 rolled back")


def test_not_ready_without_degradation_is_progressing() -> None:
    obj = _obj(observedGeneration=3, conditions=[_cond("Ready", "False", "NodeAgentsStarting")])
    assert health(obj) == ("Progressing", "NodeAgentsStarting")


def test_ready_but_degraded_stays_healthy_and_says_so() -> None:
    obj = _obj(observedGeneration=3, split="4P4D", conditions=[_cond("Ready", "True"), _cond("Degraded", "True", "NodeUnreachable", "n3 unreachable")])
    assert health(obj) == ("Healthy", "Serving at 4P4D (degraded: n3 unreachable)")
