"""The node report's prefill queue and the SwitchPhase mode on the wire: round trips through the serialized
bytes, the backward-compatible defaults (an older peer that sets none of the new fields) and specific errors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.types import Phase, SwitchMode
from evolving_infra.node_agent.engine import RunningChunk
from evolving_infra.proto import convert
from evolving_infra.proto.v1 import node_agent_pb2 as pb

u32 = st.integers(0, 2**32 - 1)
ids = st.text(min_size=1, max_size=12)
chunks = st.builds(RunningChunk, ids, u32, u32)


def wire(message):  # type: ignore[no-untyped-def]
    return type(message).FromString(message.SerializeToString())


@given(st.lists(chunks, max_size=6), st.lists(ids, max_size=10))
def test_prefill_queue_round_trips(running: list[RunningChunk], queued: list[str]) -> None:
    state = wire(convert.set_prefill_queue(pb.NodeState(node="n"), running, queued))
    got = convert.prefill_queue_from_proto(state)
    assert got is not None
    assert got.running == tuple((r.request, r.remaining_tokens, r.context_tokens) for r in running)
    assert got.queued == tuple(queued)


def test_an_empty_reported_queue_differs_from_no_report() -> None:
    assert convert.prefill_queue_from_proto(wire(pb.NodeState(node="old-agent"))) is None
    empty = convert.prefill_queue_from_proto(wire(convert.set_prefill_queue(pb.NodeState(node="n"), (), ())))
    assert empty == convert.ReportedPrefills((), ())


def test_a_running_prefill_without_id_is_refused_naming_the_field() -> None:
    state = pb.NodeState(running_prefills=[pb.RunningPrefill(remaining_tokens=3)], prefill_queue_reported=True)
    with pytest.raises(ValueError, match=r"running_prefills\[0\]\.request_id"):
        convert.prefill_queue_from_proto(state)


@given(st.sampled_from(Phase), st.integers(0, 2**64 - 1), st.sampled_from(SwitchMode),
       st.floats(0, 1e6, allow_nan=False))  # fmt: skip
def test_switch_requests_round_trip(target: Phase, generation: int, mode: SwitchMode, downtime: float) -> None:
    how = convert.SwitchHow(mode, downtime if mode is SwitchMode.RELAUNCH else 0.0)
    message = wire(convert.switch_request_to_proto(target, generation, how))
    assert convert.phase_from_proto(message.target) is target and message.generation == generation
    assert convert.switch_how_from_proto(message) == how


def test_an_older_caller_switches_in_place() -> None:
    assert convert.switch_how_from_proto(pb.SwitchPhaseRequest(target=pb.PHASE_DECODE, generation=1)) == convert.SwitchHow()


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (pb.SwitchPhaseRequest(mode=pb.SWITCH_MODE_IN_PLACE, relaunch_seconds=5.0), "relaunch_seconds.*not relaunch"),
        (pb.SwitchPhaseRequest(mode=pb.SWITCH_MODE_RELAUNCH, relaunch_seconds=-1.0), "relaunch_seconds.*>= 0"),
        (pb.SwitchPhaseRequest(mode=pb.SWITCH_MODE_RELAUNCH, relaunch_seconds=math.inf), "relaunch_seconds.*finite"),
        (pb.SwitchPhaseRequest(mode=pb.SWITCH_MODE_RELAUNCH, relaunch_seconds=math.nan), "relaunch_seconds"),
        (pb.SwitchPhaseRequest(mode=9), "SwitchPhaseRequest.mode"),
    ],
)
def test_bad_switch_requests_name_the_field(message: pb.SwitchPhaseRequest, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        convert.switch_how_from_proto(message)
