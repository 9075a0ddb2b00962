"""Figure 4 of the paper, step by step: counts follow context management and KV transfers.

Both branches share a system prompt S = (s1, s2) and start on prefill node P1; D1 is a decode node.
"""

from __future__ import annotations

import pytest

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, Phase
from evolving_infra.router.branches import BranchTable

P1, P2, D1 = NodeId("P1"), NodeId("P2"), NodeId("D1")
B1, B2 = BranchId("branch-1"), BranchId("branch-2")
s1, s2, a1, a2, b1, b2, c1 = (PageHash(h) for h in (11, 12, 21, 22, 31, 32, 41))
S = (s1, s2)


@pytest.fixture
def table() -> BranchTable:
    t = BranchTable({P1: Phase.PREFILL, P2: Phase.PREFILL, D1: Phase.DECODE})
    for branch, own in ((B1, a1), (B2, b1)):
        version = t.request(branch, (*S, own))
        assert version.new_branch and version.version == 1 and version.old_path == ()
        t.place(branch, P1)
    return t


def counts(table: BranchTable, node: NodeId) -> dict[PageHash, int]:
    return table.counts_for(node)


def test_start_both_branches_on_p1(table: BranchTable) -> None:
    assert counts(table, P1) == {s1: 2, s2: 2, a1: 1, b1: 1}
    assert counts(table, P2) == {} and counts(table, D1) == {}


def test_a_consecutive_request_counts_only_its_new_block(table: BranchTable) -> None:
    version = table.request(B1, (*S, a1, a2))
    assert not version.rewritten and version.version == 1
    placement = table.place(B1, P1)
    assert placement.added == 1
    assert counts(table, P1) == {s1: 2, s2: 2, a1: 1, a2: 1, b1: 1}


def test_b_compaction_bumps_the_version_and_drops_the_old_blocks(table: BranchTable) -> None:
    table.request(B1, (*S, a1, a2))
    table.place(B1, P1)
    version = table.request(B1, (*S, c1))
    assert version.rewritten and version.version == 2 and version.old_path == (*S, a1, a2)
    # The dropped history is released at the request, before any placement.
    assert counts(table, P1) == {s1: 2, s2: 2, b1: 1}
    assert table.count(a1, P1) == 0 and table.count(a2, P1) == 0
    table.place(B1, P1)
    assert counts(table, P1) == {s1: 2, s2: 2, b1: 1, c1: 1}


def test_c_moving_branch_1_from_p1_to_p2_counts_on_p2_and_releases_p1(table: BranchTable) -> None:
    placement = table.place(B1, P2, held=False)
    assert placement.awaiting == (P1,) and placement.released == ()
    # Until P2 holds the current version, P1 keeps its counts so its copy is not evicted first.
    assert counts(table, P1) == {s1: 2, s2: 2, a1: 1, b1: 1}
    assert counts(table, P2) == {s1: 1, s2: 1, a1: 1}
    assert table.confirm_held(B1, P1, 1) == ()  # P1 is not the branch's prefill target any more
    assert table.confirm_held(B1, P2, 1) == (P1,)
    assert counts(table, P1) == {s1: 1, s2: 1, b1: 1}
    assert counts(table, P2) == {s1: 1, s2: 1, a1: 1}


def test_c_move_when_the_target_already_holds_the_version(table: BranchTable) -> None:
    placement = table.place(B1, P2, held=True)
    assert placement.released == (P1,)
    assert counts(table, P1) == {s1: 1, s2: 1, b1: 1}
    assert counts(table, P2) == {s1: 1, s2: 1, a1: 1}


def test_c_stale_confirmation_of_an_older_version_changes_nothing(table: BranchTable) -> None:
    table.place(B1, P2, held=False)
    table.request(B1, (*S, c1))  # rewritten to version 2 before P2 confirmed version 1
    assert table.confirm_held(B1, P2, 1) == ()
    assert table.stats.stale_confirmations == 1
    assert table.count(s1, P1) == 2


def test_d_alternating_p1_and_d1_keeps_both_copies(table: BranchTable) -> None:
    table.place(B1, D1)  # P2D: prefill copy stays counted
    assert counts(table, P1) == {s1: 2, s2: 2, a1: 1, b1: 1}
    assert counts(table, D1) == {s1: 1, s2: 1, a1: 1}
    table.request(B1, (*S, a1, a2))
    assert table.place(B1, P1).added == 1  # D2P: only the new block is counted
    assert counts(table, D1) == {s1: 1, s2: 1, a1: 1}
    assert table.place(B1, D1).added == 1
    assert counts(table, P1) == {s1: 2, s2: 2, a1: 1, a2: 1, b1: 1}
    assert counts(table, D1) == {s1: 1, s2: 1, a1: 1, a2: 1}


def test_branch_end_and_phase_switches(table: BranchTable) -> None:
    table.place(B1, D1)
    assert table.set_phase(D1, Phase.PREFILL) == (B1,)  # D -> P resets the counts on D1
    assert counts(table, D1) == {}
    table.set_phase(D1, Phase.DECODE)
    table.place(B2, D1)
    assert table.set_phase(P1, Phase.DECODE) == ()  # P -> D keeps them
    assert counts(table, P1) == {s1: 2, s2: 2, a1: 1, b1: 1}
    assert table.state(B2).unsettled == frozenset({Phase.DECODE})  # two decode copies of branch 2
    assert table.end(B1) and table.end(B2)
    assert not table.end(B2)
    assert all(counts(table, n) == {} for n in (P1, P2, D1))


def test_host_eviction_zeroes_the_counts_of_evicted_pages(table: BranchTable) -> None:
    assert table.evicted(P1, [s1, a1]) == 3
    assert counts(table, P1) == {s2: 2, b1: 1}
    assert table.state(B1).counted[P1] == frozenset({s2})
    table.place(B1, P1)  # placed again: P1 will hold them again after the prefill
    assert counts(table, P1) == {s1: 1, s2: 2, a1: 1, b1: 1}


def test_pushed_updates_carry_every_change_once(table: BranchTable) -> None:
    assert table.take_updates(P1) == {s1: 2, s2: 2, a1: 1, b1: 1}
    assert table.take_updates(P1) == {}
    table.end(B2)
    assert table.take_updates(P1) == {s1: 1, s2: 1, b1: 0}


def test_bad_input_names_what_is_missing() -> None:
    table = BranchTable({P1: Phase.PREFILL})
    with pytest.raises(KeyError, match="has no request yet"):
        table.place(B1, P1)
    table.request(B1, S)
    with pytest.raises(KeyError, match="has no phase"):
        table.place(B1, NodeId("nowhere"))
