"""Properties of the fleet binding (evolving_infra/fleet/binding.py, invariants I1-I5)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.fleet.binding import (
    Binder,
    BindingError,
    BindReason,
    NoEligiblePartition,
    Partition,
    Requirements,
)

REGIONS = ("eu", "us", "ap")
HARDWARE = ("gb300", "h200")


@st.composite
def partition_sets(draw: st.DrawFn, min_size: int = 1, max_size: int = 8) -> list[Partition]:
    n = draw(st.integers(min_size, max_size))
    return [
        Partition(
            f"p{i}",
            {"region": draw(st.sampled_from(REGIONS)), "hardware": draw(st.sampled_from(HARDWARE))},
            float(draw(st.integers(1, 8))),
        )
        for i in range(n)
    ]


requirements_st = st.one_of(
    st.just(Requirements()),
    st.builds(lambda r: Requirements({"region": frozenset([r])}), st.sampled_from(REGIONS)),
    st.builds(lambda h: Requirements({"hardware": frozenset([h])}), st.sampled_from(HARDWARE)),
    st.builds(
        lambda r, h: Requirements({"region": frozenset(r), "hardware": frozenset([h])}),
        st.sets(st.sampled_from(REGIONS), min_size=1),
        st.sampled_from(HARDWARE),
    ),
)
users_st = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=120, unique=True)


@given(partition_sets(), users_st, st.data())
def test_stable_across_restarts(partitions: list[Partition], users: list[str], data: st.DataObject) -> None:
    reqs = [data.draw(requirements_st) for _ in users]
    first, second = Binder(partitions), Binder(list(partitions))
    out1, out2 = [], []
    for binder, out in ((first, out1), (second, out2)):
        for user, req in zip(users, reqs):
            try:
                out.append(binder.bind(user, req).partition)
            except NoEligiblePartition:
                out.append(None)
    assert out1 == out2
    # A user's first choice depends only on its key and the eligible partitions, not on arrival order.
    fresh = Binder(partitions)
    for user, req in zip(users, reqs):
        order = fresh.ranking(user, req)
        again = Binder(list(reversed(partitions))).ranking(user, req)
        assert order == again


@given(partition_sets(), users_st, st.data())
def test_constraints_always_respected(partitions: list[Partition], users: list[str], data: st.DataObject) -> None:
    binder = Binder(partitions)
    by_name = {p.name: p for p in partitions}
    for i, user in enumerate(users):
        req = data.draw(requirements_st)
        eligible = [p for p in partitions if req.admits(p)]
        if not eligible:
            with pytest.raises(NoEligiblePartition):
                binder.bind(user, req, branch_id=f"b{i}")
            continue
        got = binder.bind(user, req, branch_id=f"b{i}")
        assert req.admits(by_name[got.partition])
        assert binder.branch_partition(f"b{i}") == got.partition


@given(partition_sets(), users_st, st.sampled_from([1.1, 1.25, 2.0]), st.data())
def test_load_within_bound(partitions: list[Partition], users: list[str], c: float, data: st.DataObject) -> None:
    binder = Binder(partitions, load_factor=c)
    for user in users:
        req = data.draw(requirements_st)
        if not any(req.admits(p) for p in partitions):
            continue
        cap_before = {p.name: binder.cap(p.name, req) for p in partitions if req.admits(p)}
        got = binder.bind(user, req)
        assert binder.loads()[got.partition] <= cap_before[got.partition]  # I3 at bind time
    assert sum(binder.loads().values()) == sum(1 for u in users if binder.partition_of(u) is not None)


@given(partition_sets(), users_st, st.sampled_from([1.1, 1.25, 2.0]))
def test_unconstrained_load_bound_holds_at_the_end(partitions: list[Partition], users: list[str], c: float) -> None:
    binder = Binder(partitions, load_factor=c)
    for user in users:
        binder.bind(user)
    total = sum(p.weight for p in partitions)
    for p in partitions:
        assert binder.loads()[p.name] <= math.ceil(c * len(users) * p.weight / total)


@given(partition_sets(max_size=6), users_st, st.data())
def test_adding_a_partition_moves_users_only_onto_it(
    partitions: list[Partition], users: list[str], data: st.DataObject
) -> None:
    binder = Binder(partitions)
    for user in users:
        req = data.draw(requirements_st)
        if any(req.admits(p) for p in partitions):
            binder.bind(user, req)
    before = {u: binder.partition_of(u) for u in users}
    new = Partition("new", {"region": data.draw(st.sampled_from(REGIONS)), "hardware": "gb300"}, 2.0)
    moves = binder.add_partition(new)
    after = {u: binder.partition_of(u) for u in users}
    moved = {u for u in users if before[u] != after[u]}
    assert moved == {m.user_key for m in moves}
    assert all(after[u] == "new" for u in moved)
    assert all(m.source == before[m.user_key] for m in moves)
    assert binder.loads()["new"] == len(moves)


@given(partition_sets(min_size=2), users_st, st.data())
def test_removing_a_partition_moves_only_its_users(
    partitions: list[Partition], users: list[str], data: st.DataObject
) -> None:
    binder = Binder(partitions)
    for user in users:
        req = data.draw(requirements_st)
        if any(req.admits(p) for p in partitions):
            binder.bind(user, req)
    gone = data.draw(st.sampled_from([p.name for p in partitions]))
    before = {u: binder.partition_of(u) for u in users}
    moves = binder.remove_partition(gone)
    for user in users:
        if before[user] != gone:
            assert binder.partition_of(user) == before[user]
        else:
            assert binder.partition_of(user) != gone
    assert {m.user_key for m in moves if m.branch_id is None} == {u for u in users if before[u] == gone}
    assert gone not in binder.loads()


def test_movement_on_join_is_about_the_new_partitions_share() -> None:
    binder = Binder([Partition(f"p{i}") for i in range(4)])
    users = [f"user-{i}" for i in range(4000)]
    for user in users:
        binder.bind(user)
    moves = binder.add_partition(Partition("p4"))
    # Consistent hashing: about 1/5 of users move (all onto p4), not the ~4/5 a modulo hash would move.
    assert 0.15 <= len(moves) / len(users) <= 0.25
    assert {m.target for m in moves} == {"p4"}


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.integers(0, 30), st.integers(0, 20), st.none()),
        st.tuples(st.just("child"), st.integers(0, 30), st.integers(0, 20), st.integers(0, 20)),
        st.tuples(st.just("release"), st.integers(0, 30), st.none(), st.none()),
        st.tuples(st.just("finish"), st.none(), st.integers(0, 20), st.none()),
        st.tuples(st.just("add"), st.integers(0, 5), st.none(), st.none()),
        st.tuples(st.just("remove"), st.integers(0, 9), st.none(), st.none()),
    ),
    max_size=150,
)


@given(_ops)
def test_an_active_branch_never_moves(ops: list[tuple[str, int | None, int | None, int | None]]) -> None:
    binder = Binder([Partition(f"p{i}", weight=1.0 + i) for i in range(4)])
    pins: dict[str, str] = {}
    added = 0
    for op, a, b, parent in ops:
        if op in ("bind", "child") and binder.partitions:
            branch = f"b{b}"
            parent_id = f"b{parent}" if parent is not None else None
            got = binder.bind(f"u{a}", branch_id=branch, parent_branch_id=parent_id)
            if branch in pins:
                assert got.partition == pins[branch] and got.reason is BindReason.ACTIVE_BRANCH
            elif parent_id in pins:
                assert got.partition == pins[parent_id]
            pins[branch] = got.partition
        elif op == "release":
            binder.release(f"u{a}")
        elif op == "finish":
            assert binder.finish_branch(f"b{b}") == pins.pop(f"b{b}", None)
        elif op == "add":
            added += 1
            binder.add_partition(Partition(f"new{added}", weight=float(a or 1)))
        elif op == "remove":
            names = [p.name for p in binder.partitions]
            if names:
                gone = names[(a or 0) % len(names)]
                lost = {m.branch_id for m in binder.remove_partition(gone) if m.branch_id}
                assert lost == {br for br, p in pins.items() if p == gone}
                pins = {br: p for br, p in pins.items() if p != gone}
        assert binder.active_branches() == pins


def test_requirements_parse_and_errors() -> None:
    req = Requirements.parse("region=eu|us, hardware=gb300")
    assert req.labels == {"region": frozenset({"eu", "us"}), "hardware": frozenset({"gb300"})}
    assert Requirements.parse(req.render()) == req
    assert Requirements.parse("") == Requirements()
    for bad in ("region", "=eu", "region=", "region=eu,region=us"):
        with pytest.raises(BindingError):
            Requirements.parse(bad)
    with pytest.raises(BindingError, match="weight"):
        Partition("p", weight=0)
    with pytest.raises(BindingError, match="twice"):
        Binder([Partition("p"), Partition("p")])
    with pytest.raises(NoEligiblePartition, match="region=mars"):
        Binder([Partition("p", {"region": "eu"})]).bind("u", Requirements.parse("region=mars"))


def test_a_user_whose_requirements_change_is_rebound() -> None:
    binder = Binder([Partition("eu", {"region": "eu"}), Partition("us", {"region": "us"})])
    assert binder.bind("u", Requirements.parse("region=eu")).partition == "eu"
    assert binder.bind("u", Requirements.parse("region=us")).partition == "us"
    assert binder.loads() == {"eu": 0, "us": 1}


@given(partition_sets(min_size=2), users_st, st.data())
def test_new_users_avoid_down_partitions_within_the_bound(
    partitions: list[Partition], users: list[str], data: st.DataObject
) -> None:
    down = data.draw(st.sets(st.sampled_from([p.name for p in partitions]), max_size=len(partitions) - 1))
    binder = Binder(partitions)
    for user in users:
        caps = {p.name: binder.cap(p.name, avoid=down) for p in partitions if p.name not in down}
        got = binder.bind(user, avoid=down)
        assert got.partition not in down  # some partition is up
        assert binder.loads()[got.partition] <= caps[got.partition]
    # A bound user stays put when its partition goes down: it is told to retry, not moved.
    first = users[0]
    home = binder.partition_of(first)
    assert home is not None and binder.bind(first, avoid={home}).partition == home


@given(partition_sets(min_size=2), users_st, st.data())
def test_updating_a_partition_keeps_pins_and_users_that_still_fit(
    partitions: list[Partition], users: list[str], data: st.DataObject
) -> None:
    binder = Binder(partitions)
    reqs = {}
    for i, user in enumerate(users):
        reqs[user] = req = data.draw(requirements_st)
        if any(req.admits(p) for p in partitions):
            binder.bind(user, req, branch_id=f"b{i}")
    target = data.draw(st.sampled_from(partitions))
    changed = Partition(target.name, {"region": data.draw(st.sampled_from(REGIONS)), "hardware": "gb300"}, 3.0)
    pins, before = binder.active_branches(), {u: binder.partition_of(u) for u in users}
    moves = binder.update_partition(changed)
    assert binder.active_branches() == pins
    assert {m.user_key for m in moves} == {u for u in users if before[u] != binder.partition_of(u)}
    assert all(m.source == target.name for m in moves)
    for user in users:
        if before[user] == target.name and binder.partition_of(user) == target.name:
            assert reqs[user].admits(changed)
        elif before[user] == target.name:
            assert not reqs[user].admits(changed)  # moved only because it no longer fits


def test_the_binding_bench_reports_the_bound_and_the_movement() -> None:
    from evolving_infra.gateway.bench import bench_binding

    out = bench_binding(users=4000, partitions=4, load_factor=1.25)
    assert out["max_load_over_share"] <= out["bound"] == 1.25
    assert abs(out["moved_on_join"] - out["ideal_moved_on_join"]) < 0.05 and out["binds_per_s"] > 0


def test_bindings_agree_across_processes() -> None:
    """Another interpreter (another hash seed) binds the same users to the same partitions."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json; from evolving_infra.fleet.binding import Binder, Partition, Requirements\n"
        "b = Binder([Partition(f'p{i}', {'region': 'eu' if i % 2 else 'us'}, 1.0 + i) for i in range(6)])\n"
        "r = Requirements.parse('region=eu')\n"
        "print(json.dumps([b.bind(f'u{i}', r if i % 3 == 0 else Requirements()).partition for i in range(300)]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout)
    here = Binder([Partition(f"p{i}", {"region": "eu" if i % 2 else "us"}, 1.0 + i) for i in range(6)])
    eu = Requirements.parse("region=eu")
    assert other == [here.bind(f"u{i}", eu if i % 3 == 0 else Requirements()).partition for i in range(300)]
