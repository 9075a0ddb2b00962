"""KV directory: KV events in, longest cached prefixes per node and tier out, peers for the missing pages."""

from __future__ import annotations

import pytest

from evolving_infra.core.kv_events import KvCleared, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.prefix_match import FetchRun

A, B, C = NodeId("A"), NodeId("B"), NodeId("C")
PROMPT = chain_hashes(bytes([i]) for i in range(8))


def stored(node: NodeId, tier: Tier, pages: list[PageHash], parent: PageHash | None = None) -> KvStored:
    return KvStored(node, tier, parent, tuple(pages), time=1.0)


@pytest.fixture
def directory() -> KvDirectory:
    d = KvDirectory()
    d.apply_all(
        [
            stored(A, Tier.GPU, PROMPT[:3]),
            stored(A, Tier.HOST, PROMPT[:2]),
            stored(B, Tier.HOST, PROMPT[:2]),
            stored(B, Tier.HOST, PROMPT[2:5], parent=PROMPT[1]),
            stored(C, Tier.GPU, PROMPT[5:6], parent=PROMPT[4]),
        ]
    )
    return d


def test_longest_prefix_per_node_and_tier(directory: KvDirectory) -> None:
    match = directory.lookup(PROMPT)
    assert match.pages == 8
    assert match.gpu == {A: 3}
    assert match.host == {A: 2, B: 5}
    assert match.either == {A: 3, B: 5}
    assert match.anywhere == 6
    assert match.pooled == 5
    # C holds page 5 itself and can fetch pages 0-4 from host memory; A and B stop where the pool stops.
    assert match.reachable == {A: 5, B: 5, C: 6}


def test_fetch_plan_names_the_peers_holding_the_missing_pages(directory: KvDirectory) -> None:
    match = directory.lookup(PROMPT)
    plan_a = match.fetch_plan(A)
    assert (plan_a.cached, plan_a.reachable) == (3, 5)
    assert plan_a.runs == (FetchRun(3, 5, frozenset({B})),)
    plan_c = match.fetch_plan(C)
    assert plan_c.runs == (FetchRun(0, 2, frozenset({A, B})), FetchRun(2, 5, frozenset({B})))
    assert plan_c.fetch_pages == 5
    stranger = match.fetch_plan(NodeId("new-node"))
    assert (stranger.cached, stranger.reachable, stranger.fetch_pages) == (0, 5, 5)


def test_tree_records_parents(directory: KvDirectory) -> None:
    assert directory.parent(PROMPT[0]) is None
    assert directory.parent(PROMPT[2]) == PROMPT[1]
    assert directory.parent(PROMPT[5]) == PROMPT[4]
    assert directory.page_count == 6
    assert directory.holders(PROMPT[0], Tier.HOST) == {A, B}
    with pytest.raises(KeyError, match="not in the directory"):
        directory.parent(PROMPT[7])


def test_removal_and_clear(directory: KvDirectory) -> None:
    directory.apply(KvRemoved(B, Tier.HOST, (PROMPT[3],), time=2.0))
    match = directory.lookup(PROMPT)
    assert match.host == {A: 2, B: 3} and match.pooled == 3 and match.anywhere == 3
    directory.apply(KvRemoved(B, Tier.HOST, (PROMPT[3], PROMPT[7]), time=2.0))
    assert directory.stats.removed_unheld == 2
    directory.apply(KvCleared(A, None, time=3.0))
    match = directory.lookup(PROMPT)
    assert match.gpu == {} and match.host == {B: 3}
    assert directory.held_count(A, Tier.GPU) == 0 and A in directory.nodes()
    directory.apply(KvCleared(B, Tier.HOST, time=3.0))
    assert directory.page_count == 1  # only C's page 5 is held anywhere
    assert PROMPT[0] not in directory and PROMPT[5] in directory


def test_unknown_parent_starts_a_new_root() -> None:
    d = KvDirectory()
    d.store(A, Tier.GPU, PageHash(999), PROMPT[3:5], 0.0)
    assert d.stats.unknown_parents == 1
    assert d.parent(PROMPT[3]) is None and d.parent(PROMPT[4]) == PROMPT[3]
    assert d.lookup(PROMPT).anywhere == 0
    assert d.lookup(PROMPT[3:]).gpu == {A: 2}
    d.store(B, Tier.GPU, None, PROMPT[4:5], 0.0)  # same page under another parent keeps the first one
    assert d.parent(PROMPT[4]) == PROMPT[3] and d.stats.parent_mismatches == 1


def test_events_for_unknown_nodes_are_no_ops() -> None:
    d = KvDirectory()
    d.apply(KvRemoved(A, Tier.GPU, (PROMPT[0],), time=0.0))
    d.apply(KvCleared(A, None, time=0.0))
    assert d.nodes() == () and d.stats.unknown_node_events == 2
    with pytest.raises(TypeError, match="not a KV event"):
        d.apply("stored")  # type: ignore[arg-type]


def test_drop_node_frees_its_index_for_reuse(directory: KvDirectory) -> None:
    assert directory.drop_node(A) == 5
    assert directory.nodes() == (B, C)
    assert directory.lookup(PROMPT).either == {B: 5}
    directory.store(NodeId("D"), Tier.GPU, None, PROMPT[:1], 5.0)
    assert directory.nodes() == (NodeId("D"), B, C)  # lowest free index first
    assert directory.lookup(PROMPT).gpu == {NodeId("D"): 1}
    assert directory.drop_node(A) == 0


def test_touch_updates_last_use_of_held_pages_only(directory: KvDirectory) -> None:
    assert directory.touch(A, Tier.GPU, [PROMPT[0], PROMPT[7]], 9.0) == 1
    assert directory.last_used(PROMPT[0], A, Tier.GPU) == 9.0
    assert directory.last_used(PROMPT[0], A, Tier.HOST) == 1.0
    assert directory.last_used(PROMPT[7], A, Tier.GPU) is None
    assert directory.pages_on(A, Tier.HOST) == {PROMPT[0]: 1.0, PROMPT[1]: 1.0}


def test_empty_and_unknown_prompts() -> None:
    d = KvDirectory()
    match = d.lookup([])
    assert (match.pages, match.anywhere, match.pooled, match.gpu, match.reachable) == (0, 0, 0, {}, {})
    match = d.lookup(iter(PROMPT))
    assert match.pages == 8 and match.anywhere == 0 and match.fetch_plan(A).runs == ()
