"""`labelblocks.LabelBlocks` against a dict as its oracle: ids assigned, looked up and removed in runs of
consecutive labels and one by one, blocks freed and reused, rows grown, any integer as a key."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.engine.labelblocks import WIDTH, LabelBlocks

BASES = st.sampled_from([0, 1, WIDTH - 3, 5 * WIDTH + 7, 256 * WIDTH - 100, 2**36 - 50, 2**44 + 1, 2**64 - 4 * WIDTH])
"""Where runs of labels start: block boundaries, a group of blocks' boundary (256 blocks), the last blocks found
through the arrays (below 2^36), a namespace tag's range, the top of the 64-bit range."""


class BlocksMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = LabelBlocks(rows=2)  # (small: the rows grow)
        self.oracle: dict[PageHash, int] = {}
        self.next_id = 0

    def _run(self, base: int, start: int, n: int) -> list[PageHash]:
        return [PageHash(base + start + j) for j in range(n) if base + start + j < 2**64]

    @rule(base=BASES, start=st.integers(0, 3 * WIDTH), n=st.integers(0, 2 * WIDTH))
    def assign_run(self, base: int, start: int, n: int) -> None:
        pages = [p for p in self._run(base, start, n) if p not in self.oracle]
        ids = np.arange(self.next_id, self.next_id + len(pages), dtype=np.int64)
        self.next_id += len(pages)
        self.blocks.assign(pages, ids)
        self.oracle.update(zip(pages, ids.tolist()))

    @rule(base=BASES, start=st.integers(0, 3 * WIDTH), i=st.integers(0, 2**31 - 1))
    def set_one(self, base: int, start: int, i: int) -> None:
        page = PageHash(min(base + start, 2**64 - 1))
        self.blocks[page] = i
        self.oracle[page] = i

    @rule(data=st.data())
    def remove_some(self, data: st.DataObject) -> None:
        if not self.oracle:
            return
        keys = sorted(self.oracle)
        chosen = data.draw(st.lists(st.sampled_from(keys), unique=True, max_size=40))
        if data.draw(st.booleans()) and chosen:
            del self.blocks[chosen[0]]
            del self.oracle[chosen[0]]
        else:
            self.blocks.remove(chosen)
            for page in chosen:
                del self.oracle[page]

    @rule(base=BASES, start=st.integers(0, 3 * WIDTH), n=st.integers(0, 2 * WIDTH), extra=st.lists(st.integers(0, 2**64 - 1), max_size=5))
    def lookup(self, base: int, start: int, n: int, extra: list[int]) -> None:
        pages = [*self._run(base, start, n), *map(PageHash, extra)]
        assert self.blocks.lookup(pages).tolist() == [self.oracle.get(p, -1) for p in pages]
        assert self.blocks.all_present(pages) == all(p in self.oracle for p in pages)
        assert self.blocks.all_absent(pages) == all(p not in self.oracle for p in pages)
        for page in pages[:3]:
            assert self.blocks.get(page) == self.oracle.get(page)
            assert (page in self.blocks) == (page in self.oracle)

    @invariant()
    def same_mapping(self) -> None:
        assert len(self.blocks) == len(self.oracle)
        assert dict(self.blocks.items()) == self.oracle
        # every row in use holds at least one id; a block's row is freed with its last id
        assert self.blocks.rows == len({p >> 6 for p in self.oracle})


BlocksMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestBlocks = BlocksMachine.TestCase


@settings(max_examples=100, deadline=None)
@given(pages=st.lists(st.integers(0, 2**64 - 1), unique=True, max_size=60))
def test_any_integers_map_as_a_dict_does(pages: list[int]) -> None:
    blocks = LabelBlocks()
    ids = np.arange(len(pages), dtype=np.int64)
    blocks.assign(list(map(PageHash, pages)), ids)
    assert blocks.lookup(pages).tolist() == list(range(len(pages)))
    blocks.remove(pages[::2])
    assert blocks.lookup(pages).tolist() == [-1 if j % 2 == 0 else j for j in range(len(pages))]
    assert sorted(blocks) == sorted(pages[1::2])


def test_errors_name_the_page_and_change_nothing() -> None:
    blocks = LabelBlocks()
    blocks.assign([PageHash(5), PageHash(6)], np.array([0, 1]))
    with pytest.raises(ValueError, match="already have ids"):
        blocks.assign([PageHash(7), PageHash(6)], np.array([2, 3]))
    with pytest.raises(KeyError):
        blocks.remove([PageHash(5), PageHash(9)])
    with pytest.raises(KeyError):
        del blocks[PageHash(10_000)]
    with pytest.raises(KeyError):
        blocks[PageHash(9)]
    with pytest.raises(ValueError, match="page id"):
        blocks[PageHash(9)] = -1
    assert dict(blocks.items()) == {5: 0, 6: 1} and len(blocks) == 2


def test_a_prompt_of_a_few_runs_costs_a_probe_per_block() -> None:
    """The point of the map: one row per block in use, rows freed and reused."""
    blocks = LabelBlocks(rows=2)
    run = [PageHash(1_000 + j) for j in range(10 * WIDTH)]
    blocks.assign(run, np.arange(len(run)))
    assert blocks.rows in (10, 11)
    blocks.remove(run)
    assert blocks.rows == 0 and len(blocks) == 0
    blocks.assign(run[:WIDTH], np.arange(WIDTH))
    assert blocks.rows <= 2 and blocks.memory_bytes() < 40 * WIDTH * 4
