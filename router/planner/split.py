"""Phase splits: the `4P5D` notation and the candidate split that changes the fewest nodes.

Boundary: pure functions over `{node: phase}` maps; no models, no time.

Invariant of `fewest_changes_split`: the returned split has exactly `prefill_count` prefill nodes and differs
from the current split in exactly `|prefill_count - |P||` nodes, all moved in the same direction; which nodes
move is deterministic (lowest move cost first, then node id).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from evolving_infra.core.types import NodeId, Phase

_SPLIT_RE = re.compile(r"^\s*(\d+)\s*P\s*(\d+)\s*D\s*$", re.IGNORECASE)


def split_counts(phases: Mapping[NodeId, Phase]) -> tuple[int, int]:
    """(prefill nodes, decode nodes) of a split."""
    prefill = sum(1 for phase in phases.values() if phase is Phase.PREFILL)
    return prefill, len(phases) - prefill


def format_split(phases: Mapping[NodeId, Phase]) -> str:
    """`{...}` -> `4P5D`."""
    prefill, decode = split_counts(phases)
    return f"{prefill}P{decode}D"


def parse_split(text: str) -> tuple[int, int]:
    """`4P5D` -> (4, 5). Raises ValueError naming the expected form."""
    match = _SPLIT_RE.match(text)
    if match is None:
        raise ValueError(f"split {text!r} is not of the form '<prefill>P<decode>D', e.g. '4P5D'")
    return int(match.group(1)), int(match.group(2))


def prefill_nodes(phases: Mapping[NodeId, Phase]) -> tuple[NodeId, ...]:
    """Prefill nodes in id order."""
    return tuple(sorted(n for n, phase in phases.items() if phase is Phase.PREFILL))


def decode_nodes(phases: Mapping[NodeId, Phase]) -> tuple[NodeId, ...]:
    """Decode nodes in id order."""
    return tuple(sorted(n for n, phase in phases.items() if phase is Phase.DECODE))


def changed_nodes(current: Mapping[NodeId, Phase], target: Mapping[NodeId, Phase]) -> tuple[NodeId, ...]:
    """Nodes whose phase differs between two splits of the same nodes, in id order."""
    if set(current) != set(target):
        missing = sorted(set(current) ^ set(target))
        raise ValueError(f"splits cover different nodes; nodes in only one of them: {missing}")
    return tuple(sorted(n for n in current if current[n] is not target[n]))


def nodes_to_move(
    current: Mapping[NodeId, Phase],
    prefill_count: int,
    move_cost: Mapping[NodeId, float] | None = None,
) -> tuple[NodeId, ...]:
    """The nodes that change phase to reach `prefill_count` prefill nodes with the fewest changes.

    Nodes are taken from the pool that shrinks, cheapest first by `move_cost` (missing = 0), then by id.
    """
    total = len(current)
    if not 0 <= prefill_count <= total:
        raise ValueError(f"prefill_count must be in [0, {total}] for {total} nodes, got {prefill_count}")
    have, _ = split_counts(current)
    if prefill_count == have:
        return ()
    donor = Phase.DECODE if prefill_count > have else Phase.PREFILL
    costs = move_cost or {}
    pool = sorted((n for n, phase in current.items() if phase is donor), key=lambda n: (costs.get(n, 0.0), n))
    return tuple(sorted(pool[: abs(prefill_count - have)]))


def fewest_changes_split(
    current: Mapping[NodeId, Phase],
    prefill_count: int,
    move_cost: Mapping[NodeId, float] | None = None,
) -> dict[NodeId, Phase]:
    """The split with `prefill_count` prefill nodes that changes the fewest nodes of `current`."""
    moved = set(nodes_to_move(current, prefill_count, move_cost))
    return {n: (phase.other if n in moved else phase) for n, phase in current.items()}
