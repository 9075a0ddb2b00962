"""Busy-time spans of nodes (`NodeSpan`): a node serving a phase accumulates the durations of its iterations,
and its span is cut at every phase change and once it is `span_s` long, so the GPU idle fraction per phase can
be scored over any window.

An iteration is counted in the span in which it starts; busy time beyond a span's length carries over to the
next span, so a span's busy time never exceeds its length.

Boundary: span bookkeeping on `SimNode`; records go to `state.spans`.
"""

from __future__ import annotations

from evolving_infra.core.types import Phase
from evolving_infra.sim.records import NodeSpan
from evolving_infra.sim.state import ClusterState, SimNode


def account_busy(state: ClusterState, node: SimNode, start: float, duration: float) -> None:
    """Add an iteration to the node's busy time, cutting a span once it is `span_s` long."""
    if node.span_phase is None:
        return
    if start - node.span_start >= state.cfg.span_s:
        close_span(state, node, start)
    node.busy += duration


def close_span(state: ClusterState, node: SimNode, now: float, phase: Phase | None = None) -> None:
    """End the node's current span at `now` and start the next one serving `phase` (or the same phase)."""
    if node.span_phase is not None and now > node.span_start:
        length = now - node.span_start
        busy = min(node.busy, length)
        state.spans.append(NodeSpan(node.id, node.span_phase, node.span_start, now, busy))
        node.busy -= busy
    elif node.span_phase is None:
        node.busy = 0.0
    node.span_start = now
    if phase is not None:
        node.span_phase = phase


def stop_span(state: ClusterState, node: SimNode, now: float) -> None:
    """The node stops serving a phase (switch begins, relaunch): close its span and start none."""
    close_span(state, node, now)
    node.span_phase = None
    node.busy = 0.0
