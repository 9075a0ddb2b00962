"""`ChainRun` reads as the dict page -> parent of its chain (what the pool's run operations took before), and
`pages_and_parents` answers for it what it answers for that dict. The pool's operations over chain runs are
compared with the set tables' in `test_engine_idpool.py` (ops "admit" and "chain")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.node_agent.engine.chainrun import ChainRun, pages_and_parents


def _chain(n: int) -> tuple[PageHash, ...]:
    return tuple(chain_hashes(f"p{i}".encode() for i in range(n)))


@given(st.integers(1, 40), st.data())
def test_a_chain_run_reads_as_the_dict_of_its_pages_parents(n: int, data: st.DataObject) -> None:
    chain = _chain(n)
    start = data.draw(st.integers(0, n - 1))
    end = data.draw(st.integers(start + 1, n))
    run = ChainRun.of(chain, start, end)
    expected = {chain[i]: chain[i - 1] if i else None for i in range(start, end)}
    assert len(run) == len(expected) and list(run) == list(expected)
    assert dict(run) == expected and run == expected
    assert [run[page] for page in chain[start:end]] == list(expected.values())
    assert all(page in run for page in expected) and not any(page in run for page in chain[:start] + chain[end:])
    assert run.pairs() == list(expected.items()) and list(run.items()) == list(expected.items())
    assert run.parent == (chain[start - 1] if start else None)
    assert pages_and_parents(run) == (chain[start:end], (run.parent, *chain[start : end - 1]), True)
    pages, parents, is_chain = pages_and_parents(expected)
    assert (tuple(pages), tuple(parents), is_chain) == pages_and_parents(run)


def test_pages_and_parents_tells_a_chain_from_other_runs() -> None:
    a, b = _chain(3), tuple(chain_hashes([b"x", b"y"]))
    assert pages_and_parents({a[0]: None, a[1]: a[0], a[2]: a[1]})[2]
    assert not pages_and_parents({a[0]: None, b[0]: None})[2]
    assert not pages_and_parents({a[2]: a[1], b[1]: b[0]})[2]  # (two pieces, each with its own parent)


def test_a_chain_run_has_pages() -> None:
    with pytest.raises(ValueError, match="at least one page"):
        ChainRun((), None)
    with pytest.raises(KeyError):
        ChainRun(_chain(2), None)[PageHash(7)]
