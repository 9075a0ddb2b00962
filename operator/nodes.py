"""Tracking node agents into `status.nodes`: which pod serves each node, at which address, in which phase.

A node's phase comes, in order of trust, from its agent's own `GetState` (when it serves one phase), from
what status recorded before, or — for a node seen for the first time while its agent cannot tell (not
reachable yet, or collocated during warmup) — from the initial split: unknown nodes, in name order, fill
the prefill nodes the split still lacks, then decode.

Invariant: one entry per node, sorted by name; a node whose agent did not answer is `unreachable` and
keeps its last known phase (the split counts what nodes serve, never what was asked).

Boundary: pure functions on pod dicts, previous status entries and agent answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evolving_infra.core.types import Phase
from evolving_infra.node_agent.engine.outputs import SwitchState
from evolving_infra.operator.agents import AgentError, AgentState
from evolving_infra.operator.spec import InitialSplit
from evolving_infra.operator.status import NodeState, NodeStatus


@dataclass(frozen=True, slots=True)
class AgentPod:
    """A node agent pod as the operator reads it."""

    node: str
    pod: str
    address: str | None
    ready: bool
    created: str = ""


def _grpc_port(pod: Mapping[str, Any], default_port: int) -> int:
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == "grpc" and port.get("containerPort"):
                return int(port["containerPort"])
    return default_port


def agent_pod(pod: Mapping[str, Any], default_port: int) -> AgentPod | None:
    """The pod's node, address and readiness; None for a pod not scheduled yet or being deleted."""
    md, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    node = spec.get("nodeName")
    if not node or md.get("deletionTimestamp"):
        return None
    ip = status.get("podIP")
    address = None
    if ip:
        host = f"[{ip}]" if ":" in ip else ip
        address = f"{host}:{_grpc_port(pod, default_port)}"
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    return AgentPod(node=str(node), pod=str(md.get("name", "")), address=address, ready=ready, created=str(md.get("creationTimestamp", "")))


def pods_by_node(pods: Sequence[Mapping[str, Any]], default_port: int, allowed: frozenset[str] | None = None) -> dict[str, AgentPod]:
    """One pod per node (ready first, then newest), on the allowed nodes only when `allowed` is given."""
    out: dict[str, AgentPod] = {}
    for raw in pods:
        pod = agent_pod(raw, default_port)
        if pod is None or (allowed is not None and pod.node not in allowed):
            continue
        old = out.get(pod.node)
        if old is None or (pod.ready, pod.created, pod.pod) > (old.ready, old.created, old.pod):
            out[pod.node] = pod
    return out


def _fill_initial(unknown: Sequence[str], known: Mapping[str, Phase], initial: InitialSplit) -> dict[str, Phase]:
    have_prefill = sum(1 for p in known.values() if p is Phase.PREFILL)
    need_prefill = max(0, initial.prefill - have_prefill)
    return {name: Phase.PREFILL if i < need_prefill else Phase.DECODE for i, name in enumerate(sorted(unknown))}


def track(
    pods: Mapping[str, AgentPod],
    previous: Sequence[NodeStatus] | None,
    answers: Mapping[str, AgentState | AgentError],
    initial: InitialSplit,
) -> list[NodeStatus]:
    """New `status.nodes` from the pods, the previous entries and the agents' answers (keyed by node)."""
    before = {n.name: n for n in previous or ()}
    phase: dict[str, Phase] = {}
    unknown: list[str] = []
    for name in pods:
        answer = answers.get(name)
        if isinstance(answer, AgentState) and answer.phase is not None:
            phase[name] = answer.phase
        elif name in before:
            phase[name] = before[name].phase
        else:
            unknown.append(name)
    phase.update(_fill_initial(unknown, phase, initial))
    out = []
    for name in sorted(pods):
        pod, answer, old = pods[name], answers.get(name), before.get(name)
        generation = old.switch_generation if old is not None else 0
        if isinstance(answer, AgentState):
            generation = max(generation, answer.generation)
            state = NodeState.DRAINING if answer.switch_state is SwitchState.DRAINING else NodeState.SERVING
        else:
            state = NodeState.UNREACHABLE
        out.append(
            NodeStatus(
                name=name, pod=pod.pod, address=pod.address, phase=phase[name], state=state, switch_generation=generation
            )
        )
    return out


def count(nodes: Sequence[NodeStatus]) -> tuple[int, int]:
    """(prefill, decode) nodes."""
    prefill = sum(1 for n in nodes if n.phase is Phase.PREFILL)
    return prefill, len(nodes) - prefill


def serving(nodes: Sequence[NodeStatus]) -> int:
    return sum(1 for n in nodes if n.state is NodeState.SERVING)
