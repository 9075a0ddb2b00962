"""Quiet decode iterations skipped in one go (`EngineCore.quiet_ahead` / `skip_quiet`, what the simulator's quiet runs
use) against the same iterations stepped one by one: the same durations (noise draws included), and the same engine
afterwards, whatever point the skipping stops at (a request arriving in the middle of a quiet stretch).

Two engines get the same random stream of decode requests; one steps every iteration, the other, after each of its
steps, asks for the quiet iterations ahead and skips a random number of them while the first steps them. Every step
output of the two (when both step) is equal, and so are their gauges at the end.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.types import NodeId, NodeMode
from evolving_infra.node_agent.engine import EngineCore, IterationKind
from tests.node_agent.test_engine_decode_events import _profile, _request


def _engine(l1_pages: int, noise: float) -> EngineCore:
    return EngineCore(NodeId("d0"), _profile(l1_pages), NodeMode.DECODE, BranchCountEviction(), check_invariants=True,
                      report_detail=False, noise=noise, rng=random.Random(11) if noise else None)  # fmt: skip


def _run(specs: list[tuple[int, int, int, float]], l1_pages: int, noise: float, cuts: list[int]) -> int:
    """Both engines through `specs` (arrival step, prompt, output, t_acc); returns the iterations skipped."""
    stepped, skipping = _engine(l1_pages, noise), _engine(l1_pages, noise)
    arrivals = [(arrive, _request(i, *spec)) for i, (arrive, *spec) in enumerate(specs)]
    last = max(arrive for arrive, _ in arrivals)
    cut = iter(cuts * 50)
    skipped = 0
    now = 0.0
    for step in range(3000):
        for arrive, req in arrivals:
            if arrive == step:
                assert stepped.submit_decode(req, now) == skipping.submit_decode(req, now)
        a, b = stepped.step(now), skipping.step(now)
        assert a == b
        if a.kind is IterationKind.IDLE:
            if step > last:
                break
            continue
        now = a.end
        ahead = skipping.quiet_ahead(now, 64)
        if not ahead:
            continue
        count = min(next(cut, 0), len(ahead))
        starts, ends = [], []
        for duration in ahead[:count]:
            out = stepped.step(now)
            assert out.kind is IterationKind.DECODE and not out.events and not out.decodes_finished
            assert out.duration == duration
            starts.append(now)
            now = out.end
            ends.append(now)
        skipping.skip_quiet(starts, ends)
        skipped += count
        assert skipping.busy_until == stepped.busy_until
    assert stepped.gauges() == skipping.gauges()
    return skipped


specs = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 30), st.integers(1, 40), st.sampled_from([0.3, 0.5, 1.0, 1.5, 3.7])),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60)
@given(specs=specs, l1_pages=st.sampled_from([20, 60]), noise=st.sampled_from([0.0, 0.05]),
       cuts=st.lists(st.integers(0, 70), min_size=1, max_size=8))  # fmt: skip
def test_skipping_quiet_iterations_equals_stepping_them(
    specs: list[tuple[int, int, int, float]], l1_pages: int, noise: float, cuts: list[int]
) -> None:
    _run(specs, l1_pages, noise, cuts)


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_a_quiet_stretch_cut_by_an_arrival(noise: float) -> None:
    """One long request at 0.5 tokens per iteration (quiet until it finishes after 80), a second arriving in the
    middle of the stretch: skipping all of each stretch, or part of it, gives what stepping gives."""
    specs = [(0, 2, 40, 0.5), (9, 5, 12, 1.0)]
    assert _run(specs, 60, noise, [64]) > 20
    assert _run(specs, 60, noise, [3, 0, 5]) > 5


def test_skipping_more_than_is_quiet_is_refused() -> None:
    engine = _engine(60, 0.0)
    engine.submit_decode(_request(0, 2, 40, 0.5), 0.0)
    now = engine.step(0.0).end
    ahead = engine.quiet_ahead(now, 100)
    assert ahead and len(ahead) == 78  # (80 iterations: the first stepped, the last finishes it)
    starts = [now + i for i in range(len(ahead) + 1)]
    with pytest.raises(ValueError, match="quiet iterations asked"):
        engine.skip_quiet(starts, [s + 1 for s in starts])
