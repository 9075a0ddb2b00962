"""Test helper: a trace's records regrouped into per-agent blocks (what `GrowingTrace` loads), and a
`GrowingTrace` over them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from evolving_infra.traces.growing import GrowingTrace

Record = Mapping[str, Any]


def agent_blocks(records: Sequence[Record]) -> tuple[list[Record], list[list[Record]]]:
    """`(head, blocks)`: header and prefixes, then per agent (file order) its agent record, its requests in
    order and its branch ends (moved after its last request, which keeps the records valid)."""
    head = [r for r in records if r["kind"] in ("header", "prefix")]
    blocks: dict[str, list[Record]] = {r["agent"]: [r] for r in records if r["kind"] == "agent"}
    branch_agent: dict[str, str] = {}
    ends: dict[str, list[Record]] = {a: [] for a in blocks}
    for r in records:
        if r["kind"] == "request":
            blocks[r["agent"]].append(r)
            branch_agent[r["branch"]] = r["agent"]
        elif r["kind"] == "branch_end":
            ends[branch_agent[r["branch"]]].append(r)
    return head, [blocks[a] + ends[a] for a in blocks]


def flatten(head: list[Record], blocks: list[list[Record]]) -> list[Record]:
    return [*head, *(r for b in blocks for r in b)]


def growing(head: list[Record], blocks: list[list[Record]], asked: list[int] | None = None) -> GrowingTrace:
    """A `GrowingTrace` over the blocks; `asked` (if given) records which blocks were generated."""

    def block(i: int) -> list[Record]:
        if asked is not None:
            asked.append(i)
        return blocks[i]

    return GrowingTrace(head, block, len(blocks), source="blocks")
