"""Parameters: every default names its source, overrides reach every knob, bad values are refused by name."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.workloads import (
    KINDS,
    CCParams,
    LogNormal,
    OverrideError,
    ShiftParams,
    default_params,
    describe,
    generate,
    shapes,
    with_overrides,
)
from evolving_infra.workloads.builder import AgentBuilder
from evolving_infra.workloads.dist import apportion, interleave, poisson_arrivals


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_default_names_its_source(kind: str) -> None:
    rows = describe(default_params(kind))
    assert rows
    for path, _, source in rows:
        assert source, f"{kind}: parameter {path} has no documented source"
        assert "assumption" in source or any(w in source for w in ("table", "figure", "section", "appendix")), path


def test_overrides_set_nested_fields_and_means() -> None:
    p = with_overrides(CCParams(), {"tool_pause_s": 5, "output_tokens.sigma": 0.1, "fork_prob": "0.2"})
    assert p.tool_pause_s == LogNormal(5.0, CCParams().tool_pause_s.sigma, lo=0.2, hi=600.0)
    assert p.output_tokens.sigma == 0.1 and p.output_tokens.mean == CCParams().output_tokens.mean
    assert p.fork_prob == 0.2
    shift = with_overrides(ShiftParams(), {"putnam.pause_s.mean": 8, "periods": '[{"name": "x", "duration_s": 60, '
                                           '"concurrency": {"osworld": 4}}]'})  # fmt: skip
    assert shift.putnam.pause_s.mean == 8 and [p.name for p in shift.periods] == ["x"]


def test_overrides_change_the_generated_shape() -> None:
    base = shapes(generate("putnam", 40, 5))["putnam"]
    slower = shapes(generate("putnam", 40, 5, pause_s__mean=30.0))["putnam"]
    assert slower.mean_pause_s > 2 * base.mean_pause_s


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"nope": 1}, "no parameter 'nope'"),
        ({"tool_pause_s.median": 1}, "known: mean, sigma, lo, hi"),
        ({"fork_prob": 1.5}, "probability"),
        ({"main_steps": "many"}, "not a JSON value"),
        ({"main_steps": -3}, "mean must be"),
        ({"compact_at_tokens": 2.5}, "expects an integer"),
        ({"compact_at_tokens": 300_000}, "compact_at_tokens"),
        ({"tool_pause_s.sigma": 9}, "sigma must be in [0, 5]"),
        ({"a..b": 1}, "bad parameter path"),
    ],
)
def test_bad_overrides_are_refused_by_name(overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(OverrideError, match=None) as info:
        with_overrides(CCParams(), overrides)
    assert fragment in str(info.value)


def test_bad_generate_arguments() -> None:
    with pytest.raises(ValueError, match="unknown workload kind 'chat'"):
        generate("chat", 3, 1)
    with pytest.raises(ValueError, match="agents must be an integer >= 1"):
        generate("cc", 0, 1)
    with pytest.raises(ValueError, match="at least 4 agents"):
        generate("shift", 3, 1)


def test_builder_refuses_broken_requests() -> None:
    b = AgentBuilder("a0", "x", 0.0, {"p": 10})
    main = b.branch("main")
    with pytest.raises(ValueError, match="keep 11 outside"):
        b.request(main, after=[], delay_s=0.0, shared="p", keep=11, new=1, output=1)
    r = b.request(main, after=[], delay_s=0.0, shared="p", keep=10, new=1, output=5)
    with pytest.raises(ValueError, match="keep 17 outside"):
        b.request(main, after=[r], delay_s=0.0, base=r, keep=17, new=0, output=1)
    with pytest.raises(ValueError, match="bad sizes"):
        b.request(main, after=[r], delay_s=0.0, base=r, keep=16, new=0, output=0)
    with pytest.raises(ValueError, match="unknown request"):
        b.request(main, after=["zz"], delay_s=0.0, base=r, keep=16, new=0, output=1)


@given(total=st.integers(0, 10_000), weights=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=6))
def test_apportion_adds_up_and_stays_within_one(total: int, weights: list[float]) -> None:
    if sum(weights) <= 0:
        with pytest.raises(ValueError):
            apportion(total, weights)
        return
    counts = apportion(total, weights)
    assert sum(counts) == total
    for c, w in zip(counts, weights, strict=True):
        assert abs(c - total * w / sum(weights)) < 1 + 1e-9


@given(counts=st.dictionaries(st.sampled_from("abcd"), st.integers(0, 60), min_size=1))
def test_interleave_keeps_every_prefix_near_its_share(counts: dict[str, int]) -> None:
    out = interleave(counts)
    total = sum(counts.values())
    assert sorted(out) == sorted(k for k, n in counts.items() for _ in range(n))
    for i in range(1, total + 1):
        for k, n in counts.items():
            assert abs(out[:i].count(k) - i * n / total) < len(counts)


@given(
    mean=st.floats(0.01, 1e6),
    sigma=st.floats(0.0, 3.0),
    lo=st.floats(0.0, 10.0),
    span=st.floats(0.0, 1e6),
    seed=st.integers(0, 2**32),
)
def test_lognormal_draws_stay_in_bounds(mean: float, sigma: float, lo: float, span: float, seed: int) -> None:
    d = LogNormal(mean, sigma, lo=lo, hi=lo + span)
    rng = random.Random(seed)
    for _ in range(20):
        x = d.sample(rng)
        assert lo <= x <= lo + span and math.isfinite(x)


@pytest.mark.parametrize(("mean", "sigma"), [(10.0, 0.5), (600.0, 1.2), (3.0, 0.0)])
def test_lognormal_mean_is_the_mean(mean: float, sigma: float) -> None:
    rng = random.Random(1)
    draws = [LogNormal(mean, sigma).sample(rng) for _ in range(40_000)]
    assert sum(draws) / len(draws) == pytest.approx(mean, rel=0.04)


def test_poisson_arrivals_have_the_rate() -> None:
    times = poisson_arrivals(random.Random(3), 5_000, rate_per_s=0.5)
    assert times[0] == 0.0 and times == sorted(times)
    assert times[-1] / (len(times) - 1) == pytest.approx(2.0, rel=0.05)
