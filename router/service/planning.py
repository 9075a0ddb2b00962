"""The live planner loop and the two ways a split change is applied (`SplitApplier`).

Every `planner.interval_s` (after `warmup_s`, when the warmup fits are frozen into node models) the router
remeasures the node models from the window's usage counts, builds the planner's observation from the core,
asks the planner, and hands a SWITCH decision, as node moves (`RouterCore.split_change`), to its applier with a
switch generation above every node's. In both appliers the router first stops routing old-phase work to the
moving nodes (`RouterCore.switch_begun`).

- `LocalSplitApplier` (local cluster): calls each moving node's SwitchPhase itself, all at once, each with its
  deadline. The node hands its queued requests back and finishes its running ones in place; it streams the
  hand-back as the switch begins (`HandedBack`), so their attempts are routed again elsewhere during the drain
  (the answer lists them again; ids already re-routed are ignored); the answer completes the switch in the core. A failed call returns the node to its old
  phase in the router's view (the node refused, so it still serves it).
- `KubernetesSplitApplier`: writes `status.targetSplit` (counts, split, generation, moving nodes, the planner's
  decision and candidates) and `status.fittedModels` on the AgentServingCluster with the router's own field
  manager (a merge patch of `/status`; never the spec); the operator carries the switch out, and the router
  learns of the hand-backs (re-routed at once) and the completion from the nodes' event streams.

Boundary: asyncio orchestration; decisions are the planner's and the core's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import grpc

from evolving_infra.core.types import NodeId, Phase
from evolving_infra.router.core import SplitChange
from evolving_infra.router.core.models import WarmupTooShort, freeze_all
from evolving_infra.router.planner import (
    CandidateVerdict,
    OursDiagnostics,
    Planner,
    PlannerDecision,
    WindowConfig,
    make_planner,
)
from evolving_infra.router.service.backend import LiveRouter
from evolving_infra.router.service.models import refreshed

log = logging.getLogger(__name__)

GROUP = "serving.evolving-infra.io"
VERSION = "v1alpha1"
PLURAL = "agentservingclusters"
ROUTER_FIELD_MANAGER = "evolving-infra-router"
"""The CR's coordinates and the router's field manager (the operator's `meta` module names the same)."""


class SplitApplier(Protocol):
    async def apply(self, change: SplitChange, generation: int, now: float) -> None:
        """Carry out `change` with switch generation `generation` (decided at router time `now`)."""
        ...


class LocalSplitApplier:
    """Calls SwitchPhase on the moving nodes itself (see the module docstring)."""

    def __init__(self, router: LiveRouter) -> None:
        self.router = router

    async def apply(self, change: SplitChange, generation: int, now: float) -> None:
        for switch in change.switches:
            self.router.core.switch_begun(switch.node, switch.phase)
        await asyncio.gather(*(self._one(s.node, s.phase, generation) for s in change.switches))

    async def _one(self, node: NodeId, phase: Phase, generation: int) -> None:
        router = self.router
        started = time.monotonic()
        try:
            answer = await router.clients[node].switch_phase(phase, generation, router.settings.switch_timeout_s)
        except grpc.aio.AioRpcError as error:
            log.warning("node %s: switch to %s failed: %s %s", node, phase.value, error.code().name, error.details())
            router.metrics.switches.labels(to_phase=phase.value, outcome="failed").inc()
            router.core.nodes[node].target = None
            return
        router.generations[node] = max(router.generations.get(node, 0), generation)
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

    async def apply(self, change: SplitChange, generation: int, now: float) -> None:
        for switch in change.switches:
            self.router.core.switch_begun(switch.node, switch.phase)
        body = {"status": self.status(change, generation)}
        await asyncio.to_thread(
            self.api.patch_namespaced_custom_object_status, GROUP, VERSION, self.namespace, PLURAL, self.name, body,
            field_manager=self.field_manager,
        )  # fmt: skip

    def status(self, change: SplitChange, generation: int) -> dict[str, Any]:
        p, d = change.split
        decision = change.decision
        target: dict[str, Any] = {
            "prefill": p,
            "decode": d,
            "split": f"{p}P{d}D",
            "switchGeneration": generation,
            "moving": [s.node for s in change.switches],
            "decision": _decision(decision, self.router.settings.planner.value, self.clock()),
        }
        out: dict[str, Any] = {"targetSplit": target}
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
    for node, model in sorted(router.fitted.items()):
        entry: dict[str, Any] = {"node": node, "fittedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        if model.prefill is not None:
            c = model.prefill
            entry["prefill"] = {"c0": c.c0, "c1": c.c1, "c2": c.c2, "c3": c.c3}
        if model.decode is not None:
            dc = model.decode
            entry["decode"] = {"d0": dc.d0, "d1": dc.d1, "d2": dc.d2}
        out.append(entry)
    return out


class PlannerLoop:
    """Runs the planner on the router's core (see the module docstring)."""

    def __init__(self, router: LiveRouter, applier: SplitApplier | None, planner: Planner | None = None) -> None:
        s = router.settings
        settings = dict(s.planner_settings)
        if s.planner.value == "ours" and "window" not in settings:
            settings.setdefault("window_s", s.window_s)
            settings.setdefault("slices", s.slices)
        self.router = router
        self.planner = planner if planner is not None else make_planner(s.planner, **settings)
        self.applier = applier
        self.warm = s.warmup_s <= 0
        self._applying: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        if self.warm:
            window = getattr(getattr(self.planner, "settings", None), "window", None)
            router.core.start_window(window if isinstance(window, WindowConfig) else WindowConfig(s.window_s, s.slices), router.now())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="planner")

    async def close(self) -> None:
        for task in (self._task, self._applying):
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                    pass

    async def _run(self) -> None:
        router = self.router
        if not self.warm:
            await asyncio.sleep(router.settings.warmup_s)
            self.end_warmup()
        while True:
            await asyncio.sleep(self.planner.interval_s)
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - one bad tick must not stop planning
                log.exception("planner tick failed")

    def end_warmup(self) -> None:
        """Freeze the warmup fits into node models (profile models stay where a fit is impossible)."""
        router = self.router
        fitters = {n: t.fitter for n, t in router.core.nodes.items() if t.fitter is not None}
        try:
            fitted, messages = freeze_all(fitters)  # type: ignore[arg-type]
            router.fitted = fitted
            for message in messages:
                log.info("warmup: %s", message)
        except WarmupTooShort as error:
            log.warning("warmup: %s; keeping the profile's models", error)
        for track in router.core.nodes.values():
            track.fitter = None
        self.warm = True
        s = router.settings
        router.core.start_window(WindowConfig(s.window_s, s.slices), router.now())

    async def tick(self) -> SplitChange | None:
        """One planning step: models, observation, decision, and (for a switch) its application."""
        router, core = self.router, self.router.core
        now = router.now()
        if any(t.phase is None for t in core.nodes.values()):
            return None  # a node serves no phase (down or collocated): nothing to plan over
        previous: Mapping[NodeId, object] = dict(core.planner_models)
        core.refresh_models(lambda t, usage: refreshed(router.shape, router.fitted.get(t.id), previous.get(t.id), usage))
        decision = self.planner.decide(core.observation(now), now)
        router.metrics.decisions.labels(outcome=decision.outcome.value).inc()
        change = core.split_change(decision)
        if change is None or not change.switches or self.applier is None:
            return change
        if self._applying is not None and not self._applying.done():
            return None
        generation = max(router.generations.values(), default=0) + 1
        self._applying = asyncio.get_running_loop().create_task(self.applier.apply(change, generation, now))
        return change
