"""The live driver of the control core (`router.core.control.ControlCore`) and the two ways a switch order is
carried out (`SplitApplier`).

`ControlLoop` delivers the core's ticks on the router's clock (`LiveRouter.now`: seconds since it started) and
carries out its effects; every decision (warmup, model refresh, planner ticks, switch orders and generations) is
the core's, exactly as in the simulator. Node reports (`reports.NodeReports`) deliver the other events.

- `LocalSplitApplier` (local cluster): calls each ordered node's SwitchPhase itself, all at once, each with its
  deadline, in the order's mode (in place, in place dropping the node's KV, or a relaunch with its downtime). The
  node hands its queued requests back and finishes its running ones in place; it streams the hand-back as the
  switch begins (`HandedBack`), so their attempts are routed again elsewhere during the drain (the answer lists
  them again; ids already re-routed are ignored); the answer (or the node's next state report) completes the
  switch in the core. A failed call returns the node to its old phase in the core (the node refused, so it still
  serves it).
- `KubernetesSplitApplier`: writes `status.targetSplit` (counts, split, generation, moving nodes, mode, the
  planner's decision and candidates) and `status.fittedModels` on the AgentServingCluster with the router's own
  field manager (a merge patch of `/status`; never the spec); the operator carries the switch out, and the router
  learns of the hand-backs (re-routed at once) and the completion from the nodes' event streams.

Boundary: asyncio orchestration; decisions are the control core's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import grpc

from evolving_infra.core.types import NodeId, Phase
from evolving_infra.router.core import PushCounts
from evolving_infra.router.core.control import ControlEffect, ModelsFrozen, PlannerDecided, SwitchOrder, record_json
from evolving_infra.router.fitting import FitQuality
from evolving_infra.router.planner import CandidateVerdict, OursDiagnostics, PlannerDecision, SwitchMode
from evolving_infra.router.service.backend import LiveRouter

log = logging.getLogger(__name__)

GROUP = "serving.evolving-infra.io"
VERSION = "v1alpha1"
PLURAL = "agentservingclusters"
ROUTER_FIELD_MANAGER = "evolving-infra-router"
"""The CR's coordinates and the router's field manager (the operator's `meta` module names the same)."""

POLL_S = 0.25
"""The control loop checks this often whether a tick is due (a switch's completion can make one due at once)."""


class SplitApplier(Protocol):
    async def apply(self, orders: Sequence[SwitchOrder], decided: PlannerDecided | None, now: float) -> None:
        """Carry out `orders` (of `decided`, or the end of the warmup when None), decided at router time `now`."""
        ...


class LocalSplitApplier:
    """Calls SwitchPhase on the ordered nodes itself (see the module docstring)."""

    def __init__(self, router: LiveRouter) -> None:
        self.router = router

    async def apply(self, orders: Sequence[SwitchOrder], decided: PlannerDecided | None, now: float) -> None:
        await asyncio.gather(*(self._one(order) for order in orders))

    async def _one(self, order: SwitchOrder) -> None:
        router = self.router
        node, phase = order.node, order.phase
        started = time.monotonic()
        extra: dict[str, Any] = {}
        if order.mode is not SwitchMode.IN_PLACE:
            extra = {"mode": order.mode, "relaunch_s": order.relaunch_s}
        try:
            answer = await router.clients[node].switch_phase(
                phase, order.generation, router.settings.switch_timeout_s + order.relaunch_s, **extra
            )
        except grpc.aio.AioRpcError as error:
            log.warning("node %s: switch to %s failed: %s %s", node, phase.value, error.code().name, error.details())
            router.metrics.switches.labels(to_phase=phase.value, outcome="failed").inc()
            router.control.switch_failed(node, router.now(), f"{error.code().name}: {error.details()}")
            return
        router.generation_seen(node, order.generation)
        router.handed_back(node, list(answer.handed_back))
        if router.core.nodes[node].target is not None:
            router.switch_done(node, phase)
        router.metrics.switches.labels(to_phase=phase.value, outcome="completed").inc()
        router.metrics.switch_seconds.observe(time.monotonic() - started)


class KubernetesSplitApplier:
    """Writes the target split to the CR's status (see the module docstring). `api` is a kubernetes
    `CustomObjectsApi` (or anything with its `patch_namespaced_custom_object_status`)."""

    def __init__(
        self, router: LiveRouter, api: Any, namespace: str, name: str, *,
        field_manager: str = ROUTER_FIELD_MANAGER, clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:  # fmt: skip
        self.router, self.api, self.namespace, self.name = router, api, namespace, name
        self.field_manager = field_manager
        self.clock = clock

    async def apply(self, orders: Sequence[SwitchOrder], decided: PlannerDecided | None, now: float) -> None:
        if not orders:
            return
        target = {n: t.serving_phase() for n, t in self.router.core.nodes.items() if t.target is not None or t.phase}
        target.update({o.node: o.phase for o in orders})
        decision = decided.decision if decided is not None else None
        body = {"status": self.status(target, orders, decision)}
        await asyncio.to_thread(
            self.api.patch_namespaced_custom_object_status, GROUP, VERSION, self.namespace, PLURAL, self.name, body,
            field_manager=self.field_manager,
        )  # fmt: skip

    def status(
        self, target: Mapping[NodeId, Phase], orders: Sequence[SwitchOrder], decision: PlannerDecision | None
    ) -> dict[str, Any]:
        p = sum(1 for phase in target.values() if phase is Phase.PREFILL)
        d = len(target) - p
        first = orders[0]
        out_target: dict[str, Any] = {
            "prefill": p,
            "decode": d,
            "split": f"{p}P{d}D",
            "switchGeneration": first.generation,
            "moving": [o.node for o in orders],
            "mode": first.mode.value,
            "relaunchSeconds": first.relaunch_s,
        }
        if decision is not None:
            out_target["decision"] = _decision(decision, self.router.settings.planner, self.clock())
        out: dict[str, Any] = {"targetSplit": out_target}
        fitted = fitted_models(self.router, self.clock())
        if fitted:
            out["fittedModels"] = fitted
        return out


def _decision(decision: PlannerDecision, planner: str, at: datetime) -> dict[str, Any]:
    candidates = []
    diagnostics = decision.diagnostics
    if isinstance(diagnostics, OursDiagnostics):
        for c in diagnostics.candidates:
            candidates.append({
                "prefill": c.prefill_count, "split": c.split, "meanGain": c.mean_gain, "stderr": c.std_error,
                "qualified": c.verdict is CandidateVerdict.QUALIFIED, "verdict": c.verdict.value,
                "prefillKvPages": c.prefill_kv_pages, "prefillUtilization": c.prefill_utilization,
            })  # fmt: skip
    return {
        "decidedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "planner": planner,
        "outcome": decision.outcome.value,
        "reason": decision.reason[:4096],
        "candidates": candidates,
    }


def fitted_models(router: LiveRouter, at: datetime) -> list[dict[str, Any]]:
    """`status.fittedModels`: the frozen warmup fits (empty when the models come from the profile)."""
    out = []
    for node, model in sorted(router.control.models.fitted.items()):
        entry: dict[str, Any] = {"node": node, "fittedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        if model.prefill is not None:
            c = model.prefill
            entry["prefill"] = {"c0": c.c0, "c1": c.c1, "c2": c.c2, "c3": c.c3, **_quality(model.prefill_quality)}
        if model.decode is not None:
            dc = model.decode
            entry["decode"] = {"d0": dc.d0, "d1": dc.d1, "d2": dc.d2, **_quality(model.decode_quality)}
        out.append(entry)
    return out


def _quality(quality: FitQuality | None) -> dict[str, Any]:
    """A fit's `heldOutError` and `samples` (the iterations it was fitted on); nothing for a borrowed phase."""
    if quality is None:
        return {}
    out: dict[str, Any] = {"samples": quality.train_samples}
    if quality.held_out_error is not None:
        out["heldOutError"] = quality.held_out_error
    return out


class ControlLoop:
    """Delivers the control core's ticks on the router's clock and carries out its effects (module docstring)."""

    def __init__(self, router: LiveRouter, applier: SplitApplier | None) -> None:
        self.router = router
        self.applier = applier
        self._applying: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._logged = 0

    def start(self) -> None:
        """Start the cluster's control (warmup or split) now and tick from then on."""
        router = self.router
        self.carry_out(router.control.start(router.now()))
        self._task = asyncio.get_running_loop().create_task(self._run(), name="control")

    async def close(self) -> None:
        self._write_log()
        for task in (self._task, *self._applying):
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                    pass

    async def _run(self) -> None:
        router = self.router
        while True:
            # polled: an event (a switch completing during the staged end of the warmup) can make a tick due
            # earlier than the one this loop last waited for
            at = router.control.next_tick_at
            wait = POLL_S if at is None else at - router.now()
            if wait > 0:
                await asyncio.sleep(min(wait, POLL_S))
                continue
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - one bad tick must not stop the cluster's control
                log.exception("control tick failed")
            self._write_log()

    def tick(self) -> list[ControlEffect]:
        """Deliver one tick at the router's time now and carry out what it returns."""
        effects = self.router.control.tick(self.router.now())
        self.carry_out(effects)
        return effects

    def _write_log(self) -> None:
        """Append the control records not written yet to `settings.control_log` (JSON lines)."""
        path = self.router.settings.control_log
        records = self.router.control.log
        if path is None or self._logged >= len(records):
            return
        with open(path, "a", encoding="utf-8") as out:
            for record in records[self._logged :]:
                out.write(json.dumps(record_json(record)) + "\n")
        self._logged = len(records)

    def carry_out(self, effects: Sequence[ControlEffect]) -> None:
        router = self.router
        self._write_log()
        orders: list[SwitchOrder] = []
        decided: PlannerDecided | None = None
        for effect in effects:
            if isinstance(effect, PushCounts):
                router.push([effect])
            elif isinstance(effect, ModelsFrozen):
                for message in effect.messages:
                    (log.warning if effect.fallback else log.info)("warmup: %s", message)
            elif isinstance(effect, PlannerDecided):
                decided = effect
                router.metrics.decisions.labels(outcome=effect.decision.outcome.value).inc()
            elif isinstance(effect, SwitchOrder):
                orders.append(effect)
        router.refresh_gauges()
        if not orders:
            return
        if self.applier is None:
            for order in orders:  # nobody carries switches out: they are logged and counted only
                router.control.switch_failed(order.node, router.now(), "no applier")
            return
        task = asyncio.get_running_loop().create_task(self.applier.apply(orders, decided, router.now()))
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)
