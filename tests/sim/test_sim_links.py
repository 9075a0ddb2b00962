"""Fetches and KV transfers share bandwidth (`sim.links`): one flow alone takes the profile's time, concurrent
flows through one node take longer, and the fair shares never exceed a resource (property-tested)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.sim.links import ARRAYS_FROM, FlowKind, LinkModel, Resource, _fair_rates_arrays, fair_rates

GLM = load_profile("glm-5.2-4xgb300-tp4")


def run_to_end(model: LinkModel) -> dict[object, float]:
    """Land every flow; the completion time of each (latency included)."""
    done: dict[object, float] = {}
    while model.flows:
        at = model.next_landing()
        assert at is not None
        for landed in model.land(at):
            done[landed.flow.key] = landed.at
    return done


def test_a_fetch_alone_takes_the_profiles_fetch_time_and_a_transfer_its_transfer_time() -> None:
    model = LinkModel(GLM)
    tokens = 40_000
    model.start("f", FlowKind.FETCH, "n1", "n0", tokens * GLM.kv_bytes_per_token, 2.0)
    model.start("t", FlowKind.TRANSFER, "n2", "n3", tokens * GLM.kv_bytes_per_token, 2.0)
    done = run_to_end(model)
    assert done["f"] == pytest.approx(2.0 + GLM.fetch_time(tokens), rel=1e-9)
    assert done["t"] == pytest.approx(2.0 + GLM.transfer_time(tokens), rel=1e-9)


def test_concurrent_fetches_from_one_node_take_longer_than_one_alone() -> None:
    nbytes = 64_000 * GLM.kv_bytes_per_token
    alone = LinkModel(GLM)
    alone.start("a", FlowKind.FETCH, "src", "n1", nbytes, 0.0)
    single = run_to_end(alone)["a"]
    shared = LinkModel(GLM)
    for i in range(4):  # four nodes pull from one source: its NIC out (100 GB/s) is split four ways
        shared.start(i, FlowKind.FETCH, "src", f"n{i + 1}", nbytes, 0.0)
    times = run_to_end(shared)
    assert all(t > single * 1.5 for t in times.values())
    nic = GLM.nic_bandwidth
    assert nic is not None
    assert max(times.values()) == pytest.approx(GLM.fetch_latency + 4 * nbytes / nic, rel=1e-9)
    # pulls from different sources into different nodes do not slow each other
    apart = LinkModel(GLM)
    for i in range(4):
        apart.start(i, FlowKind.FETCH, f"s{i}", f"n{i}", nbytes, 0.0)
    assert all(t == pytest.approx(single, rel=1e-9) for t in run_to_end(apart).values())


def test_a_transfer_into_a_node_slows_a_fetch_into_it_and_the_rest_speeds_up_when_one_ends() -> None:
    model = LinkModel(GLM.model_copy(update={"nic_bandwidth": 60e9}))
    model.start("fetch", FlowKind.FETCH, "peer", "n0", 52e9, 0.0)  # alone: ~1 s at 52 GB/s
    model.start("kv", FlowKind.TRANSFER, "p", "n0", 6e9, 0.0)  # shares n0's NIC in: 30 GB/s each
    assert model.flows["fetch"].rate == pytest.approx(30e9) and model.flows["kv"].rate == pytest.approx(30e9)
    done = run_to_end(model)
    assert done["kv"] == pytest.approx(0.2)
    # 6 GB at 30 GB/s, then the remaining 46 GB at the fetch's own cap (52 GB/s)
    assert done["fetch"] == pytest.approx(0.2 + 46e9 / 52e9 + GLM.fetch_latency)


def test_host_memory_bandwidth_limits_fetches_through_one_node() -> None:
    profile = GLM.model_copy(update={"nic_bandwidth": 1e12, "host_memory_bandwidth": 60e9})
    model = LinkModel(profile)
    model.start("a", FlowKind.FETCH, "s1", "n0", 1e9, 0.0)
    model.start("b", FlowKind.FETCH, "s2", "n0", 1e9, 0.0)
    assert model.flows["a"].rate == pytest.approx(30e9)  # n0's host memory is written by both


def test_bad_flows_are_refused() -> None:
    model = LinkModel(GLM)
    model.start("a", FlowKind.FETCH, "s", "t", 10, 1.0)
    with pytest.raises(ValueError, match="already in flight"):
        model.start("a", FlowKind.FETCH, "s", "t", 10, 1.0)
    with pytest.raises(ValueError, match="bytes must be >= 0"):
        model.start("b", FlowKind.FETCH, "s", "t", -1, 1.0)
    with pytest.raises(ValueError, match="time went backwards"):
        model.advance(0.5)


NODES = ["a", "b", "c", "d"]
flow_spec = st.tuples(
    st.floats(1.0, 100.0),  # the flow's own cap
    st.lists(st.tuples(st.sampled_from(NODES), st.sampled_from(list(Resource))), min_size=1, max_size=4, unique=True),
)


@settings(max_examples=200, deadline=None)
@given(flows=st.lists(flow_spec, min_size=1, max_size=12), caps=st.lists(st.floats(1.0, 200.0), min_size=3, max_size=3))
def test_fair_rates_fill_no_resource_beyond_capacity_and_every_flow_is_bottlenecked(
    flows: list[tuple[float, list[tuple[str, Resource]]]], caps: list[float]
) -> None:
    capacity = dict(zip(Resource, caps, strict=True))
    spec = [(i, cap, tuple(res)) for i, (cap, res) in enumerate(flows)]
    rates = fair_rates(spec, lambda r: capacity[r])
    assert set(rates) == {i for i, _, _ in spec}
    load: dict[tuple[str, Resource], float] = {}
    for i, _, res in spec:
        for r in res:
            load[r] = load.get(r, 0.0) + rates[i]
    for r, used in load.items():
        assert used <= capacity[r[1]] * (1 + 1e-9)
    for i, cap, res in spec:
        assert 0 < rates[i] <= cap * (1 + 1e-9)
        # max-min fairness: a flow below its cap crosses a full resource where no flow gets more than it
        if rates[i] < cap * (1 - 1e-9):
            full = [r for r in res if math.isclose(load[r], capacity[r[1]], rel_tol=1e-6)]
            assert full, (i, rates[i], cap)
            assert any(all(rates[j] <= rates[i] * (1 + 1e-6) for j, _, rj in spec if r in rj) for r in full)


def test_loads_from_host_memory_get_what_the_fetches_through_it_leave() -> None:
    profile = GLM.model_copy(update={"host_memory_bandwidth": 120e9})
    model = LinkModel(profile)
    cap = profile.load_bandwidth  # 200 GB/s
    assert model.host_share("n0", cap) == cap  # nothing else: the profile's load bandwidth
    model.start("a", FlowKind.FETCH, "src", "n0", 1e12, 0.0)  # writes n0's host memory at 52 GB/s
    assert model.host_share("n0", cap) == pytest.approx(120e9 - 52e9)
    model.start("b", FlowKind.FETCH, "n0", "dst", 1e12, 0.0)  # and another one reads it
    assert model.host_share("n0", cap) == pytest.approx(120e9 / 3)  # an equal share with the two
    assert model.host_share("elsewhere", cap) == cap



def _fair_rates_every_resource(flows, capacity):  # type: ignore[no-untyped-def]
    """The progressive filling as first written: every resource visited in every round, emptied ones too (the
    definition `fair_rates` must equal bit for bit; it leaves emptied resources out)."""
    pending = {key: (cap, res) for key, cap, res in flows}
    rates, left, users = {}, {}, {}
    for key, (_, res) in pending.items():
        for r in res:
            left.setdefault(r, capacity(r[1]))
            users.setdefault(r, set()).add(key)
    level = 0.0
    while pending:
        step = min(cap - level for cap, _ in pending.values())
        for r, keys in users.items():
            if keys:
                step = min(step, left[r] / len(keys))
        step = max(0.0, step)
        level += step
        for r, keys in users.items():
            left[r] -= step * len(keys)
        frozen = {key for key, (cap, _) in pending.items() if cap - level <= 1e-9 * max(1.0, cap)}
        for r, keys in users.items():
            if keys and left[r] <= 1e-9 * max(1.0, capacity(r[1])):
                frozen |= keys
        if not frozen:
            frozen = {min(pending, key=lambda k: pending[k][0])}
        for key in frozen:
            rates[key] = level
            for r in pending[key][1]:
                users[r].discard(key)
            del pending[key]
    return rates


@settings(max_examples=300, deadline=None)
@given(flows=st.lists(flow_spec, min_size=1, max_size=16), caps=st.lists(st.floats(1.0, 200.0), min_size=3, max_size=3))
def test_fair_rates_equal_the_filling_over_every_resource_bit_for_bit(
    flows: list[tuple[float, list[tuple[str, Resource]]]], caps: list[float]
) -> None:
    capacity = dict(zip(Resource, caps, strict=True))
    spec = [(i, cap, tuple(res)) for i, (cap, res) in enumerate(flows)]
    expected = _fair_rates_every_resource(spec, capacity.__getitem__)
    assert fair_rates(spec, capacity.__getitem__) == expected
    # the filling over arrays (what many flows take) is the same arithmetic: equal bit for bit as well
    pending = {key: (cap, res) for key, cap, res in spec}
    assert _fair_rates_arrays(pending, capacity.__getitem__) == expected


@settings(max_examples=100, deadline=None)
@given(flows=st.lists(flow_spec, min_size=ARRAYS_FROM, max_size=3 * ARRAYS_FROM),
       caps=st.lists(st.sampled_from([10.0, 40.0, 100.0, 150.0]), min_size=3, max_size=3))  # fmt: skip
def test_many_flows_take_the_array_filling_with_the_same_rates(
    flows: list[tuple[float, list[tuple[str, Resource]]]], caps: list[float]
) -> None:
    """Past ARRAYS_FROM flows (many crossing the same few resources, caps that tie) `fair_rates` fills over
    arrays and gives the rates of the filling as first written, bit for bit."""
    capacity = dict(zip(Resource, caps, strict=True))
    spec = [(i, float(round(cap)), tuple(res)) for i, (cap, res) in enumerate(flows)]
    assert fair_rates(spec, capacity.__getitem__) == _fair_rates_every_resource(spec, capacity.__getitem__)


def _host_share_by_scan(model: LinkModel, node: str, cap: float) -> float:
    """`host_share` as first written: every flow in flight scanned for the node's host memory."""
    host = model.capacity(Resource.HOST_MEMORY)
    key = (node, Resource.HOST_MEMORY)
    users = [f for f in model.flows.values() if key in f.resources and not (f.remaining <= 1e-3 or f.remaining <= f.rate * 1e-9)]
    if not users:
        return cap
    return min(cap, max(host - sum(f.rate for f in users), host / (len(users) + 1)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["start", "start", "land", "cancel"]), st.sampled_from(NODES),
                          st.sampled_from(NODES), st.booleans(), st.floats(1e9, 1e12), st.floats(0.0, 5.0)),
                max_size=40))  # fmt: skip
def test_host_shares_read_from_the_flows_through_each_host_memory_equal_the_full_scan(
    ops: list[tuple[str, str, str, bool, float, float]],
) -> None:
    """`host_share` reads the flows through one host memory (kept as flows start, land and are cancelled) and
    gives what scanning every flow in flight gives, bit for bit (the same flows, summed in the same order)."""
    model = LinkModel(GLM.model_copy(update={"host_memory_bandwidth": 120e9}))
    now, n = 0.0, 0
    for op, a, b, fetch, nbytes, dt in ops:
        now += dt
        if op == "start" and a != b:
            model.start(f"f{n}", FlowKind.FETCH if fetch else FlowKind.TRANSFER, a, b, nbytes, now)
            n += 1
        elif op == "land":
            model.land(max(now, model.next_landing() or now))
            now = model.now
        elif op == "cancel" and model.flows:
            model.cancel(next(iter(model.flows)), now)
        for node in NODES:
            assert model.host_share(node, 200e9) == _host_share_by_scan(model, node, 200e9)
    assert set(model._host_users) == {r for f in model.flows.values() for r in f.resources if r[1] is Resource.HOST_MEMORY}
