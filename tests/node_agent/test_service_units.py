"""The node agent service's pure parts: settings sources and errors, the switch-generation rules, the
arena sync invariant, event fan-out (snapshot, gap-free sequences, dropping a slow subscriber), KV
snapshot chains, and the CLI flags generated from the settings."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.cli.node_agent import CUSTOM_FLAGS, add_settings_flags, flag_name, flags_from_args
from evolving_infra.core.kv_events import KvRemoved, KvStored
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId, NodeMode, Phase, Tier
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.node_agent.service.events import EventHub, SubscriberDropped
from evolving_infra.node_agent.service.kvsync import ArenaSync, Exposure
from evolving_infra.node_agent.service.messages import resident_chains
from evolving_infra.node_agent.service.runner import NodeClock
from evolving_infra.node_agent.service.settings import (
    EMULATED_L2_PAGES_CAP,
    NodeAgentSettings,
    SettingsError,
    load_settings,
    resolve_memory,
)
from evolving_infra.node_agent.service.switch_generations import Generation, SwitchAction, decide_switch
from evolving_infra.node_agent.transfer import KvArena, TransportKind, emulated_checksum
from evolving_infra.router.directory import KvDirectory


# --- settings ---------------------------------------------------------------------------------------
def test_flags_beat_environment_beat_file_beat_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "node.yaml"
    file.write_text("node: from-file\nspeed_up: 2\nseed: 7\ntransfer:\n  chunk_bytes: 65536\npeers:\n  x: 127.0.0.1:1\n")
    monkeypatch.setenv("EVOLVING_NODE_SPEED_UP", "3")
    monkeypatch.setenv("EVOLVING_NODE_SEED", "8")
    monkeypatch.setenv("EVOLVING_NODE_TRANSFER__KIND", "mooncake-tcp")
    s = load_settings(file, {"seed": 9, "mode": "prefill"})
    assert (s.node, s.speed_up, s.seed, s.mode) == ("from-file", 3.0, 9, NodeMode.PREFILL)
    assert (s.transfer.kind, s.transfer.chunk_bytes, s.peers) == (TransportKind.MOONCAKE_TCP, 65536, {"x": "127.0.0.1:1"})
    assert load_settings().node == "node-0" and load_settings().transfer.kind is TransportKind.MOONCAKE_TCP


@pytest.mark.parametrize(
    ("flags", "field", "words"),
    [
        ({"host": "0.0.0.0"}, "host", "wildcard"),
        ({"speed_up": 0}, "speed_up", "greater than 0"),
        ({"node": "bad id!"}, "node", "letters, digits"),
        ({"peers": {"x": "nowhere"}}, "peers", "host:port"),
        ({"grpc_port": 70000}, "grpc_port", "65535"),
        ({"bogus": 1}, "bogus", "unknown setting"),
        ({"transfer": {"kind": "carrier-pigeon"}}, "transfer.kind", "mooncake-tcp"),
    ],
)
def test_bad_settings_name_the_field(flags: dict, field: str, words: str) -> None:
    with pytest.raises(SettingsError) as error:
        load_settings(None, flags)
    fields = [f for f, _ in error.value.problems]
    assert field in fields, error.value
    assert words in str(error.value)


def test_wildcard_host_needs_the_explicit_opt_in() -> None:
    assert load_settings(None, {"host": "0.0.0.0", "allow_wildcard_host": True}).host == "0.0.0.0"


def test_a_settings_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text("- a\n- b\n")
    with pytest.raises(SettingsError, match="mapping"):
        load_settings(file)
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml")


def test_emulated_memory_is_capped_and_keeps_the_profile_ratio() -> None:
    profile = load_profile("deepseek-v4-flash-4xh200-tp4")
    memory = resolve_memory(NodeAgentSettings(), profile)
    assert memory.l2_pages == EMULATED_L2_PAGES_CAP < profile.l2_pages
    assert memory.l1_pages == round(EMULATED_L2_PAGES_CAP * profile.l1_tokens / profile.l2_tokens)
    assert memory.profile.l2_pages == memory.l2_pages and memory.profile.l1_pages == memory.l1_pages
    assert memory.arena_slots == memory.l2_pages + memory.l2_pages // 4
    assert memory.profile.prefill == profile.prefill  # iteration times are the profile's
    small = resolve_memory(NodeAgentSettings(l2_pages=100, l1_pages=30, arena_slack_pages=0), profile)
    assert (small.l1_pages, small.l2_pages, small.arena_slots) == (30, 100, 100)


def test_every_setting_has_a_flag_generated_from_the_model() -> None:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    options = {o for action in parser._actions for o in action.option_strings}
    for name in NodeAgentSettings.model_fields:
        assert (CUSTOM_FLAGS.get(name) or flag_name(name)) in options, name
    args = parser.parse_args(["--speed-up", "4", "--no-metrics-enabled", "--mode", "decode", "--transport", "grpc", "--peer", "b=127.0.0.1:9"])
    flags = flags_from_args(args)
    assert flags == {"speed_up": 4.0, "metrics_enabled": False, "mode": "decode", "transfer": {"kind": "grpc"}, "peers": {"b": "127.0.0.1:9"}}
    settings = load_settings(None, flags)
    assert (settings.mode, settings.metrics_enabled, settings.peers) == (NodeMode.DECODE, False, {"b": "127.0.0.1:9"})


# --- switch generations -----------------------------------------------------------------------------
MODES = st.sampled_from(list(NodeMode))
PHASES = st.sampled_from(list(Phase))


@given(
    value=st.integers(0, 5), used=st.booleans(), mode=MODES, target=PHASES, generation=st.integers(0, 6),
    draining=st.none() | st.tuples(PHASES, st.integers(0, 6)),
)
def test_switch_decisions_keep_generations_monotonic_and_meaning_one_phase(
    value: int, used: bool, mode: NodeMode, target: Phase, generation: int, draining: tuple[Phase, int] | None
) -> None:
    action = decide_switch(Generation(value, used), mode, draining, target, generation).action
    if generation < value:
        assert action is SwitchAction.STALE
    elif draining is not None:
        assert action is (SwitchAction.JOIN if draining == (target, generation) else SwitchAction.BUSY)
    elif generation == value and used:
        assert action is (SwitchAction.ALREADY if mode is NodeMode.of(target) else SwitchAction.CONFLICT)
    else:
        assert action is (SwitchAction.ADOPT if mode is NodeMode.of(target) else SwitchAction.SWITCH)
    # what changes the node's generation (SWITCH, ADOPT) never lowers it
    if action in (SwitchAction.SWITCH, SwitchAction.ADOPT):
        assert generation >= value


# --- arena sync ---------------------------------------------------------------------------------------
POOL = chain_hashes(f"p{i}".encode() for i in range(12))
OPS = st.lists(
    st.tuples(st.sampled_from(["store", "remove", "stage", "unstage", "pin", "unpin"]), st.sampled_from(POOL)),
    max_size=40,
)


@given(ops=OPS)
def test_arena_holds_exactly_the_wanted_pages_once_readers_let_go(ops: list[tuple[str, PageHash]]) -> None:
    engine_l2: set[PageHash] = set()
    arena = KvArena(len(POOL), 256)
    sync = ArenaSync(arena, engine_l2.__contains__)
    staged: dict[PageHash, int] = {}
    readers: list = []
    for op, page in ops:
        if op == "store":
            engine_l2.add(page)
            sync.apply_events([KvStored(NodeId("n"), Tier.HOST, None, (page,), 0.0)])
        elif op == "remove":
            engine_l2.discard(page)
            sync.apply_events([KvRemoved(NodeId("n"), Tier.HOST, (page,), 0.0)])
        elif op == "stage":
            staged[page] = staged.get(page, 0) + 1
            sync.stage([page])
        elif op == "unstage" and staged.get(page):
            staged[page] -= 1
            sync.unstage([page])
        elif op == "pin" and page in arena:
            reader = arena.pinned([page])
            reader.__enter__()
            readers.append(reader)
        elif op == "unpin" and readers:
            readers.pop().__exit__(None, None, None)
        arena.check_invariants()
    while readers:
        readers.pop().__exit__(None, None, None)
    sync.retry()
    kept = engine_l2 | {p for p, n in staged.items() if n > 0}
    assert engine_l2 <= set(arena.pages()) <= kept  # staged pages are pulled by the decode path, never made up
    assert all(arena.locate(p).checksum == emulated_checksum(p, 256) for p in engine_l2)
    assert not sync.pending


EXPOSE_OPS = st.lists(
    st.tuples(st.sampled_from(["store", "remove", "gpu", "ungpu", "expose", "unexpose", "drop", "stale", "pin",
                               "unpin"]),
              st.lists(st.sampled_from(POOL), min_size=1, max_size=4)),
    max_size=40,
)  # fmt: skip


@given(ops=EXPOSE_OPS)
def test_exposed_prompts_stay_readable_until_unexposed_and_nothing_else_lingers(
    ops: list[tuple[str, list[PageHash]]],
) -> None:
    """A finished prefill's prompt (`expose`): its pages only the engine's L1 holds are written into the arena and
    stay there until `unexpose` (or `drop_exposed`); afterwards the arena again holds exactly the L2 pages (once readers let
    go)."""
    l2: set[PageHash] = set()
    l1: set[PageHash] = set()
    arena = KvArena(len(POOL), 256)
    sync = ArenaSync(arena, l2.__contains__, gpu_holds=l1.__contains__)
    exposures: list[Exposure] = []
    stale: list[Exposure] = []
    readers: list = []
    for op, pages in ops:
        if op == "store":
            l2.update(pages)
            sync.apply_events([KvStored(NodeId("n"), Tier.HOST, None, tuple(pages), 0.0)])
        elif op == "remove":
            l2.difference_update(pages)
            sync.apply_events([KvRemoved(NodeId("n"), Tier.HOST, tuple(pages), 0.0)])
        elif op == "gpu":
            l1.update(pages)
        elif op == "ungpu":
            l1.difference_update(pages)
        elif op == "expose":
            exposed_now = {p for e in exposures for p in e.pages}
            # L1-only pages, or pages exposed already: the others follow L2
            readable = {p for p in pages if (p not in arena and p in l1) or p in exposed_now}
            exposed = sync.expose(pages)
            assert set(exposed.pages) == readable and all(p in arena for p in exposed.pages)
            exposures.append(exposed)
        elif op == "unexpose" and exposures:
            sync.unexpose(exposures.pop(0))
        elif op == "drop":  # the node dropped its KV: every exposure ends; their late `unexpose` changes nothing
            stale.extend(exposures)
            exposures.clear()
            sync.drop_exposed()
        elif op == "stale" and stale:
            sync.unexpose(stale.pop())
        elif op == "pin" and all(p in arena for p in pages):
            reader = arena.pinned(list(dict.fromkeys(pages)))
            reader.__enter__()
            readers.append(reader)
        elif op == "unpin" and readers:
            readers.pop().__exit__(None, None, None)
        arena.check_invariants()
        held = {p for e in exposures for p in e.pages}
        assert held <= set(arena.pages())  # an exposed page is never released while exposed
    while readers:
        readers.pop().__exit__(None, None, None)
    while exposures:
        sync.unexpose(exposures.pop())
    sync.retry()
    assert set(arena.pages()) == l2 and not sync.pending


def test_a_full_arena_defers_writes_until_room_appears() -> None:
    arena = KvArena(2, 128)
    held: set[PageHash] = set(POOL[:3])
    sync = ArenaSync(arena, held.__contains__)
    sync.reconcile(POOL[:3])
    assert len(arena) == 2 and len(sync.pending) == 1
    held.discard(POOL[0])
    sync.reconcile([POOL[0]])
    assert set(arena.pages()) == set(POOL[1:3]) and not sync.pending


def test_staging_keeps_pages_but_never_makes_them_up() -> None:
    arena = KvArena(4, 128)
    held: set[PageHash] = {POOL[0]}
    sync = ArenaSync(arena, held.__contains__)
    sync.stage(POOL[:2])
    sync.reconcile(POOL[:2])
    assert set(arena.pages()) == {POOL[0]}  # POOL[1] is the decode path's to pull
    held.clear()
    sync.reconcile([POOL[0]])
    assert POOL[0] in arena  # staged: kept although the engine let it go
    sync.unstage(POOL[:2])
    assert len(arena) == 0


# --- events -------------------------------------------------------------------------------------------
def test_subscribers_get_a_snapshot_then_gap_free_events_and_a_slow_one_is_dropped() -> None:
    async def main() -> None:
        hub = EventHub(16, lambda: [{"kv": None}, {"kv": None}])
        fast, slow = hub.subscribe("fast"), hub.subscribe("slow")
        seen: list[int] = []
        for i in range(30):
            hub.publish({})
            while not fast.queue.empty():
                seen.append(fast.queue.get_nowait().sequence)  # type: ignore[union-attr]
        assert seen == list(range(1, 33))
        assert len(hub) == 1 and hub.dropped == 1
        with pytest.raises(SubscriberDropped, match="fell more than 16"):
            async for _ in slow:
                pass
        hub.close()
        assert [e async for e in fast] == []

    asyncio.run(asyncio.wait_for(main(), 10))


@given(st.integers(1, 5), st.integers(0, 6), st.data())
def test_snapshot_chains_rebuild_the_resident_set_with_parents(branches: int, length: int, data: st.DataObject) -> None:
    trunk = chain_hashes(f"t{i}".encode() for i in range(length))
    parent_of: dict[PageHash, PageHash | None] = {p: (trunk[i - 1] if i else None) for i, p in enumerate(trunk)}
    for b in range(branches):
        fork = trunk[-1] if trunk else 0
        for i, page in enumerate(chain_hashes((f"b{b}.{i}".encode() for i in range(3)), fork)):
            parent_of[page] = fork if i == 0 else prev
            prev = page
    resident = data.draw(st.sets(st.sampled_from(sorted(parent_of))))
    events = resident_chains(NodeId("n"), Tier.HOST, resident, {p: parent_of[p] for p in resident}, 1.0)
    directory = KvDirectory()
    directory.apply_all(events)
    assert set(directory.pages_on(NodeId("n"), Tier.HOST)) == resident
    for event in events:
        assert event.parent == parent_of[event.pages[0]]
        assert all(parent_of[b] == a for a, b in zip(event.pages, event.pages[1:]))


def test_node_clock_runs_sped_up_and_never_backwards() -> None:
    t = [100.0]
    clock = NodeClock(4.0, lambda: t[0])
    t[0] = 101.0
    assert clock.now() == 4.0
    clock.advance_to(10.0)
    assert clock.now() == 10.0 and clock.wall_delay(14.0) == 1.0
    t[0] = 100.5
    assert clock.now() == 10.0
    with pytest.raises(ValueError, match="speed_up"):
        NodeClock(0)
