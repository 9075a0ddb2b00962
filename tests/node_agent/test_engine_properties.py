"""Property tests of the engine core: random streams of requests (with shared prefixes), fetches and
their completions, steps, branch-count updates, phase switches and forced evictions, on tiny tiers so
that every eviction and admission-wait path runs often.

After every operation: the pool's accounting adds up (`check_invariants`, also run inside every
operation); replaying the KV events per tier never stores a resident page twice nor removes an absent
one, and gives exactly the resident set; stored chains name the true parent; a page pinned before and
after an operation is never removed by it. At the end, once every fetch has landed and the loop has run
dry, every request was finished or handed back exactly once and nothing is left pinned or in use.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.kv_events import KvCleared, KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId, Tier
from evolving_infra.node_agent.engine import (
    DataPlane,
    DecodeRequest,
    EngineCore,
    FetchRun,
    IterationKind,
    PrefillRequest,
    RequestTooLarge,
    SwitchInProgress,
    WrongPhase,
)
from evolving_infra.node_agent.profile import DecodeModel, HardwareProfile, PrefillModel

PAGE = 4
CHAINS = 3
CHAIN_PAGES = 14
SHARED = 4  # chains 0 and 1 share their first pages; chain 2 is separate


def _universe() -> tuple[list[list[PageHash]], dict[PageHash, PageHash | None]]:
    chains = []
    for c in range(CHAINS):
        contents = [(f"shared:{i}" if c < 2 and i < SHARED else f"c{c}:{i}").encode() for i in range(CHAIN_PAGES)]
        chains.append(chain_hashes(contents))
    parents: dict[PageHash, PageHash | None] = {}
    for chain in chains:
        for i, page in enumerate(chain):
            parents[page] = chain[i - 1] if i else None
    return chains, parents


CHAIN_LIST, TRUE_PARENT = _universe()
ALL_PAGES = sorted(TRUE_PARENT)


def _profile(l1: int, l2: int, chunk: int) -> HardwareProfile:
    return HardwareProfile(
        name="tiny",
        gpu="test",
        gpus_per_node=1,
        model="test",
        parallelism="TP1",
        prefill=PrefillModel(c0=0.01, c1=1e-4, c2=1e-6, c3=1e-5),
        decode=DecodeModel(d0=0.005, d1=0.01, d2=1e-3, k=2, experts=8, t_fwd=2.0, t_acc=1.5),
        kv_bytes_per_token=100,
        l1_tokens=l1 * PAGE,
        l2_tokens=l2 * PAGE,
        page_tokens=PAGE,
        chunk_tokens=chunk,
        fetch_bandwidth=1e5,
        fetch_latency=0.002,
        transfer_bandwidth=1e6,
        load_bandwidth=2e4,
    )


class EngineMachine(RuleBasedStateMachine):
    @initialize(
        l1=st.integers(8, 24),
        l2=st.integers(8, 40),
        chunk=st.integers(3, 24),
        mode=st.sampled_from(list(NodeMode)),
        plane=st.sampled_from(list(DataPlane)),
        lru=st.booleans(),
    )
    def setup(self, l1: int, l2: int, chunk: int, mode: NodeMode, plane: DataPlane, lru: bool) -> None:
        policy = LruEviction() if lru else BranchCountEviction()
        self.engine = EngineCore(NodeId("n0"), _profile(l1, l2, chunk), mode, policy, plane, check_invariants=True)
        self.now = 0.0
        self.seq = 0
        self.replay: dict[Tier, set[PageHash]] = {Tier.GPU: set(), Tier.HOST: set()}
        self.op_events: list[KvEvent] = []
        self.pinned_before: dict[Tier, frozenset[PageHash]] = {t: frozenset() for t in Tier}
        self.outstanding: set[str] = set()  # requests with a fetch the driver has not completed
        self.submitted: dict[str, str] = {}  # request -> "prefill" | "decode"
        self.outcomes: Counter[str] = Counter()  # request -> times finished or handed back
        self.local: set[str] = set()

    # --- helpers -------------------------------------------------------------------------------------
    def _rid(self) -> str:
        self.seq += 1
        return f"r{self.seq}"

    def _absorb(self, events: tuple[KvEvent, ...]) -> None:
        for ev in events:
            self.op_events.append(ev)
            if isinstance(ev, KvStored):
                parent = ev.parent
                for page in ev.pages:
                    assert page not in self.replay[ev.tier], f"{ev.tier}: page {page:#x} stored twice"
                    if page in TRUE_PARENT:
                        assert parent == TRUE_PARENT[page], f"page {page:#x} stored with a wrong parent"
                    self.replay[ev.tier].add(page)
                    parent = page
            elif isinstance(ev, KvRemoved):
                for page in ev.pages:
                    assert page in self.replay[ev.tier], f"{ev.tier}: page {page:#x} removed while absent"
                    self.replay[ev.tier].discard(page)
            else:
                assert isinstance(ev, KvCleared)
                raise AssertionError("the engine core never clears a whole tier")

    def _prompt(self, chain: int, pages: int, extra: int) -> tuple[tuple[PageHash, ...], int]:
        tokens = max(1, pages * PAGE + extra)
        return tuple(CHAIN_LIST[chain][: tokens // PAGE]), tokens

    def _handed(self, requests: tuple[object, ...]) -> None:
        for req in requests:
            assert isinstance(req, PrefillRequest | DecodeRequest)
            self.outcomes[req.request] += 1
            self.outstanding.discard(req.request)

    # --- rules ---------------------------------------------------------------------------------------
    @rule(
        chain=st.integers(0, CHAINS - 1),
        pages=st.integers(0, 12),
        extra=st.integers(0, PAGE - 1),
        output=st.integers(0, 6),
        fetch_from=st.integers(0, 3),
        fetch_len=st.integers(0, 8),
    )
    def submit_prefill(self, chain: int, pages: int, extra: int, output: int, fetch_from: int, fetch_len: int) -> None:
        prompt, tokens = self._prompt(chain, pages, extra)
        planned = prompt[fetch_from : fetch_from + fetch_len]
        runs = tuple(
            run
            for peer, part in (("peer-a", planned[::2]), ("peer-b", planned[1::2]))
            for run in FetchRun.runs_of(NodeId(peer), part, prompt)
        )
        rid = self._rid()
        req = PrefillRequest(RequestId(rid), BranchId(f"b{chain}"), prompt, tokens, output, 1.5, runs)
        try:
            effects = self.engine.submit_prefill(req, self.now)
        except (WrongPhase, SwitchInProgress):
            assert self.engine.mode is NodeMode.DECODE or self.engine.switch_state.value == "draining"
            return
        except RequestTooLarge:
            assert -(-(tokens + output) // PAGE) > self.engine.pool.l1.capacity
            return
        self.submitted[rid] = "prefill"
        self._absorb(effects.events)
        self.outstanding.update(f.request for f in effects.fetches)

    @rule(
        chain=st.integers(0, CHAINS - 1),
        pages=st.integers(0, 10),
        extra=st.integers(0, PAGE - 1),
        output=st.integers(1, 8),
        t_acc=st.sampled_from([0.5, 1.0, 1.5, 2.0]),
    )
    def submit_decode(self, chain: int, pages: int, extra: int, output: int, t_acc: float) -> None:
        prompt, tokens = self._prompt(chain, pages, extra)
        rid = self._rid()
        req = DecodeRequest(RequestId(rid), BranchId(f"b{chain}"), prompt, tokens, output, t_acc)
        try:
            effects = self.engine.submit_decode(req, self.now)
        except (WrongPhase, SwitchInProgress):
            assert self.engine.mode is NodeMode.PREFILL or self.engine.switch_state.value == "draining"
            return
        except RequestTooLarge:
            assert -(-(tokens + output) // PAGE) > self.engine.pool.l1.capacity
            return
        self.submitted[rid] = "decode"
        self._absorb(effects.events)
        self.outstanding.update(f.request for f in effects.fetches)

    @precondition(lambda self: bool(self.outstanding))
    @rule(data=st.data())
    def complete_fetch(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.outstanding)))
        self.outstanding.discard(rid)
        effects = self.engine.fetch_completed(rid, self.now)
        self._absorb(effects.events)
        self.outstanding.update(f.request for f in effects.fetches)

    @rule(gap=st.sampled_from([0.0, 0.0, 0.001, 0.05]))
    def step(self, gap: float) -> None:
        self.now = max(self.now, self.engine.busy_until) + gap
        out = self.engine.step(self.now)
        self._absorb(out.events)
        self.outstanding.update(f.request for f in out.fetches_started)
        for done in out.prefills_finished:
            self.outcomes[done.request] += 1
            if done.local_decode:
                self.local.add(done.request)
        for dec in out.decodes_finished:
            if dec.request in self.local:
                self.local.discard(dec.request)
            else:
                self.outcomes[dec.request] += 1
        if out.switch_completed is not None:
            assert out.switch_completed.completed >= out.switch_completed.began
        if out.kind is IterationKind.IDLE and out.wake_at is not None:
            self.now = max(self.now, out.wake_at)

    @rule(dt=st.sampled_from([0.001, 0.01, 0.2]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(updates=st.dictionaries(st.sampled_from(ALL_PAGES), st.integers(0, 3), max_size=8))
    def set_counts(self, updates: dict[PageHash, int]) -> None:
        self.engine.set_counts(updates)

    @rule(phase=st.sampled_from(list(Phase)), go=st.integers(0, 3))
    def switch(self, phase: Phase, go: int) -> None:
        if go:  # switches are rarer than requests, so that work piles up between them
            return
        try:
            begun = self.engine.begin_switch(phase, self.now)
        except SwitchInProgress:
            assert self.engine.switch_state.value == "draining"
            return
        except ValueError:
            assert self.engine.mode is NodeMode.of(phase)
            return
        self._absorb(begun.events)
        self._handed(begun.handed_back)

    @rule(tier=st.sampled_from(list(Tier)), n=st.integers(0, 6))
    def evict(self, tier: Tier, n: int) -> None:
        effects = self.engine.evict(tier, n, self.now)
        self._absorb(effects.events)
        self.outstanding.update(f.request for f in effects.fetches)

    # --- invariants ----------------------------------------------------------------------------------
    @invariant()
    def pool_adds_up_and_events_replay(self) -> None:
        self.engine.check_invariants()
        pinned_now = {t: self.engine.pool.tier(t).pinned_pages() for t in Tier}
        for tier in Tier:
            assert self.replay[tier] == set(self.engine.resident(tier)), f"{tier}: replayed events != resident"
            removed = {p for ev in self.op_events if isinstance(ev, KvRemoved) and ev.tier is tier for p in ev.pages}
            kept_pinned = self.pinned_before[tier] & pinned_now[tier]
            assert not removed & kept_pinned, f"{tier}: pinned pages were evicted: {removed & kept_pinned}"
            g = self.engine.pool.tier(tier).gauges()
            assert g.free + g.cached + g.pinned + g.in_use == g.capacity
        self.pinned_before = pinned_now
        self.op_events = []

    def teardown(self) -> None:
        if not hasattr(self, "engine"):
            return
        for _ in range(3000):
            while self.outstanding:
                self.complete_fetch_all()
            self.now = max(self.now, self.engine.busy_until)
            out = self.engine.step(self.now)
            self._absorb(out.events)
            self.outstanding.update(f.request for f in out.fetches_started)
            for done in out.prefills_finished:
                self.outcomes[done.request] += 1
                if done.local_decode:
                    self.local.add(done.request)
            for dec in out.decodes_finished:
                if dec.request in self.local:
                    self.local.discard(dec.request)
                else:
                    self.outcomes[dec.request] += 1
            if out.kind is IterationKind.IDLE:
                if out.wake_at is not None:
                    self.now = max(self.now, out.wake_at)
                elif not self.outstanding:
                    break
        self.pool_adds_up_and_events_replay()
        g = self.engine.gauges()
        assert (g.prefill_queued, g.prefill_running, g.decode_queued, g.decode_running) == (0, 0, 0, 0), g
        for tier in (g.pool.l1, g.pool.l2):
            assert tier.pinned == 0 and tier.in_use == 0, tier
        assert not self.local
        for rid in self.submitted:
            assert self.outcomes[rid] == 1, f"request {rid} finished or handed back {self.outcomes[rid]} times"
        assert set(self.outcomes) <= set(self.submitted)

    def complete_fetch_all(self) -> None:
        for rid in sorted(self.outstanding):
            self.outstanding.discard(rid)
            effects = self.engine.fetch_completed(rid, self.now)
            self._absorb(effects.events)
            self.outstanding.update(f.request for f in effects.fetches)


EngineMachine.TestCase.settings = settings(EngineMachine.TestCase.settings, stateful_step_count=60)
TestEngineProperties = EngineMachine.TestCase
