"""Invariants of splits and of Θ (eq. 5): fewest changes, monotone throughput, the split notation."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from evolving_infra.core.itermodel import DecodeCoefficients, PrefillCoefficients, decode_iteration_time
from evolving_infra.core.types import NodeId, Phase
from evolving_infra.router.planner import (
    CoefficientNodeModel,
    MeanWork,
    batch_limit,
    changed_nodes,
    decode_rate,
    fewest_changes_split,
    format_split,
    parse_split,
    split_counts,
    split_throughput,
)

prefill_coefs = st.builds(
    PrefillCoefficients,
    c0=st.floats(0.0, 0.1),
    c1=st.floats(0.0, 1e-3),
    c2=st.floats(0.0, 1e-8),
    c3=st.floats(0.0, 1e-5),
)
decode_coefs = st.builds(
    DecodeCoefficients,
    d0=st.floats(1e-4, 0.1),
    d1=st.floats(0.0, 0.1),
    d2=st.floats(0.0, 1e-3),
    k=st.integers(1, 8),
    experts=st.just(256),
    t_fwd=st.floats(1.0, 4.0),
)
models = st.builds(
    CoefficientNodeModel, prefill_coefs, decode_coefs, t_bar=st.floats(64.0, 16_384.0), f_restore=st.floats(0.0, 1.0),
    decode_kv_tokens=st.one_of(st.just(math.inf), st.floats(1_000.0, 5e6)),  # no cap, or a KV memory
)  # fmt: skip


@st.composite
def mean_works(draw: st.DrawFn) -> MeanWork:
    t_uc = draw(st.floats(1.0, 50_000.0))
    t_c = draw(st.floats(0.0, 200_000.0))
    return MeanWork(
        t_uc=t_uc,
        t_c=t_c,
        query_key_pairs=t_uc * t_c + t_uc * (t_uc + 1) / 2,
        decode_iterations=draw(st.floats(1.0, 5_000.0)),
        t_out=draw(st.floats(0.0, 20_000.0)),
    )


@st.composite
def splits(draw: st.DrawFn) -> dict[NodeId, Phase]:
    n = draw(st.integers(1, 40))
    phases = draw(st.lists(st.sampled_from(Phase), min_size=n, max_size=n))
    return {NodeId(f"node-{i:02d}"): p for i, p in enumerate(phases)}


@given(splits(), st.data())
def test_fewest_changes_split_changes_exactly_the_difference(current: dict[NodeId, Phase], data: st.DataObject) -> None:
    p = data.draw(st.integers(0, len(current)))
    costs = data.draw(st.dictionaries(st.sampled_from(sorted(current)), st.floats(0.0, 10.0)))
    target = fewest_changes_split(current, p, costs)
    have, _ = split_counts(current)
    moved = changed_nodes(current, target)
    assert split_counts(target)[0] == p
    assert len(moved) == abs(p - have)
    # All moves go one way, and they take the cheapest nodes of the shrinking pool.
    assert len({current[n] for n in moved}) <= 1
    if moved:
        donor = current[moved[0]]
        kept = [n for n, ph in current.items() if ph is donor and n not in moved]
        assert max(costs.get(n, 0.0) for n in moved) <= min((costs.get(n, 0.0) for n in kept), default=float("inf"))


def test_fewest_changes_split_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match=r"prefill_count must be in \[0, 2\]"):
        fewest_changes_split({NodeId("a"): Phase.PREFILL, NodeId("b"): Phase.DECODE}, 3)


@given(st.integers(0, 500), st.integers(0, 500))
def test_split_notation_round_trips(p: int, d: int) -> None:
    phases = {NodeId(f"n{i}"): (Phase.PREFILL if i < p else Phase.DECODE) for i in range(p + d)}
    assert parse_split(format_split(phases)) == (p, d)


@pytest.mark.parametrize("bad", ["", "4P", "P5D", "4D5P", "4p5dx", "-1P2D"])
def test_bad_split_notation_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="is not of the form"):
        parse_split(bad)


@given(st.lists(models, min_size=1, max_size=6), models, mean_works(), st.floats(0.0, 500.0))
def test_adding_a_prefill_node_never_lowers_prefill_throughput(
    pool: list[CoefficientNodeModel], extra: CoefficientNodeModel, work: MeanWork, q_bar: float
) -> None:
    by_id = {NodeId(f"p{i}"): m for i, m in enumerate(pool)} | {NodeId("extra"): extra, NodeId("d"): pool[0]}
    prefill = [n for n in by_id if n.startswith("p")]
    before = split_throughput(prefill, [NodeId("d")], by_id, work, q_bar)
    after = split_throughput([*prefill, NodeId("extra")], [NodeId("d")], by_id, work, q_bar)
    assert after.prefill >= before.prefill
    assert after.decode == before.decode


@given(st.lists(models, min_size=1, max_size=6), mean_works(), st.floats(0.0, 500.0), st.floats(0.0, 500.0))
def test_decode_throughput_never_falls_when_more_requests_are_in_decode(
    pool: list[CoefficientNodeModel], work: MeanWork, q1: float, q2: float
) -> None:
    low, high = sorted((q1, q2))
    by_id = {NodeId(f"d{i}"): m for i, m in enumerate(pool)}
    a = split_throughput([], list(by_id), by_id, work, low)
    b = split_throughput([], list(by_id), by_id, work, high)
    assert b.decode >= a.decode * (1 - 1e-12)


@given(models, mean_works(), st.floats(0.1, 500.0), st.integers(1, 30))
def test_identical_decode_nodes_never_lose_throughput_from_one_more_node(
    model: CoefficientNodeModel, work: MeanWork, q_bar: float, d: int
) -> None:
    by_id = {NodeId(f"d{i}"): model for i in range(d + 1)}
    fewer = split_throughput([], list(by_id)[:d], by_id, work, q_bar)
    more = split_throughput([], list(by_id), by_id, work, q_bar)
    assert more.decode >= fewer.decode * (1 - 1e-12)


@given(models, mean_works(), st.floats(0.0, 10_000.0), st.floats(0.1, 500.0), st.integers(1, 8))
def test_more_prefill_work_never_raises_theta(
    model: CoefficientNodeModel, work: MeanWork, extra_uc: float, q_bar: float, p: int
) -> None:
    assume(extra_uc > 0)
    t_uc = work.t_uc + extra_uc
    heavier = MeanWork(t_uc, work.t_c, t_uc * work.t_c + t_uc * (t_uc + 1) / 2, work.decode_iterations, work.t_out)
    by_id = {NodeId(f"n{i}"): model for i in range(p + 1)}
    ids = list(by_id)
    light = split_throughput(ids[:p], ids[p:], by_id, work, q_bar)
    heavy = split_throughput(ids[:p], ids[p:], by_id, heavier, q_bar)
    assert heavy.prefill <= light.prefill and heavy.theta <= light.theta


def test_no_requests_in_decode_means_no_decode_throughput() -> None:
    model = CoefficientNodeModel(
        PrefillCoefficients(0.02, 5e-5, 1e-10, 1e-6), DecodeCoefficients(0.015, 0.02, 2e-4, 8, 256), 8192.0
    )
    work = MeanWork(t_uc=100.0, t_c=0.0, query_key_pairs=5050.0, decode_iterations=10.0)
    tp = split_throughput([NodeId("a")], [NodeId("b")], {NodeId("a"): model, NodeId("b"): model}, work, 0.0)
    assert tp.decode == 0.0 and tp.theta == 0.0 and tp.prefill > 0


@given(st.lists(models, min_size=1, max_size=6), mean_works(), st.floats(0.0, 2_000.0))
def test_a_decode_node_runs_at_most_the_batch_its_kv_memory_holds(
    pool: list[CoefficientNodeModel], work: MeanWork, q_bar: float
) -> None:
    by_id = {NodeId(f"d{i}"): m for i, m in enumerate(pool)}
    batch = q_bar / len(pool)
    tp = split_throughput([], list(by_id), by_id, work, q_bar)
    footprint = work.t_uc + work.t_c + work.t_out
    expected = 0.0
    for m in pool:
        cap = m.decode_kv_tokens / footprint if footprint > 0 else math.inf
        assert batch_limit(m, work) == cap
        b = min(batch, cap)
        expected += b / (m.decode_iteration_time(b) * work.decode_iterations) if b > 0 else 0.0
    assert tp.decode == pytest.approx(expected, rel=1e-12)
    # past the cap, more requests in decode wait: the rate is the capped one, however many there are
    for m in pool:
        cap = batch_limit(m, work)
        if math.isfinite(cap):
            assert decode_rate(m, work, cap * 3) == decode_rate(m, work, cap)


def test_few_decode_nodes_are_rated_at_what_their_kv_memory_holds() -> None:
    """The partition's density (40 agents a node, contexts of ~100K tokens): 160 requests waiting for three decode
    nodes whose GPU memory holds ~20 each; without the cap eq. 4 batches 53 a node."""
    decode = DecodeCoefficients(0.005, 0.01365, 0.000412, 8, 256, 4.0)
    prefill = PrefillCoefficients(0.01, 2.41e-5, 1.73e-10, 1.37e-7)
    capped = CoefficientNodeModel(prefill, decode, 8192.0, decode_kv_tokens=2_060_000.0)
    uncapped = CoefficientNodeModel(prefill, decode, 8192.0)
    work = MeanWork(t_uc=2_000.0, t_c=98_000.0, query_key_pairs=2e8, decode_iterations=300.0, t_out=750.0)
    nodes = [NodeId("d0"), NodeId("d1"), NodeId("d2")]
    assert batch_limit(capped, work) == pytest.approx(2_060_000.0 / 100_750.0)  # ~20.4 requests
    with_cap = split_throughput([], nodes, dict.fromkeys(nodes, capped), work, 160.0).decode
    without = split_throughput([], nodes, dict.fromkeys(nodes, uncapped), work, 160.0).decode
    b = 2_060_000.0 / 100_750.0
    assert with_cap == pytest.approx(3 * b / (decode_iteration_time(decode, b) * 300.0))
    assert without > 1.6 * with_cap  # 13.1 against 7.8 requests per second
    # below the cap nothing changes
    light = split_throughput([], nodes, dict.fromkeys(nodes, capped), work, 30.0).decode
    assert light == split_throughput([], nodes, dict.fromkeys(nodes, uncapped), work, 30.0).decode
