"""The samples of one phase are converted to numpy incrementally: fitting along the way gives exactly the fits
of a fitter that saw the same iterations and fitted once (bit for bit), and the arrays hold every sample in order.
`fit_prefill` is `fit`'s prefill half."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.itermodel import IterationRecord, PrefillItem
from evolving_infra.core.types import NodeId, Phase
from evolving_infra.router.fitphase import PhaseSamples
from evolving_infra.router.fitting import ModelFitter

NODE = NodeId("n0")

prefill = st.tuples(st.integers(1, 8192), st.integers(0, 100_000), st.integers(0, 100))
iterations = st.lists(
    st.tuples(
        st.one_of(st.lists(prefill, min_size=1, max_size=3), st.integers(1, 64)),
        st.floats(0.001, 2.0),
        st.booleans(),  # fit after this iteration
    ),
    max_size=80,
)


def _record(content: list[tuple[int, int, int]] | int, duration: float) -> IterationRecord:
    if isinstance(content, int):
        return IterationRecord(NODE, Phase.DECODE, 0.0, duration, (), content)
    items = tuple(PrefillItem(uc, c, min(rst, c)) for uc, c, rst in content)
    return IterationRecord(NODE, Phase.PREFILL, 0.0, duration, items)


@given(iterations)
def test_fitting_along_the_way_equals_fitting_once(stream: list[tuple[list[tuple[int, int, int]] | int, float, bool]]) -> None:
    along, once = ModelFitter(NODE, 8, 256, 2.0), ModelFitter(NODE, 8, 256, 2.0)
    for content, duration, fit_now in stream:
        record = _record(content, duration)
        along.observe(record)
        once.observe(record)
        if fit_now:
            coefficients, usage = along.fit_prefill()
            full = along.fit()
            assert (coefficients, usage) == (full.prefill, full.usage)
    assert along.samples == once.samples
    assert along.fit() == once.fit()
    if stream and stream[-1][2]:  # a fit of the prefill phase alone leaves nothing for `freeze` to reuse
        once.fit_prefill()
    assert along.freeze() == once.freeze()


@given(st.lists(st.lists(st.tuples(st.floats(0, 1e6), st.floats(0.001, 9.0)), max_size=5), max_size=6))
def test_samples_hold_every_row_in_order(batches: list[list[tuple[float, float]]]) -> None:
    samples = PhaseSamples(2)
    seen: list[tuple[float, float]] = []
    for batch in batches:
        for value, time in batch:
            samples.add((1.0, value), time)
            seen.append((value, time))
        x, y = samples.arrays()
        assert len(samples) == len(seen) == len(y) and x.shape == (len(seen), 2)
        assert np.array_equal(x, np.array([(1.0, v) for v, _ in seen]).reshape(-1, 2))
        assert np.array_equal(y, np.array([t for _, t in seen]))
