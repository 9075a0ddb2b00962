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
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat

import numpy as np

from evolving_infra.core.fetch import FetchRun
from evolving_infra.core.types import NodeId


FEW_HOLDER_BITS = 48
"""`PrefixMatch.columns` walks the holders in Python when the prefix's masks set at most this many bits together
(at most 16 nodes hold a page of it); otherwise it uses array passes over every node."""


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


class PrefixMatch:
    """Longest cached prefixes of a prompt of `pages` pages.

    anywhere: leading pages each held by some node in some tier.
    pooled: leading pages each held by some node in host memory (fetchable by every node).
    gpu / host / either: per node, leading pages it holds in GPU memory / host memory / either tier
    (either: each page in at least one of the two tiers of that node).
    reachable: per node, leading pages it holds itself in either tier or some node holds in host memory.

    The per-node mappings are built from the stretches when first read (a router reads them for the few nodes it
    views; `columns` prices every node from the stretches directly). Immutable; equal when the public fields are.
    """

    __slots__ = ("pages", "anywhere", "pooled", "_stretches", "_index", "_ids", "_host_bits", "_either_bits",
                 "_tiers", "_reachable")  # fmt: skip

    def __init__(
        self,
        pages: int,
        anywhere: int,
        pooled: int,
        stretches: list[tuple[int, int]],
        index: Mapping[NodeId, int],
        ids: tuple[NodeId | None, ...],
        host_bits: int,
        either_bits: int,
    ) -> None:
        self.pages = pages
        self.anywhere = anywhere
        self.pooled = pooled
        self._stretches = stretches
        """(first page, mask) of consecutive stretches covering the held prefix [0, anywhere), each page of a
        stretch with that directory mask (adjacent stretches may have equal masks)."""
        self._index = index  # node -> its GPU bit index (3i)
        self._ids = ids
        self._host_bits = host_bits
        self._either_bits = either_bits
        self._tiers: tuple[dict[NodeId, int], dict[NodeId, int], dict[NodeId, int]] | None = None
        self._reachable: dict[NodeId, int] | None = None

    @property
    def gpu(self) -> Mapping[NodeId, int]:
        return self._tier_maps()[0]

    @property
    def host(self) -> Mapping[NodeId, int]:
        return self._tier_maps()[1]

    @property
    def either(self) -> Mapping[NodeId, int]:
        return self._tier_maps()[2]

    @property
    def reachable(self) -> Mapping[NodeId, int]:
        if self._reachable is None:
            self._reachable = _reachable_map(self.pooled, self.anywhere, self._stretches, self._ids, self._host_bits,
                                             self._either_bits)  # fmt: skip
        return self._reachable

    def _tier_maps(self) -> tuple[dict[NodeId, int], dict[NodeId, int], dict[NodeId, int]]:
        if self._tiers is None:
            self._tiers = _tier_maps(self.anywhere, self._stretches, self._ids)
        return self._tiers

    def _fields(self) -> tuple[object, ...]:
        return (self.pages, self.anywhere, self.pooled, self.gpu, self.host, self.either, self.reachable)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrefixMatch):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable caches inside: not hashable

    def __repr__(self) -> str:
        names = ("pages", "anywhere", "pooled", "gpu", "host", "either", "reachable")
        return "PrefixMatch(" + ", ".join(f"{k}={v!r}" for k, v in zip(names, self._fields(), strict=True)) + ")"

    def gpu_pages(self, node: NodeId) -> int:
        """`gpu.get(node, 0)`, without building the mapping of every node."""
        bit = self._index.get(node)
        return 0 if bit is None else self._held_run(1 << bit)

    def either_pages(self, node: NodeId) -> int:
        """`either.get(node, 0)`, without building the mapping of every node."""
        bit = self._index.get(node)
        return 0 if bit is None else self._held_run(4 << bit)

    def _held_run(self, bit: int) -> int:
        """Leading pages whose masks all have `bit` (a one-bit mask)."""
        for lo, mask in self._stretches:
            if not mask & bit:
                return lo
        return self.anywhere

    def reachable_for(self, node: NodeId) -> int:
        """Reachable prefix of `node` (`reachable.get(node, 0)`); for a node the directory does not know, the
        pooled prefix."""
        bit = self._index.get(node)
        if bit is None:
            return self.pooled
        if self._reachable is not None:
            return self._reachable.get(node, 0)
        pooled = self.pooled
        if pooled >= self.anywhere:
            return pooled
        either, host = 4 << bit, self._host_bits
        for lo, mask in self._stretches:  # the first page past `pooled` no host holds and the node lacks
            if lo >= pooled and not mask & host and not mask & either:
                return lo
        return self.anywhere

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
        return FetchPlan(node=node, cached=self.either_pages(node), reachable=reachable, runs=tuple(runs))

    def columns(self, nodes: Sequence[NodeId]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(gpu, either, reachable, fetch pages) of `nodes` as int64 arrays: for every node the same numbers as
        `gpu`, `either`, `reachable_for` and `fetch_plan(node).fetch_pages`, from the stretches' holder bits as one
        0/1 matrix (stretch x bit): a node's prefix in a tier ends at the first stretch lacking its bit, its
        reachable prefix at the first stretch past `pooled` that no host holds and it lacks, and a page of the
        reachable prefix is fetched exactly when the node does not hold it."""
        count = len(nodes)
        known, both, has_slot, where = _slots(nodes, self._index)
        stretches, end, pooled = self._stretches, self.anywhere, self.pooled
        if not stretches:
            zero = np.zeros(count, np.int64)
            return zero, zero, zero, zero
        union = 0
        for _, mask in stretches:
            union |= mask
        if union.bit_count() <= FEW_HOLDER_BITS:
            return self._few_holders(count, where, union)
        rows = len(stretches)
        los = np.fromiter((lo for lo, _ in stretches), np.int64, rows)
        width = (3 * len(self._ids) + 7) // 8
        raw = b"".join(mask.to_bytes(width, "little") for _, mask in stretches) + bytes(width)  # + an empty row
        bits = np.unpackbits(np.frombuffer(raw, np.uint8).reshape(rows + 1, width), axis=1, bitorder="little")
        ends = np.append(los, end)  # ends[k]: where a prefix ends whose first missing stretch is k (k = rows: none)
        held = bits[:, both]  # GPU bits, then either bits, of every node; the empty row ends every prefix
        prefix = ends[held.argmin(axis=0)]
        gpu, either = prefix[:count], prefix[count:]
        held = held[:rows, count:]
        if not known:
            gpu, either, held = gpu * has_slot, either * has_slot, held * has_slot
        if pooled < end:
            first = next(k for k, (lo, _) in enumerate(stretches) if lo >= pooled)  # the stretch starting at pooled
            hosted = np.fromiter((bool(mask & self._host_bits) for _, mask in stretches[first:]), bool, rows - first)
            lacking = held[first:][~hosted] == 0  # stretches past pooled no host holds: where each node lacks one
            lows = ends[first:-1][~hosted]
            reach = np.where(lacking.any(axis=0), lows[lacking.argmax(axis=0)], end)
            if not known:
                reach = np.where(has_slot, reach, pooled)
        else:
            reach = np.full(count, pooled, np.int64)
            if pooled >= end:  # every node reaches the whole prefix: it fetches every page of a stretch it lacks
                return gpu, either, reach, (ends[1:] - los) @ (held ^ 1)
        if not reach.any():
            return gpu, either, reach, np.zeros(count, np.int64)
        overlap = np.maximum(np.minimum(ends[1:, None], reach[None, :]) - los[:, None], 0)  # np.clip costs 10x
        fetch = (overlap * (held ^ 1)).sum(axis=0)
        return gpu, either, reach, fetch

    def _few_holders(
        self, count: int, where: Mapping[int, int], union: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`columns` when few nodes hold any page of the prefix (`union`: the OR of the stretches' masks; `where`: the
        position of each candidate by its GPU bit). A node
        holding none of it has no prefix of its own, reaches the pooled prefix and fetches all of it; only the
        holders are walked, stretch by stretch, in Python (cheaper than the bit matrix's array passes then)."""
        stretches, end, pooled = self._stretches, self.anywhere, self.pooled
        host = self._host_bits
        gpu, either = np.zeros(count, np.int64), np.zeros(count, np.int64)
        reach, fetch = np.full(count, pooled, np.int64), np.full(count, pooled, np.int64)
        at, values = [], []
        holders = set()
        while union:  # the GPU bit (3i) of every node i with a bit in the masks
            low = union & -union
            holders.add((low.bit_length() - 1) // 3 * 3)
            union ^= low
        for bit in holders:
            j = where.get(bit)
            if j is None:  # (not a candidate)
                continue
            g_bit, e_bit = 1 << bit, 4 << bit
            g = e = r = -1  # where its GPU and either-tier prefixes and its reachable prefix end (-1: not yet)
            got = 0  # pages of the reachable prefix it lacks
            for k, (lo, mask) in enumerate(stretches):
                if g < 0 and not mask & g_bit:
                    g = lo
                if mask & e_bit:
                    continue
                if e < 0:
                    e = lo  # (a page in neither tier is not in GPU memory: g was set by now)
                if lo >= pooled and not mask & host:  # lacked and no host holds it: the reachable prefix ends
                    r = lo
                    break
                got += (stretches[k + 1][0] if k + 1 < len(stretches) else end) - lo
            at.append(j)
            values.append((end if g < 0 else g, end if e < 0 else e, end if r < 0 else r, got))
        if at:
            index = np.array(at, np.intp)
            g_col, e_col, r_col, f_col = zip(*values, strict=True)
            gpu[index], either[index], reach[index], fetch[index] = g_col, e_col, r_col, f_col
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


_Slots = tuple[bool, np.ndarray, np.ndarray, dict[int, int]]
_SLOTS: list[tuple[Sequence[NodeId], Mapping[NodeId, int], _Slots]] = []


def _slots(nodes: Sequence[NodeId], index: Mapping[NodeId, int]) -> _Slots:
    """(all known, the GPU bit 3i of each node then its either bit 3i + 2 (0 for unknown nodes), known mask, the
    position of each known node by its GPU bit) of `nodes` under `index`, kept for the last pair of objects seen
    (callers reuse both while the candidates and the nodes stay the same)."""
    last = _SLOTS[0] if _SLOTS else None  # read once: another thread may replace it
    if last is not None and last[0] is nodes and last[1] is index and type(nodes) is tuple:  # (a list may change)
        return last[2]
    gpu = np.fromiter(map(index.get, nodes, repeat(-1)), np.int64, len(nodes))  # -1: unknown
    has = gpu >= 0
    gpu = np.maximum(gpu, 0)
    where = {bit: j for j, (bit, known) in enumerate(zip(gpu.tolist(), has.tolist(), strict=True)) if known}
    answer = (bool(has.all()), np.concatenate((gpu, gpu + 2)), has, where)
    _SLOTS[:] = [(nodes, index, answer)]
    return answer


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


_KNOWN: list[tuple[tuple[NodeId | None, ...], tuple[NodeId, ...]]] = []


def _known(ids: tuple[NodeId | None, ...]) -> tuple[NodeId, ...]:
    """The known nodes of `ids`, kept for the last `ids` tuple seen (a directory shares one until a node joins or
    leaves, and every lookup needs them)."""
    last = _KNOWN[0] if _KNOWN else None  # read once: another thread may replace it
    if last is not None and last[0] is ids:
        return last[1]
    known = tuple(n for n in ids if n is not None)
    _KNOWN[:] = [(ids, known)]
    return known


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
    pooled = end
    for lo, mask in stretches:
        if not mask & host_bits:
            pooled = lo
            break
    return PrefixMatch(pages, end, pooled, stretches, index, ids, host_bits, either_bits)


def _tier_maps(
    end: int, stretches: list[tuple[int, int]], ids: tuple[NodeId | None, ...]
) -> tuple[dict[NodeId, int], dict[NodeId, int], dict[NodeId, int]]:
    """`PrefixMatch.gpu`, `host` and `either`: a bit 3i + t survives the AND of the masks while node i holds every
    page so far in tier t, so a node's prefix in a tier ends at the first stretch lacking its bit."""
    tiers: tuple[dict[NodeId, int], dict[NodeId, int], dict[NodeId, int]] = ({}, {}, {})
    if stretches:
        acc = stretches[0][1]
        for lo, mask in stretches:
            dropped = acc & ~mask
            if dropped:
                for bit_index, node in bits_of(dropped, ids):
                    tiers[bit_index % 3][node] = lo
                acc &= mask
        for bit_index, node in bits_of(acc, ids):
            tiers[bit_index % 3][node] = end
    return tiers


def _reachable_map(
    pooled: int,
    end: int,
    stretches: list[tuple[int, int]],
    ids: tuple[NodeId | None, ...],
    host_bits: int,
    either_bits: int,
) -> dict[NodeId, int]:
    """`PrefixMatch.reachable`: the pooled prefix for every known node, and past it, only pages no node holds in
    host memory constrain a node: its reachable prefix ends at the first such page it does not hold itself (its
    either bit is clear there)."""
    reachable: dict[NodeId, int] = dict.fromkeys(_known(ids), pooled) if pooled else {}
    if pooled < end:
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
    return reachable
