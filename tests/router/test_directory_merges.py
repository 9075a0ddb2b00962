"""The run-based KV directory under the simulator's event pattern, against the page-exact oracle: chains grown
a page or a chunk at a time (GPU, then host write-through at the same or a later time), whole prompts received
by another node, evictions as tail segments in eviction order (deepest page first), as scattered victims, and
touches of stretches. Runs are keyed by holders only (times per page where they differ), so these tests also pin
down that pages stored at different times share one run, that a piece gaining a holder joins the run before it,
and that the structural invariants (`KvDirectory.check`) hold after every step."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from evolving_infra.core.kv_events import KvRemoved, KvStored
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.directory_pages import PageKvDirectory

P, D, Q = NodeId("prefill"), NodeId("decode"), NodeId("other")
NODES = (P, D, Q)
_SHARED = tuple(chain_hashes(b"system%d" % i for i in range(6)))
BRANCHES = tuple(
    _SHARED + tuple(chain_hashes((b"branch%d-%d" % (k, i) for i in range(24)), parent=_SHARED[-1])) for k in range(3)
)
ALL_PAGES = tuple(dict.fromkeys(p for path in BRANCHES for p in path))


def both(runs: KvDirectory, pages: PageKvDirectory, event: KvStored | KvRemoved) -> None:
    runs.apply(event)
    pages.apply(event)


def test_a_decode_chain_stays_one_run_with_times_per_page() -> None:
    runs, pages = KvDirectory(), PageKvDirectory()
    chain = BRANCHES[0]
    for tier in Tier:
        both(runs, pages, KvStored(D, tier, None, chain[:10], 1.0))  # the received prompt
    for i in range(10, len(chain)):  # decode pages one by one, each written through at its own time
        for tier in Tier:
            both(runs, pages, KvStored(D, tier, chain[i - 1], chain[i : i + 1], 2.0 + i))
    assert runs.run_count == 1
    runs.check()
    for tier in Tier:
        assert runs.pages_on(D, tier) == pages.pages_on(D, tier)
    assert runs.last_used(chain[3], D, Tier.GPU) == 1.0
    assert runs.last_used(chain[-1], D, Tier.HOST) == 2.0 + len(chain) - 1


def test_tail_evictions_split_once_and_keep_the_prefix_run() -> None:
    runs, pages = KvDirectory(), PageKvDirectory()
    chain = BRANCHES[1]
    for tier in Tier:
        both(runs, pages, KvStored(P, tier, None, chain, 1.0))
    both(runs, pages, KvRemoved(P, Tier.GPU, tuple(reversed(chain[20:])), 2.0))  # deepest page first
    assert runs.run_count == 2
    both(runs, pages, KvRemoved(P, Tier.GPU, tuple(reversed(chain[12:20])), 3.0))
    assert runs.run_count == 3  # removals split but do not merge (measured: merging there did not pay)
    runs.check()
    assert runs.lookup(list(chain)) == pages.lookup(list(chain))
    for tier in Tier:
        assert runs.pages_on(P, tier) == pages.pages_on(P, tier)


def test_a_received_prompt_joins_the_runs_it_covers() -> None:
    runs, pages = KvDirectory(), PageKvDirectory()
    chain = BRANCHES[2]
    for start in range(0, len(chain), 5):  # prefill chunks at their own times
        for tier in Tier:
            both(runs, pages, KvStored(P, tier, chain[start - 1] if start else None, chain[start : start + 5], start))
    assert runs.run_count == 1  # each chunk joined the run before it once written through
    both(runs, pages, KvStored(D, Tier.GPU, None, chain[:17], 50.0))
    assert runs.run_count == 2  # the received prefix and the rest
    both(runs, pages, KvStored(D, Tier.GPU, chain[16], chain[17:], 51.0))
    assert runs.run_count == 1
    runs.check()
    for node in (P, D):
        for tier in Tier:
            assert runs.pages_on(node, tier) == pages.pages_on(node, tier)


def test_long_chunks_stored_at_their_own_times_keep_one_time_per_run() -> None:
    """Merging them would need one time per page (8 bytes each); pages added one at a time still join each
    other."""
    runs, pages = KvDirectory(), PageKvDirectory()
    chain = tuple(chain_hashes(b"long%d" % i for i in range(125)))
    for start in range(0, 120, 40):
        for tier in Tier:
            both(runs, pages, KvStored(P, tier, chain[start - 1] if start else None, chain[start : start + 40], start))
    assert runs.run_count == 3
    for i in range(120, 125):
        for tier in Tier:
            both(runs, pages, KvStored(P, tier, chain[i - 1], chain[i : i + 1], 200.0 + i))
    assert runs.run_count == 4
    runs.check()
    for tier in Tier:
        assert runs.pages_on(P, tier) == pages.pages_on(P, tier)


def test_tail_victims_across_runs_repeats_and_unknown_pages_match_the_oracle() -> None:
    """Victims deepest first spanning a child run and its parent run's end (one probe per run), and the forms
    that leave that path (a repeated victim, an unknown page, a run not held in that tier)."""
    chain = BRANCHES[0]
    cases = [
        tuple(reversed(chain[8:])),  # the decode run and the end of the prompt's run
        tuple(reversed(chain[20:])) + (chain[-1],),  # a victim named twice
        tuple(reversed(chain[25:])) + (PageHash(12345),),  # a page nobody holds
        tuple(reversed(chain[3:10])),  # not a run's end
    ]
    for victims in cases:
        runs, pages = KvDirectory(), PageKvDirectory()
        for tier in Tier:
            both(runs, pages, KvStored(P, tier, None, chain[:12], 1.0))
        both(runs, pages, KvStored(D, Tier.GPU, None, chain[:12], 2.0))
        for i in range(12, len(chain)):
            both(runs, pages, KvStored(P, Tier.GPU, chain[i - 1], chain[i : i + 1], 3.0 + i))
        for tier in Tier:
            assert runs.remove(P, tier, victims) == pages.remove(P, tier, victims)
            runs.check()
            assert runs.stats == pages.stats
            for node in (P, D):
                assert runs.pages_on(node, tier) == pages.pages_on(node, tier)
            assert runs.lookup(list(chain)) == pages.lookup(list(chain))


class SimPatternAgainstPages(RuleBasedStateMachine):
    """Random events of the simulator's kinds on three branches sharing a system prompt; every query, lookup
    and counter equals the page-exact directory's, and the run invariants hold."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = KvDirectory()
        self.pages = PageKvDirectory()
        self.clock = 0.0
        self.length = {(n, b): 0 for n in NODES for b in range(len(BRANCHES))}  # pages of a branch stored

    def both(self, event: KvStored | KvRemoved) -> None:
        both(self.runs, self.pages, event)

    @rule(node=st.sampled_from(NODES), branch=st.integers(0, 2), k=st.integers(1, 7), later=st.booleans(),
          host=st.booleans())  # fmt: skip
    def grow(self, node: NodeId, branch: int, k: int, later: bool, host: bool) -> None:
        """The next k pages of a branch on a node (a prefill chunk or decode pages), GPU then host."""
        path, have = BRANCHES[branch], self.length[(node, branch)]
        if have >= len(path):
            return
        chunk = path[have : have + k]
        self.clock += 1
        parent = path[have - 1] if have else None
        self.both(KvStored(node, Tier.GPU, parent, chunk, self.clock))
        if host:
            self.both(KvStored(node, Tier.HOST, parent, chunk, self.clock + (0.5 if later else 0.0)))
        self.length[(node, branch)] = have + len(chunk)

    @rule(node=st.sampled_from(NODES), branch=st.integers(0, 2), upto=st.integers(1, 30),
          tier=st.sampled_from(list(Tier)))  # fmt: skip
    def receive(self, node: NodeId, branch: int, upto: int, tier: Tier) -> None:
        """A whole prompt arriving on a node (a transfer or a fetch)."""
        self.clock += 1
        self.both(KvStored(node, tier, None, BRANCHES[branch][:upto], self.clock))
        self.length[(node, branch)] = max(self.length[(node, branch)], upto)

    @rule(node=st.sampled_from(NODES), tier=st.sampled_from(list(Tier)), branch=st.integers(0, 2),
          k=st.integers(1, 12), reverse=st.booleans())  # fmt: skip
    def evict_tail(self, node: NodeId, tier: Tier, branch: int, k: int, reverse: bool) -> None:
        """Victims as a chain's tail segment, deepest page first (or in chain order)."""
        held = [p for p in BRANCHES[branch] if self.pages.last_used(p, node, tier) is not None]
        victims = held[-k:]
        self.both(KvRemoved(node, tier, tuple(reversed(victims) if reverse else victims), self.clock))

    @rule(node=st.sampled_from(NODES), tier=st.sampled_from(list(Tier)),
          victims=st.lists(st.sampled_from(ALL_PAGES), max_size=10, unique=True))  # fmt: skip
    def evict_scattered(self, node: NodeId, tier: Tier, victims: list[PageHash]) -> None:
        self.both(KvRemoved(node, tier, tuple(victims), self.clock))

    @rule(node=st.sampled_from(NODES), tier=st.sampled_from(list(Tier)), branch=st.integers(0, 2),
          span=st.tuples(st.integers(0, 30), st.integers(0, 30)))  # fmt: skip
    def touch(self, node: NodeId, tier: Tier, branch: int, span: tuple[int, int]) -> None:
        lo, hi = sorted(span)
        self.clock += 1
        stretch = BRANCHES[branch][lo:hi]
        assert self.runs.touch(node, tier, stretch, self.clock) == self.pages.touch(node, tier, stretch, self.clock)

    @precondition(lambda self: self.runs.page_count > 0)
    @rule(branch=st.integers(0, 2), length=st.integers(0, 30))
    def lookup(self, branch: int, length: int) -> None:
        prompt = list(BRANCHES[branch][:length])
        got, want = self.runs.lookup(prompt), self.pages.lookup(prompt)
        assert got == want
        for node in NODES:
            assert got.fetch_plan(node) == want.fetch_plan(node)

    @invariant()
    def same_state(self) -> None:
        r, p = self.runs, self.pages
        r.check()
        assert r.page_count == p.page_count
        assert r.stats == p.stats
        for page in ALL_PAGES:
            if page in p:
                assert r.parent(page) == p.parent(page)
            for tier in Tier:
                assert r.holders(page, tier) == p.holders(page, tier)
        for node in NODES:
            for tier in Tier:
                assert r.pages_on(node, tier) == p.pages_on(node, tier)
                assert r.held_count(node, tier) == p.held_count(node, tier)


SimPatternAgainstPages.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestSimPatternAgainstPages = SimPatternAgainstPages.TestCase
