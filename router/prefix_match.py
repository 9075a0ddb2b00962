"""The answer of a KV-directory lookup: longest cached prefixes of one prompt, per node and tier.

All lengths are in pages, counted from the prompt's first page. A node is listed in a mapping only when its
length is positive. `fetch_plan(node)` tells a prefill node which pages of its reachable prefix it lacks and
which peers hold each of them in host memory (the shared pool), so it can fetch them while it queues.

Boundary: an immutable value computed by a directory's lookup (`match_from_stretches`); it keeps the holder
masks of the prompt's held prefix as stretches of equal masks (node index i: bit 3i GPU memory, 3i + 1 host
memory, 3i + 2 either), so that fetch plans need no second directory walk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat

import numpy as np

from evolving_infra.core.fetch import FetchRun
from evolving_infra.core.types import NodeId


@lru_cache(maxsize=64)
def _host_bits(nodes: int) -> int:
    """The mask with the host-memory bit (3i + 1) of each of `nodes` node indexes set."""
    return sum(1 << (3 * i + 1) for i in range(nodes))


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """How `node` gets the prompt's reachable prefix.

    cached: leading pages the node holds itself (GPU or host); reachable: leading pages it holds or can
    fetch from a peer's host memory; runs: the pages of the reachable prefix it lacks, with their sources.
    """

    node: NodeId
    cached: int
    reachable: int
    runs: tuple[FetchRun, ...]

    @property
    def fetch_pages(self) -> int:
        """Pages to fetch from peers (the paper's x_n, in pages)."""
        return sum(run.count for run in self.runs)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Longest cached prefixes of a prompt of `pages` pages.

    anywhere: leading pages each held by some node in some tier.
    pooled: leading pages each held by some node in host memory (fetchable by every node).
    gpu / host / either: per node, leading pages it holds in GPU memory / host memory / either tier
    (either: each page in at least one of the two tiers of that node).
    reachable: per node, leading pages it holds itself in either tier or some node holds in host memory.
    """

    pages: int
    anywhere: int
    pooled: int
    gpu: Mapping[NodeId, int]
    host: Mapping[NodeId, int]
    either: Mapping[NodeId, int]
    reachable: Mapping[NodeId, int]
    _stretches: list[tuple[int, int]] = field(repr=False, compare=False)
    """(first page, mask) of consecutive stretches covering the held prefix [0, anywhere), each page of a
    stretch with that directory mask (adjacent stretches may have equal masks)."""
    _index: Mapping[NodeId, int] = field(repr=False, compare=False)  # node -> its GPU bit index (3i)
    _ids: tuple[NodeId | None, ...] = field(repr=False, compare=False)

    def reachable_for(self, node: NodeId) -> int:
        """Reachable prefix of `node`; for a node the directory does not know, the pooled prefix."""
        return self.reachable.get(node, self.pooled if node not in self._index else 0)

    def fetch_plan(self, node: NodeId) -> FetchPlan:
        """Which pages of its reachable prefix `node` lacks, grouped in runs of equal host holders."""
        bit_index = self._index.get(node)
        own = 0 if bit_index is None else 4 << bit_index
        host_bits = _host_bits(len(self._ids))
        reachable = self.reachable_for(node)
        runs: list[FetchRun] = []
        start = -1
        current = 0
        # Page i's peers depend only on its mask: walk the stretches of equal masks, not the pages.
        for lo, mask in self._stretches:
            if lo >= reachable:
                break
            peers = 0 if mask & own else mask & host_bits
            if peers != current:
                if current:
                    runs.append(FetchRun(start, lo, self._nodes(current)))
                start, current = lo, peers
        if current:
            runs.append(FetchRun(start, reachable, self._nodes(current)))
        return FetchPlan(node=node, cached=self.either.get(node, 0), reachable=reachable, runs=tuple(runs))

    def columns(self, nodes: Sequence[NodeId]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(gpu, either, reachable, fetch pages) of `nodes` as int64 arrays: for every node the same numbers as
        `gpu`, `either`, `reachable_for` and `fetch_plan(node).fetch_pages`, from one pass over the stretches
        of equal masks (a page of the reachable prefix is fetched exactly when the node does not hold it)."""
        count = len(nodes)
        index = self._index
        # C-level maps over the nodes (no Python step per node): this runs for every node at every decision
        gpu = np.fromiter(map(self.gpu.get, nodes, repeat(0)), np.int64, count)
        either = np.fromiter(map(self.either.get, nodes, repeat(0)), np.int64, count)
        if all(map(index.__contains__, nodes)):  # `reachable_for` of known nodes
            reach = np.fromiter(map(self.reachable.get, nodes, repeat(0)), np.int64, count)
        else:
            reach = np.fromiter(map(self.reachable_for, nodes), np.int64, count)
        stretches = self._stretches
        if not stretches or not reach.any():
            return gpu, either, reach, np.zeros(count, np.int64)
        los = np.fromiter((lo for lo, _ in stretches), np.int64, len(stretches))
        his = np.append(los[1:], self.anywhere)
        width = (3 * len(self._ids) + 7) // 8
        raw = b"".join(mask.to_bytes(width, "little") for _, mask in stretches)
        bits = np.unpackbits(np.frombuffer(raw, np.uint8).reshape(len(stretches), width), axis=1, bitorder="little")
        slot = np.fromiter(map(index.get, nodes, repeat(-3)), np.int64, count) + 2  # either bit 3i + 2; -1 unknown
        held = np.where(slot >= 0, bits[:, np.maximum(slot, 0)], 0)
        overlap = np.maximum(np.minimum(his[:, None], reach[None, :]) - los[:, None], 0)  # np.clip costs 10x
        fetch = (overlap * (1 - held)).sum(axis=0)
        return gpu, either, reach, fetch

    def _nodes(self, mask: int) -> frozenset[NodeId]:
        out = []
        while mask:
            low = mask & -mask
            node = self._ids[(low.bit_length() - 1) // 3]
            if node is not None:
                out.append(node)
            mask ^= low
        return frozenset(out)


def bits_of(mask: int, ids: Sequence[NodeId | None]) -> list[tuple[int, NodeId]]:
    """(bit index, node) of every set bit of `mask` that belongs to a known node, lowest bit first."""
    if mask <= 0:
        return []
    if mask.bit_count() > 8:  # many bits: find them with numpy rather than one Python step per bit
        raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), np.uint8)
        indexes = np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()
    else:
        indexes = []
        while mask:
            low = mask & -mask
            indexes.append(low.bit_length() - 1)
            mask ^= low
    count = len(ids)
    return [(b, node) for b in indexes if b // 3 < count and (node := ids[b // 3]) is not None]


def match_from_stretches(
    pages: int,
    stretches: list[tuple[int, int]],
    end: int,
    index: Mapping[NodeId, int],
    ids: tuple[NodeId | None, ...],
    host_bits: int,
    either_bits: int,
) -> PrefixMatch:
    """The `PrefixMatch` of a prompt of `pages` pages whose held prefix [0, end) has these stretches.

    A bit 3i + t survives the AND of the masks while node i holds every page so far in tier t, so a node's
    prefix in a tier ends at the first stretch lacking its bit. `host_bits` / `either_bits`: the host / either
    bit of every node index in use.
    """
    tiers: tuple[dict[NodeId, int], dict[NodeId, int], dict[NodeId, int]] = ({}, {}, {})
    pooled = end
    if stretches:
        acc = stretches[0][1]
        for lo, mask in stretches:
            if not mask & host_bits and pooled == end:
                pooled = lo
            dropped = acc & ~mask
            if dropped:
                for bit_index, node in bits_of(dropped, ids):
                    tiers[bit_index % 3][node] = lo
                acc &= mask
        for bit_index, node in bits_of(acc, ids):
            tiers[bit_index % 3][node] = end
    reachable: dict[NodeId, int] = dict.fromkeys([n for n in ids if n is not None], pooled) if pooled else {}
    if pooled < end:
        # Only pages no node holds in host memory constrain a node: its reachable prefix ends at the first such
        # page it does not hold itself (its either bit is clear there).
        acc = either_bits
        for lo, mask in stretches:
            if lo < pooled or mask & host_bits:
                continue
            dropped = acc & ~mask
            if dropped:
                if lo:  # a node lacking the first such page keeps the pooled prefix (or none when it is 0)
                    for _, node in bits_of(dropped, ids):
                        reachable[node] = lo
                acc &= mask
                if not acc:
                    break
        for _, node in bits_of(acc, ids):
            reachable[node] = end
    return PrefixMatch(
        pages=pages,
        anywhere=end,
        pooled=pooled,
        gpu=tiers[0],
        host=tiers[1],
        either=tiers[2],
        reachable=reachable,
        _stretches=stretches,
        _index=index,
        _ids=ids,
    )
