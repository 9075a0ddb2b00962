"""Rollout and deletion: the Progressing condition and its deadline, the Ready printer column, and deleting a
cluster while its finalizer is set (the operator away, then back)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from evolving_infra.operator import crdgen, kube, meta, summary
from evolving_infra.operator.handlers import FINALIZER
from evolving_infra.operator.kube import client_for
from evolving_infra.operator.runner import operator_task
from evolving_infra.operator.status import AgentServingClusterStatus, ConditionType


def _harness() -> Any:
    key = "_evolving_operator_tests_operator_harness"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("operator_harness.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


H = _harness()
NS = H.NAMESPACE
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _progressing(status: AgentServingClusterStatus) -> tuple[str, str]:
    cond = next(c for c in status.conditions or () if c.type is ConditionType.PROGRESSING)
    return cond.status.value, cond.reason


def _pass(status: AgentServingClusterStatus, seconds: float, *, ready: bool, rolled_out: bool = False) -> AgentServingClusterStatus:
    from evolving_infra.core.types import Phase
    from evolving_infra.operator.status import NodeState, NodeStatus

    tracked = [NodeStatus(name="n0", phase=Phase.PREFILL, state=NodeState.SERVING), NodeStatus(name="n1", phase=Phase.DECODE, state=NodeState.SERVING)]
    return summary.summarize(
        status, tracked=tracked, expected_nodes=2, router_ready=ready, problems=[], now=T0 + timedelta(seconds=seconds),
        generation=1, rolled_out=rolled_out, progress_deadline_seconds=600,
    )  # fmt: skip


def test_progressing_until_ready_then_complete() -> None:
    status = _pass(AgentServingClusterStatus(), 0, ready=False, rolled_out=True)
    assert _progressing(status) == ("True", summary.ROLLOUT)
    status = _pass(status, 30, ready=False)
    assert _progressing(status) == ("True", summary.ROLLOUT)
    status = _pass(status, 60, ready=True)
    assert _progressing(status) == ("False", summary.ROLLOUT_COMPLETE)
    # A spec change writes children: progressing again although the old router still serves.
    status = _pass(status, 90, ready=True, rolled_out=True)
    assert _progressing(status) == ("True", summary.ROLLOUT)


def test_the_deadline_is_counted_from_the_start_of_the_rollout_and_a_new_rollout_resets_it() -> None:
    status = _pass(AgentServingClusterStatus(), 0, ready=False, rolled_out=True)
    status = _pass(status, 599, ready=False)
    assert _progressing(status) == ("True", summary.ROLLOUT)
    status = _pass(status, 601, ready=False)
    assert _progressing(status) == ("False", summary.PROGRESS_DEADLINE_EXCEEDED)
    cond = next(c for c in status.conditions or () if c.type is ConditionType.PROGRESSING)
    assert cond.message == "not Ready 601 s after the rollout began (deadline 600 s): waiting for the router"
    status = _pass(status, 1200, ready=False)
    assert _progressing(status) == ("False", summary.PROGRESS_DEADLINE_EXCEEDED)
    status = _pass(status, 1230, ready=False, rolled_out=True)  # the spec was fixed: a new rollout
    assert _progressing(status) == ("True", summary.ROLLOUT)
    status = _pass(status, 1260, ready=True)
    assert _progressing(status) == ("False", summary.ROLLOUT_COMPLETE)


def test_the_ready_printer_column_is_the_ready_condition() -> None:
    columns = {c["name"]: c for c in crdgen.PRINTER_COLUMNS}
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Nodes"]["jsonPath"] == ".status.readyNodes"
    assert [c["name"] for c in crdgen.PRINTER_COLUMNS][0] == "Ready"


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_deleting_a_cluster_while_its_finalizer_is_set_waits_for_the_operator() -> None:
    """What the uninstall order in docs/operations.md guards against: with the operator gone, a cluster
    with the finalizer stays (deletionTimestamp set) until an operator releases it."""
    async with H.operator_running(run=False) as h:
        client = client_for(h.url)

        async def start() -> tuple[asyncio.Event, asyncio.Task[None]]:
            stop, ready = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(operator_task(h.rt, client, stop_flag=stop, ready_flag=ready))
            await asyncio.wait_for(ready.wait(), 30)
            return stop, task

        try:
            stop, task = await start()
            await h.create(H.cluster_object("held", "p"))
            await h.wait_for("finalizer", lambda: (h.emulator.live(f"{meta.API_VERSION}/{meta.PLURAL}", NS, "held") or {}).get("metadata", {}).get("finalizers"))
            stop.set()
            await asyncio.wait_for(task, 60)

            await h.api.delete(kube.CLUSTER, NS, "held")
            await asyncio.sleep(1)  # nobody releases it meanwhile
            held = h.emulator.live(f"{meta.API_VERSION}/{meta.PLURAL}", NS, "held")
            assert held is not None, "deleted although its finalizer was set"
            assert held["metadata"]["deletionTimestamp"] and held["metadata"]["finalizers"] == [FINALIZER]

            stop, task = await start()  # the operator comes back and releases it
            await h.wait_for("deletion", lambda: h.emulator.live(f"{meta.API_VERSION}/{meta.PLURAL}", NS, "held") is None)
            stop.set()
            await asyncio.wait_for(task, 60)
            assert len(h.emulator.collect_garbage()) == 11  # the children go with it (the NetworkPolicy too)
        finally:
            client.close()
