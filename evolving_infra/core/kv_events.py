"""KV events a node publishes and the directory applies: pages stored, pages removed, all cleared.

A `KvStored` carries a chain: `pages[0]`'s parent is `parent` (None for a root page), and each later
page's parent is the page before it. Events name the memory tier they concern.

Boundary: plain immutable values; producers (engine core) and consumers (KV directory) share them.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Tier


@dataclass(frozen=True, slots=True)
class KvStored:
    """`node` now holds `pages` (a parent-linked chain) in `tier`, as of `time`."""

    node: NodeId
    tier: Tier
    parent: PageHash | None
    pages: tuple[PageHash, ...]
    time: float


@dataclass(frozen=True, slots=True)
class KvRemoved:
    """`node` no longer holds `pages` in `tier`."""

    node: NodeId
    tier: Tier
    pages: tuple[PageHash, ...]
    time: float


@dataclass(frozen=True, slots=True)
class KvCleared:
    """`node` dropped everything in `tier` (or in every tier when `tier` is None)."""

    node: NodeId
    tier: Tier | None
    time: float


KvEvent = KvStored | KvRemoved | KvCleared
