"""The branch table survives a router restart (issue 17, item 8): `router.branch_snapshot`.

- Round trip (hypothesis): any table reached by requests, placements, confirmations, evictions, phase
  switches and branch ends, written and read back into a fresh table, has the same rows and the same counts
  on every node (and the table's invariants, checked through its public reads, hold).
- Bad files never crash the reader: every fault is a `SnapshotError` naming the file; writes are atomic.
- Live (in-process node agents and routers on 127.0.0.1, every wait bounded): a router is replaced by a new
  one reading the same snapshot file; the nodes hold the same branch counts again (the new router pushed the
  restored ones after the nodes cleared the old router's), the next request of a branch continues its
  version, and a finish after the restart finds its branch.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.router.branch_snapshot import (
    BranchSnapshots,
    SnapshotError,
    decode,
    encode,
    read,
    restore,
    take,
    write,
)
from evolving_infra.router.branches import BranchTable
from evolving_infra.router.http import start_server
from evolving_infra.router.http.backend import BranchRef
from evolving_infra.router.http.settings import RouterHttpSettings
from evolving_infra.router.service.backend import LiveRouter
from evolving_infra.router.service.client import NodeEndpoint
from evolving_infra.cli.router import shape_from_profile
from tests.router.test_service_live import PROMPT, Cluster, run, until

NODES = {NodeId("p0"): Phase.PREFILL, NodeId("p1"): Phase.PREFILL, NodeId("d0"): Phase.DECODE, NodeId("d1"): Phase.DECODE}
PAGES = st.lists(st.integers(0, 40), max_size=12).map(lambda xs: [x * 0x9E3779B97F4A7C15 % (1 << 64) for x in xs])
BRANCHES = st.sampled_from(["a", "b", "c", "t:d"])
OPS = st.one_of(
    st.tuples(st.just("request"), BRANCHES, PAGES),
    st.tuples(st.just("place"), BRANCHES, st.sampled_from(sorted(NODES)), st.booleans()),
    st.tuples(st.just("confirm"), BRANCHES, st.sampled_from(sorted(NODES)), st.integers(1, 3)),
    st.tuples(st.just("end"), BRANCHES),
    st.tuples(st.just("evict"), st.sampled_from(sorted(NODES)), PAGES),
    st.tuples(st.just("switch"), st.sampled_from(sorted(NODES)), st.sampled_from(list(Phase))),
)


def apply(table: BranchTable, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "request":
        table.request(BranchId(op[1]), op[2])
    elif kind == "place" and op[1] in table:
        table.place(BranchId(op[1]), op[2], held=op[3])
    elif kind == "confirm":
        table.confirm_held(BranchId(op[1]), op[2], op[3])
    elif kind == "end":
        table.end(BranchId(op[1]))
    elif kind == "evict":
        table.evicted(op[1], op[2])
    elif kind == "switch":
        table.set_phase(op[1], op[2])


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_a_table_read_back_from_its_snapshot_is_the_same_table(ops: list[tuple[Any, ...]]) -> None:
    table = BranchTable(dict(NODES))
    for op in ops:
        apply(table, op)
    back = BranchTable({n: Phase.PREFILL for n in NODES})
    assert restore(back, decode(encode(take(table)))) == len(table)
    assert back.phases() == table.phases()
    assert set(back.branches()) == set(table.branches())
    for branch in table.branches():
        assert back.state(branch) == table.state(branch)
    for node in NODES:
        assert back.counts_for(node) == table.counts_for(node)
        # invariant 2 through the public reads: each count is the number of branches counting the page
        expect: dict[int, int] = {}
        for branch in back.branches():
            for page in back.state(branch).counted.get(node, ()):
                expect[page] = expect.get(page, 0) + 1
        assert back.counts_for(node) == expect
    # a restored table goes on as the original would
    for op in ops[:10]:
        apply(table, op)
        apply(back, op)
    for node in NODES:
        assert back.counts_for(node) == table.counts_for(node)


def test_nodes_not_in_the_cluster_any_more_are_dropped_on_restore() -> None:
    table = BranchTable(dict(NODES))
    table.request(BranchId("a"), [1, 2, 3])
    table.place(BranchId("a"), NodeId("p0"))
    table.place(BranchId("a"), NodeId("d0"))
    back = BranchTable({NodeId("p0"): Phase.PREFILL})
    restore(back, decode(encode(take(table))), nodes=[NodeId("p0")])
    state = back.state(BranchId("a"))
    assert set(state.counted) == {"p0"} and state.targets == {Phase.PREFILL: "p0"}
    assert back.counts_for(NodeId("d0")) == {}
    with pytest.raises(ValueError, match="already"):
        restore(back, decode(encode(take(table))), nodes=[NodeId("p0")])


@pytest.mark.parametrize(
    ("data", "fault"),
    [
        (b"", "Expecting value"),
        (b"\xff\xfe", "snapshot"),
        (b"[]", "format"),
        (b'{"format": "evolving-branch-snapshot/1", "phases": {}, "branches": [{"id": "a", "version": 0}]}', "version"),
        (b'{"format": "evolving-branch-snapshot/1", "phases": {}, "branches": [{"id": "a", "version": 1, "path": "AAA"}]}', "path"),
        (b'{"format": "evolving-branch-snapshot/1", "phases": {"n": "sideways"}, "branches": []}', "sideways"),
    ],
)
def test_a_bad_snapshot_file_is_an_error_naming_the_file(tmp_path: Path, data: bytes, fault: str) -> None:
    path = tmp_path / "branches.json"
    path.write_bytes(data)
    with pytest.raises(SnapshotError, match=fault) as error:
        read(path)
    assert str(path) in str(error.value)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | st.from_regex(r'\{"format": "evolving-branch-snapshot/1".{0,120}\}', fullmatch=True).map(str.encode))
def test_the_reader_never_crashes(data: bytes) -> None:
    try:
        decode(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        pass


def test_missing_file_is_an_empty_start_and_writes_are_atomic(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "branches.json"
    assert read(path) is None
    table = BranchTable(dict(NODES))
    table.request(BranchId("a"), [7, 8])
    write(path, encode(take(table)))
    write(path, encode(take(table)))
    assert [p.name for p in path.parent.iterdir()] == ["branches.json"]  # no temporary file left behind
    assert read(path) is not None and len(read(path).branches) == 1  # type: ignore[union-attr]


def test_the_keeper_writes_only_changes_and_restores_at_start(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int, int]:
        path = tmp_path / "branches.json"
        table = BranchTable(dict(NODES))
        keeper = BranchSnapshots(table, path, 0.05)
        assert keeper.load(NODES) == 0
        keeper.start()
        table.request(BranchId("a"), [1, 2])
        table.place(BranchId("a"), NodeId("p0"))
        await until(lambda: keeper.writes == 1, "the first write")
        await asyncio.sleep(0.2)
        unchanged = keeper.writes
        table.end(BranchId("a"))
        table.request(BranchId("b"), [3])
        await keeper.close()
        other = BranchSnapshots(BranchTable(dict(NODES)), path, 0.05)
        return unchanged, keeper.writes, other.load(NODES)

    assert asyncio.run(asyncio.wait_for(scenario(), 20)) == (1, 2, 1)


# --- live: a router replaced by a new one -------------------------------------------------------------------
async def restart_scenario(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with Cluster({"p0": NodeMode.PREFILL, "d0": NodeMode.DECODE}, speed_up=20.0, eviction="branch-count",
                       branch_snapshot_file=path, branch_snapshot_interval_s=0.05) as c:  # fmt: skip
        agents = c.agents
        for branch in ("x", "y", "z"):
            status, _ = await c.complete(f"{branch} {PROMPT}", branch, max_tokens=4)
            assert status == 200
        table = c.router.core.branches
        out["before"] = {b: table.state(b) for b in table.branches()}
        pages = {n: {p: c for p, c in table.counts_for(NodeId(n)).items()} for n in agents}
        await until(lambda: all(agents[n].engine.pool.count(p) == k for n in agents for p, k in pages[n].items()),
                    "the nodes to hold the first router's counts")  # fmt: skip
        out["counted_pages"] = {n: len(pages[n]) for n in agents}
        await c.server.stop()
        await c.router.close()  # the first router goes away (its last snapshot is written)

        second = LiveRouter(c.settings, shape_from_profile(load_profile(c.settings.profile)),
                            [NodeEndpoint(NodeId(n), a.address) for n, a in agents.items()])  # fmt: skip
        c.router = second
        await second.start()
        assert await second.wait_ready(20)
        out["restored"] = second.metrics.branches_restored._value.get()
        table2 = second.core.branches
        out["after"] = {b: table2.state(b) for b in table2.branches()}
        # the nodes cleared the first router's counts at the new subscription and hold the restored ones
        await until(lambda: all(agents[n].engine.pool.count(p) == k for n in agents for p, k in pages[n].items()),
                    "the nodes to hold the restored counts")  # fmt: skip
        # the branch continues through the new router's HTTP API: its next prompt extends the last one
        c.server = await start_server(RouterHttpSettings(port=0, request_timeout_s=20.0), second)
        more = " ".join(f"more{i}" for i in range(300))
        status, _ = await c.complete(f"x {PROMPT} {more}", "x", max_tokens=4)
        x = BranchRef(BranchId("x")).scoped_id()
        out["next"] = (status, table2.state(x).version, len(table2.state(x).path) > len(out["before"][x].path))
        out["finish"] = await c.finish("y")
        out["finish_unknown"] = await c.finish("never-seen")
    return out


def test_a_new_router_continues_the_branches_of_the_one_it_replaced(tmp_path: Path) -> None:
    out = run(lambda: restart_scenario(tmp_path / "branches.json"))
    assert len(out["before"]) == 3 and out["restored"] == 3
    assert out["after"] == out["before"]
    assert all(out["counted_pages"].values())
    assert out["next"] == (200, 1, True)
    assert out["finish"][0] == 200 and out["finish"][1]["status"] == "finished"
    assert out["finish_unknown"][1]["status"] == "not_found"
