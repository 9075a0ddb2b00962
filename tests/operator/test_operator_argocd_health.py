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


def test_not_ready_past_the_operators_progress_deadline_is_degraded() -> None:
    message = "not Ready 640 s after the rollout began (deadline 600 s): waiting for the router"
    obj = _obj(observedGeneration=3, conditions=[_cond("Ready", "False", "NotServing"), _cond("Progressing", "False", "ProgressDeadlineExceeded", message)])
    assert health(obj) == ("Degraded", message)
    # Within the deadline the same cluster is still Progressing.
    obj = _obj(observedGeneration=3, conditions=[_cond("Ready", "False", "NotServing", "waiting for the router"), _cond("Progressing", "True", "RollingOut")])
    assert health(obj) == ("Progressing", "waiting for the router")


def test_deadline_health_follows_the_operators_condition_over_time() -> None:
    """The operator's Progressing condition at successive resyncs, as health.lua reads it."""
    from datetime import UTC, datetime, timedelta

    from evolving_infra.operator import summary
    from evolving_infra.operator.status import AgentServingClusterStatus

    start = datetime(2026, 1, 1, tzinfo=UTC)
    status = AgentServingClusterStatus()
    seen = []
    for seconds in (0, 300, 599, 601, 900):
        now = start + timedelta(seconds=seconds)
        status = summary.summarize(
            status, tracked=[], expected_nodes=3, router_ready=False, problems=[], now=now, generation=3,
            rolled_out=seconds == 0, progress_deadline_seconds=600,
        )  # fmt: skip
        conds = [{**c.to_kube(), "lastTransitionTime": c.last_transition_time.isoformat()} for c in status.conditions or ()]
        seen.append(health(_obj(observedGeneration=3, conditions=conds))[0])
    assert seen == ["Progressing", "Progressing", "Progressing", "Degraded", "Degraded"]
    # Ready at last: Healthy, and Progressing completes.
