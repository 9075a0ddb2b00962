"""Named random streams: reproducible per (seed, name), independent of each other, never global."""

from __future__ import annotations

import numpy as np
import pytest

from evolving_infra.sim.rng import RandomStreams, poisson_arrivals


def test_streams_depend_only_on_seed_and_name() -> None:
    a = RandomStreams(7)
    b = RandomStreams(7)
    b.get("other").random(1000)  # drawing from another stream first changes nothing
    assert np.array_equal(a.get("arrivals").random(5), b.get("arrivals").random(5))
    assert a.get("arrivals") is a.get("arrivals")
    assert not np.array_equal(RandomStreams(7).get("x").random(5), RandomStreams(8).get("x").random(5))
    assert not np.array_equal(RandomStreams(7).get("x").random(5), RandomStreams(7).get("y").random(5))


def test_streams_leave_global_state_alone() -> None:
    np.random.seed(3)
    expected = np.random.random(3)
    np.random.seed(3)
    RandomStreams(1).get("s").random(100)
    assert np.array_equal(np.random.random(3), expected)


def test_poisson_arrivals() -> None:
    times = poisson_arrivals(20_000, 2.0, RandomStreams(0).get("arrivals"), start=10.0)
    assert times == sorted(times) and times[0] > 10.0
    assert (times[-1] - 10.0) / len(times) == pytest.approx(0.5, rel=0.05)
    assert poisson_arrivals(0, 1.0, RandomStreams(0).get("a")) == []
    with pytest.raises(ValueError, match="rate_per_s"):
        poisson_arrivals(1, 0.0, RandomStreams(0).get("a"))
    with pytest.raises(ValueError, match="seed"):
        RandomStreams(-1)
