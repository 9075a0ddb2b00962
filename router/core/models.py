"""Freezing the warmup fits of every node into node models (paper 5.1), for both drivers.

A node whose fit lacks a phase (a prefill node never decodes) borrows that phase from the first node that has
it: the nodes are identical hardware. If no node has a phase at all, `WarmupTooShort` says so.

Boundary: pure; fitters are passed in.
"""

from __future__ import annotations

from dataclasses import replace

from evolving_infra.core.types import NodeId
from evolving_infra.router.fitting import FittedNodeModel, ModelFitter


class WarmupTooShort(RuntimeError):
    """No node saw enough iterations of a phase during warmup to fit its model."""


def freeze_all(fitters: dict[NodeId, ModelFitter]) -> tuple[dict[NodeId, FittedNodeModel], list[str]]:
    """Freeze every node's fit; fill a missing phase from another node. Returns the models and messages."""
    frozen = {n: f.freeze() for n, f in fitters.items()}
    messages: list[str] = []
    donor_p = next((m for m in frozen.values() if m.prefill is not None), None)
    donor_d = next((m for m in frozen.values() if m.decode is not None), None)
    if donor_p is None or donor_d is None:
        missing = "prefill" if donor_p is None else "decode"
        raise WarmupTooShort(
            f"no node saw enough {missing} iterations during warmup to fit its model; lengthen --warmup, add "
            "agents, or use --models profile"
        )
    out: dict[NodeId, FittedNodeModel] = {}
    for n, m in frozen.items():
        if m.prefill is None:
            m = replace(m, prefill=donor_p.prefill, usage=donor_p.usage)
            messages.append(f"{n}: prefill model borrowed from {donor_p.node}")
        if m.decode is None:
            m = replace(m, decode=donor_d.decode)
            messages.append(f"{n}: decode model borrowed from {donor_d.node}")
        out[n] = m
    return out, messages
