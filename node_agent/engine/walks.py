"""The admissions' reads of a node's pool: what its tiers hold of a prompt, and the pins on what is reused.

`admit_prompt` (a decode's received prompt: the pages L1 holds pinned, room made, the rest stored), `gpu_walk`
and `host_walk` (a prefill's walks over its reusable prefix, in L1 then L2, and L2 then its fetch plan) and
`pin_walked` (the pins a walk found). With the id tables (`KvPool.page_ids`) a prompt is resolved to ids once,
the walks are tier masks, and the pins take the kept ids (the id tables keep no hash-keyed set of resident pages
to walk instead: `idpool.ResidentPages`).
Either way the outcome is the walk over hashes (`tests/node_agent/test_engine_idpool.py` drives both table kinds
through them).

Boundary: reads and pins through `KvPool`'s interface; which requests are admitted, and when, is the
schedulers' (`prefill`, `decode`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from itertools import compress
from typing import NamedTuple, cast

import numpy as np

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.chainrun import ChainRun
from evolving_infra.node_agent.engine.errors import PoolInvariantError
from evolving_infra.node_agent.engine.idpages import CACHED, Ids, PageIds, held_prefix
from evolving_infra.node_agent.engine.idpool import IdTierPool
from evolving_infra.node_agent.engine.kvpool import KvPool
from evolving_infra.node_agent.engine.poolruns import Run
from evolving_infra.node_agent.engine.tier import Owner

_NO_IDS: Ids = np.zeros(0, dtype=np.int64)


def received_pages(prompt: tuple[PageHash, ...], resident: Collection[PageHash] | int) -> Run:
    """(page, parent) of each page of `prompt` (distinct pages) not in `resident` (a subset of `prompt`, or the
    number of its leading pages that are), in prompt order. When `resident` is the prompt's first len(resident)
    pages (the usual case: an earlier turn's prefix), the pairs are sliced out of the prompt, which needs only the
    membership tests of the shorter of the two parts."""
    n = len(prompt)
    if isinstance(resident, int):
        r, leading = resident, True
    else:
        r = len(resident)
        # resident (r distinct pages of the prompt) is its first r pages iff all of those are in it, iff none of
        # the other n - r pages is
        leading = r == 0 or (resident.issuperset(prompt[:r]) if r <= n - r else resident.isdisjoint(prompt[r:]))  # type: ignore[attr-defined]  # a set view
    if r == 0:
        return list(zip(prompt, (None, *prompt[: n - 1])))
    if leading:
        return list(zip(prompt[r:], prompt[r - 1 : n - 1]))
    return [(page, parent) for page, parent in zip(prompt, (None, *prompt)) if page not in resident]  # type: ignore[operator]


Resolved = tuple[Ids, Ids]
"""A prefix's ids (-1: no tier held the page) and their generations, as `PageIds.resolve` gives them: a request
walks the same prefix again (host admission, then GPU admission, each retried until it fits), and a later walk
only looks up the pages whose id moved since (`PageIds.refresh`)."""


class GpuWalk(NamedTuple):
    """What `gpu_walk` found: the prefix pages L1 holds (reused), the (page, parent) pairs of those only L2
    holds (loaded), in prompt order, and with the id tables the ids of each (None with the set tables) and the
    whole prefix's ids with their generations (`Resolved`: for the request's next walk)."""

    in_l1: list[PageHash]
    loads: Run
    l1_ids: Ids | None
    load_ids: Ids | None
    resolved: Resolved | None = None


class HostWalk(NamedTuple):
    """What `host_walk` found: the prefix pages L2 holds (to pin; with the id tables their ids, else None)
    and the pages to fetch, in prompt order; with the id tables the prefix's `Resolved` ids."""

    pins: list[PageHash]
    pin_ids: Ids | None
    fetch: list[PageHash]
    resolved: Resolved | None = None


KEEP_IDS_MIN = 512
"""Prefixes of at least this many pages keep their ids for the request's next walk (`Resolved`); below it a fresh
lookup costs about what the refresh's numpy calls do (measured on the Mooncake replay's ~190-page prompts: keeping
them cost 0.4 % more instructions)."""


def _resolve(page_ids: PageIds, prefix: tuple[PageHash, ...], known: Resolved | None) -> tuple[Ids, Resolved | None]:
    """The ids of `prefix`, and what to keep of them for the next walk (refreshed from `known` where kept)."""
    if len(prefix) < KEEP_IDS_MIN:
        return page_ids.lookup(list(prefix)), None
    if known is None or len(known[0]) != len(prefix):
        resolved = page_ids.resolve(list(prefix))
    else:
        resolved = page_ids.refresh(prefix, *known)
    return resolved[0], resolved


def admit_prompt(pool: KvPool, owner: Owner, prompt: tuple[PageHash, ...], footprint: int, now: float) -> bool:
    """A decode's admission of a received prompt (distinct pages, in chain order) into L1: the pages L1
    holds are pinned by `owner`, room is made for the rest of its `footprint` (pages: the prompt's and
    every one its output will fill), reserved, and the received pages are stored (`store_all`). False,
    changing nothing, when L1 lacks the room even after evicting every page it may. With the id tables
    the prompt is resolved to ids once (which pages L1 holds, their pins and the room check read them)."""
    l1 = pool.l1
    page_ids = pool.page_ids
    received_ids: Ids | None = None  # (id tables) the received pages' ids, while current
    received: Run | ChainRun
    if page_ids is None:
        resident = l1.resident_set() & prompt
        need = footprint - len(resident)
        if l1.lacks_room(need, resident):
            return False
        # Pinning first keeps the reused pages out of the eviction that makes room (as excluding them would).
        l1.pin_all(owner, resident, now)
        received = received_pages(prompt, resident)
    else:
        ids = page_ids.lookup(list(prompt))
        t = cast(IdTierPool, l1).t
        held = t.holds(ids)
        r = int(held.sum())
        need = footprint - r
        free = t.free
        if need > free:  # `lacks_room(need, resident)`
            room = free + t.cached
            if room < need or (room - r < need and room - int((t.state[ids[held]] == CACHED).sum()) < need):
                return False
        if r:
            t.pin(owner, ids[held], now)
        if held[:r].all():  # (the leading r pages are the ones L1 holds: the rest is one chain)
            received = ChainRun.of(prompt, r) if r < len(prompt) else []
            received_ids = ids[r:]
        else:
            received = list(compress(zip(prompt, (None, *prompt)), (~held).tolist()))
            received_ids = ids[~held]
        gens = page_ids.gen[received_ids[received_ids >= 0]]
    if not pool.make_room(Tier.GPU, need, now):
        raise PoolInvariantError(f"gpu: room for {owner} vanished while making it")
    if received_ids is not None:
        # the room's L2 evictions may have freed the id of a received page that only L2 held (it gave no page
        # an id: its write-backs are L1's pages, none received); then the pages are resolved again
        if (page_ids.gen[received_ids[received_ids >= 0]] != gens).any():  # type: ignore[union-attr]  # id tables
            received_ids = None
    l1.reserve(owner, need)
    pool.store_all(Tier.GPU, received, now, owner=owner, ids=received_ids)
    return True


def gpu_walk(pool: KvPool, prefix: tuple[PageHash, ...], known: Resolved | None = None) -> GpuWalk:
    """A prefill's walk over its reusable prefix (`prefix`: the prompt's pages it may reuse, in order): from
    the start, every page L1 holds is reused and every page only L2 holds is loaded, up to the first page
    neither holds. With the id tables the pages are resolved once (`known`: what an earlier walk of the same
    prefix resolved), the walk is two masks, and the ids are kept for the pins (`pin_walked`)."""
    page_ids = pool.page_ids
    if page_ids is None:
        in_l1: list[PageHash] = []
        loads: Run = []
        l1_has, l2_has = pool.l1.resident_set(), pool.l2.resident_set()
        parent: PageHash | None = None  # the page before `page` in the prompt
        for page in prefix:
            if page in l1_has:
                in_l1.append(page)
            elif page in l2_has:
                loads.append((page, parent))
            else:
                break
            parent = page
        return GpuWalk(in_l1, loads, None, None)
    ids, resolved = _resolve(page_ids, prefix, known)
    h1 = cast(IdTierPool, pool.l1).t.holds(ids)
    h2 = cast(IdTierPool, pool.l2).t.holds(ids)
    k = held_prefix(h1, h2)
    ids, h1 = ids[:k], h1[:k]
    reused = h1.tolist()
    if all(reused):
        return GpuWalk(list(prefix[:k]), [], ids, _NO_IDS, resolved)
    load = ~h1
    loads = list(compress(zip(prefix, (None, *prefix)), load.tolist()))
    return GpuWalk(list(compress(prefix, reused)), loads, ids[h1], ids[load], resolved)


def host_walk(pool: KvPool, prefix: tuple[PageHash, ...], fetchable: Callable[[], Mapping[PageHash, object]],
              known: Resolved | None = None) -> HostWalk:  # fmt: skip
    """A prefill's host admission walk over its reusable prefix: from the start, pages L2 holds are pinned,
    pages L1 holds or that are arriving in L2 (another request's fetch) are passed over, pages its fetch plan
    names (`fetchable()`, read only when the walk meets such a page) are fetched, and the walk stops at the
    first other page, or once it has taken as many pages as L2 has slots. With the id tables (and a prefix
    shorter than L2), the pages are resolved once (`known`: as in `gpu_walk`) and only those neither tier holds
    are looked at one by one."""
    l1, l2 = pool.l1, pool.l2
    capacity = l2.capacity
    arriving = l2.writing_set()
    table: Mapping[PageHash, object] | None = None
    fetch: list[PageHash] = []
    page_ids = pool.page_ids
    if page_ids is None or len(prefix) > capacity:
        pins: list[PageHash] = []
        in_l1, in_l2 = l1.resident_set(), l2.resident_set()
        capped = len(prefix) > capacity  # else the walk takes at most len(prefix) <= capacity pages
        for page in prefix:
            if capped and len(pins) + len(fetch) >= capacity:
                break
            if page in in_l2:
                pins.append(page)
            elif page in in_l1 or page in arriving:
                continue  # reused from L1, or arriving with another request's fetch
            else:
                if table is None:
                    table = fetchable()
                if page in table:
                    fetch.append(page)
                else:
                    break
        return HostWalk(pins, None, fetch)
    ids, resolved = _resolve(page_ids, prefix, known)
    h2 = cast(IdTierPool, l2).t.holds(ids)
    stop = len(prefix)
    for j in np.flatnonzero(~(h2 | cast(IdTierPool, l1).t.holds(ids))).tolist():
        page = prefix[j]
        if page in arriving:
            continue
        if table is None:
            table = fetchable()
        if page in table:
            fetch.append(page)
        else:
            stop = j
            break
    held = h2[:stop]
    return HostWalk(list(compress(prefix[:stop], held.tolist())), ids[:stop][held], fetch, resolved)


def pin_walked(pool: KvPool, tier: Tier, owner: Owner, pages: Collection[PageHash], ids: Ids | None,
               now: float) -> None:  # fmt: skip
    """`pin_all(owner, pages, now)` in `tier`, by the ids a walk kept for them (`ids`: theirs, in the same
    order, or None to resolve them)."""
    tiers = pool.tier(tier)
    if ids is None:
        tiers.pin_all(owner, pages, now)
    elif len(ids):
        cast(IdTierPool, tiers).t.pin(owner, ids, now)
