"""The pool's stores of whole runs (`PoolRuns`, which `kvpool.KvPool` inherits): `store_all`, `store_chain` and
`land_all` make a run of pages resident with exactly the state and KV events of the page-by-page calls
(`KvPool.store`, `KvPool.land`), as one run where the checks and the write-through plan allow: by the pages'
current ids where the caller resolved them (`_insert_known`, the id tables), else by their hashes (`_store_run`);
a run that is one chain may come as a `chainrun.ChainRun` and is then never listed as pairs on those paths. The
rules are `kvpool`'s module docstring ("Runs").

Boundary: which run to store and when is the caller's; the single-page operations, eviction, the write-through
plan and the events are `KvPool`'s (declared here for type checkers).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from itertools import compress
from typing import cast

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.chainrun import ChainRun, pages_and_parents
from evolving_infra.node_agent.engine.errors import PoolInvariantError
from evolving_infra.node_agent.engine.idpages import Ids, PageIds
from evolving_infra.node_agent.engine.idpool import IdTierPool
from evolving_infra.node_agent.engine.tier import Owner, TierPool
from evolving_infra.node_agent.engine.tierruns import RunDepths

Run = list[tuple[PageHash, PageHash | None]]  # (page, parent) pairs in order
Plan = tuple[set[PageHash], list[PageHash]]  # a run's write-through: pages L2 lacks, L2 victims (`_l2_plan`)
_NO_WRITES: Plan = (set(), [])  # the plan of a run that is not written through


def _pairs(items: Run | ChainRun) -> Run:
    """The (page, parent) pairs of a run given as pairs or as a `ChainRun`."""
    return items.pairs() if isinstance(items, ChainRun) else items


class PoolRuns:
    """Run stores over `KvPool`'s tiers and operations (declared here for type checkers)."""

    l1: TierPool
    l2: TierPool
    check: bool
    _ids: PageIds | None
    _stored_items: Callable[[Tier, Iterable[tuple[PageHash, PageHash | None]] | ChainRun,
                             Mapping[PageHash, PageHash | None], set[PageHash], float], None]  # fmt: skip

    def tier(self, tier: Tier) -> TierPool:  # pragma: no cover - KvPool's
        raise NotImplementedError

    def store(
        self, tier: Tier, page: PageHash, parent: PageHash | None, now: float, *, owner: Owner,
        from_reservation: bool = True, pin: bool = True,
    ) -> None:  # pragma: no cover - KvPool's  # fmt: skip
        raise NotImplementedError

    def land(self, tier: Tier, owner: Owner, page: PageHash, parent: PageHash | None, now: float) -> None:  # pragma: no cover - KvPool's
        raise NotImplementedError

    def expected_victims(self, tier: Tier, n: int, excluded: frozenset[PageHash] = frozenset()) -> list[PageHash]:  # pragma: no cover - KvPool's
        raise NotImplementedError

    def _l2_plan(self, pages: set[PageHash] | dict[PageHash, PageHash | None], now: float,
                 missing: set[PageHash] | None = None) -> Plan | None:  # pragma: no cover - KvPool's  # fmt: skip
        raise NotImplementedError

    def _write_through(self, pages: Iterable[PageHash], chosen: set[PageHash] | None,
                       parent_of: Mapping[PageHash, PageHash | None], plan: Plan, now: float,
                       ids: Ids | None = None) -> None:  # pragma: no cover - KvPool's  # fmt: skip
        raise NotImplementedError

    def _after(self) -> None:  # pragma: no cover - KvPool's
        raise NotImplementedError

    def store_all(self, tier: Tier, items: Run | ChainRun, now: float, *, owner: Owner,
                  from_reservation: bool = True, ids: Ids | None = None) -> None:  # fmt: skip
        """`store` (pinned) each (page, parent) of `items`, in order: the same state (events: see the module
        docstring), done as one run when no page is resident or being written in `tier` and `_l2_plan` allows.
        `ids` (id tables): the pages' current ids (`PageIds.lookup`, -1: no tier holds it), where the caller
        resolved them; a chain that L1 lacks is then planned and stored without resolving its pages again (a
        `ChainRun`: without listing its pairs either)."""
        if not items:
            return
        run: Mapping[PageHash, PageHash | None] | None = None
        if ids is not None and tier is Tier.GPU and self._ids is not None:
            run = items if isinstance(items, ChainRun) else dict(items)
            if len(run) == len(items):
                l1 = cast(IdTierPool, self.l1)
                if not l1.t.holds(ids).any() and (not l1.writing or l1.writing_set().isdisjoint(run)):
                    if not self._insert_known(items, run, ids, now, owner, "reserved" if from_reservation else "free"):
                        for page, parent in _pairs(items):  # the plan could choose differently: page by page
                            self.store(tier, page, parent, now, owner=owner, from_reservation=from_reservation)
                    return
        if isinstance(items, ChainRun):
            items, run = items.pairs(), None
        self._store_run(tier, items, None if run is None else cast(dict[PageHash, PageHash | None], run), now,
                        owner, from_reservation)  # fmt: skip

    def _store_run(self, tier: Tier, items: Run, run: dict[PageHash, PageHash | None] | None, now: float,
                   owner: Owner, from_reservation: bool) -> None:  # fmt: skip
        """`store_all` by the pages' hashes (`run`: `items` as a dict, where the caller made it)."""
        pool = self.tier(tier)
        if run is None:
            run = dict(items)
        resident = pool.resident_set()
        distinct = len(run) == len(items)
        fresh = distinct and resident.isdisjoint(run)
        if distinct and not fresh:
            # pages another request made resident meanwhile (a sibling's prefill of the same prefix) usually
            # lead the run: pinned at once, then the rest as a run
            lead = self._stored_lead(tier, items, resident, now, owner, from_reservation)
            if lead:
                items = items[lead:]
                if not items:
                    return
                run = dict(items)
                fresh = resident.isdisjoint(run)
        if fresh and (not pool.writing or pool.writing_set().isdisjoint(run)):
            plan = self._l2_plan(run, now) if tier is Tier.GPU else _NO_WRITES
            if plan is not None:  # (the checks of `insert_all` are made above)
                slots = "reserved" if from_reservation else "free"
                ids = pool.insert_run(run, now, owner=owner, slots=slots, depths=self._run_depths(tier, run, plan))
                self._after_run(tier, items, run, plan, now, ids)
                return
        for page, parent in items:
            self.store(tier, page, parent, now, owner=owner, from_reservation=from_reservation)

    def store_chain(self, run: ChainRun, now: float, *, owner: Owner) -> None:
        """`store_all` in L1, from `owner`'s reservation, of the chain `run` (a prefill's computed pages, a
        decode's filled ones): with the id tables by its pages' ids looked up now (current), so a chain that L1
        lacks is planned and stored without listing its pairs (the same state: `store_all`)."""
        ids = None if self._ids is None else self._ids.lookup(run.pages)
        self.store_all(Tier.GPU, run, now, owner=owner, ids=ids)

    def _insert_known(self, items: Run | ChainRun, run: Mapping[PageHash, PageHash | None], ids: Ids, now: float,
                      owner: Owner, slots: str) -> bool:  # fmt: skip
        """Make the run `items` (`run`: the same as a mapping; a `ChainRun` is both) resident in L1 by the pages'
        current ids (`ids`), the caller's checks made (`store_all`'s or `land_all`'s): its write-through planned
        from the ids, then the run inserted from `slots` without resolving its pages again. False, changing
        nothing, when the plan could choose differently from page by page (the caller goes page by page)."""
        l1, l2 = cast(IdTierPool, self.l1), cast(IdTierPool, self.l2)
        pages, parents, chain = pages_and_parents(run)
        missing = set(compress(pages, (~l2.t.holds(ids)).tolist()))
        if chain or bool((ids >= 0).all()):
            plan = l2.room_for_ids(pages, parents[0], ids, missing, now)
            if plan is not None and plan[1] and self.check:
                expected = self.expected_victims(Tier.HOST, len(plan[1]))
                if plan[1] != expected:
                    raise PoolInvariantError(f"host: eviction order {plan[1]} differs from the policy's {expected}")
        else:  # (new pages outside a chain: their depths are the hash path's)
            plan = self._l2_plan(cast(dict[PageHash, PageHash | None], run), now, missing)  # (not a chain: a dict)
        if plan is None:
            return False
        stored = l1.insert_run(run, now, owner=owner, slots=slots, known=ids)
        self._after_run(Tier.GPU, items, run, plan, now, stored)
        return True

    def _stored_lead(self, tier: Tier, items: Run, resident: Collection[PageHash], now: float, owner: Owner,
                     from_reservation: bool) -> int:  # fmt: skip
        """`store` the leading pages of `items` that `tier` holds already (and L2 too, when `tier` is L1) at
        once: pinned by `owner` (and touched), a reserved slot back per page, touched in L2; none has an event.
        How many that was."""
        l2 = self.l2.resident_set() if tier is Tier.GPU else resident
        lead = 0
        for page, _ in items:
            if page not in resident or page not in l2:
                break
            lead += 1
        if lead:
            pages = [page for page, _ in items[:lead]]
            pool = self.tier(tier)
            pool.pin_all(owner, pages, now)
            if from_reservation:
                pool.unreserve(owner, lead)
            if tier is Tier.GPU:
                self.l2.touch_all(set(pages), now)
            self._after()
        return lead

    def land_all(self, tier: Tier, owner: Owner, items: Run, now: float, ids: Ids | None = None) -> None:
        """`land` each (page, parent) of `items`, in order (as one run when `owner` is writing them all and
        `_l2_plan` allows). `ids` (id tables): the pages' current ids, where the caller has them (`store_all`)."""
        if not items:
            return
        pool = self.tier(tier)
        run = dict(items)
        if len(run) == len(items) and pool.writes_all(owner, run):
            if ids is not None and tier is Tier.GPU and self._ids is not None:
                if not self._insert_known(items, run, ids, now, owner, "writing"):
                    for page, parent in items:  # the plan could choose differently: page by page, as below
                        self.land(tier, owner, page, parent, now)
                return
            plan = self._l2_plan(run, now) if tier is Tier.GPU else _NO_WRITES
            if plan is not None:  # (`owner` writes them all: none is resident, as `insert_all` checks)
                ids = pool.insert_run(run, now, owner=owner, slots="writing", depths=self._run_depths(tier, run, plan))
                self._after_run(tier, items, run, plan, now, ids)
                return
        for page, parent in items:
            self.land(tier, owner, page, parent, now)

    @staticmethod
    def _run_depths(tier: Tier, run: dict[PageHash, PageHash | None], plan: Plan) -> RunDepths:
        """What the plan of a run that L1 does not hold tells of its pages' depths (the depth table holds
        exactly the pages either tier holds): none has one where L2 lacks them all, all where L2 holds all."""
        if tier is not Tier.GPU:
            return RunDepths.LOOKUP
        missing = plan[0]
        if len(missing) == len(run):
            return RunDepths.NONE_KNOWN
        return RunDepths.LOOKUP if missing else RunDepths.ALL_KNOWN

    def _after_run(self, tier: Tier, items: Run | ChainRun, run: Mapping[PageHash, PageHash | None], plan: Plan, now: float,
                   ids: Ids | None = None) -> None:  # fmt: skip
        """The write-through (plan from `_l2_plan`) and the events of a run just made resident in `tier` (`ids`:
        its pages' ids, in order, from the id tables' insert; None from the set tables)."""
        if tier is Tier.GPU:
            self._write_through(run, None, run, plan, now, ids)
        self._stored_items(tier, items, run, plan[0], now)
        self._after()
