"""Protobuf <-> dataclass conversions at the gRPC edge: round trips for every valid value (through the
wire bytes, not just the message objects) and specific errors for what the wire allows but we do not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.itermodel import IterationRecord, PrefillItem
from evolving_infra.core.kv_events import KvCleared, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId, Tier
from evolving_infra.node_agent.api import convert
from evolving_infra.node_agent.api.limits import MAX_TOKENS
from evolving_infra.node_agent.engine.outputs import SwitchReport, SwitchState
from evolving_infra.node_agent.engine.requests import DecodeRequest, FetchRun, PrefillRequest
from evolving_infra.node_agent.engine.tier import TierGauges
from evolving_infra.node_agent.transfer.base import TransportKind
from evolving_infra.proto.v1 import node_agent_pb2 as pb

pages = st.integers(0, 2**64 - 1).map(PageHash)
page_lists = st.lists(pages, max_size=20).map(tuple)
nodes = st.text(max_size=12).map(NodeId)
times = st.floats(allow_nan=False, allow_infinity=False)
u32 = st.integers(0, 2**32 - 1)
kv_events = st.one_of(
    st.builds(KvStored, nodes, st.sampled_from(Tier), st.none() | pages, page_lists, times),
    st.builds(KvRemoved, nodes, st.sampled_from(Tier), page_lists, times),
    st.builds(KvCleared, nodes, st.none() | st.sampled_from(Tier), times),
)
records = st.builds(
    IterationRecord,
    node=nodes,
    phase=st.sampled_from(Phase),
    start=times,
    duration=times,
    prefill=st.lists(st.builds(PrefillItem, u32, u32, u32), max_size=8).map(tuple),
    decode_batch=u32,
    context_tokens=st.just(0.0),  # not on the wire: the engine's own diagnostic (eq. 2 does not use it)
)


def wire(message):  # type: ignore[no-untyped-def]
    """The message after a trip through its serialized bytes."""
    return type(message).FromString(message.SerializeToString())


@given(st.lists(kv_events, max_size=10))
def test_kv_events_round_trip(events: list) -> None:
    batch = wire(convert.kv_batch_to_proto(events))
    assert convert.kv_batch_from_proto(batch) == tuple(events)


def test_a_root_parent_of_zero_differs_from_no_parent() -> None:
    with_zero = KvStored(NodeId("n"), Tier.HOST, PageHash(0), (PageHash(5),), 1.0)
    without = KvStored(NodeId("n"), Tier.HOST, None, (PageHash(5),), 1.0)
    assert convert.kv_event_from_proto(wire(convert.kv_event_to_proto(with_zero))) == with_zero
    assert convert.kv_event_from_proto(wire(convert.kv_event_to_proto(without))) == without


@given(records)
def test_iteration_records_round_trip(record: IterationRecord) -> None:
    assert convert.iteration_from_proto(wire(convert.iteration_to_proto(record))) == record


@given(st.dictionaries(pages, u32, max_size=50), st.integers(0, 2**64 - 1))
def test_count_updates_round_trip(counts: dict, sequence: int) -> None:
    message = wire(convert.counts_to_proto(counts, sequence))
    assert message.sequence == sequence
    assert convert.counts_from_proto(message) == counts


@given(st.builds(SwitchReport, nodes, st.sampled_from(NodeMode), st.sampled_from(NodeMode), times, times, u32), u32)
def test_switch_reports_round_trip(report: SwitchReport, generation: int) -> None:
    assert convert.switch_report_from_proto(wire(convert.switch_report_to_proto(report, generation))) == (
        report,
        generation,
    )


@given(st.builds(TierGauges, u32, u32, u32, u32, u32))
def test_tier_gauges_round_trip(gauges: TierGauges) -> None:
    assert convert.tier_gauges_from_proto(wire(convert.tier_gauges_to_proto(gauges))) == gauges


ids = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=8)
"""Ids the node accepts (printable ASCII, bounded; `api.limits`)."""


@st.composite
def prefill_requests(draw: st.DrawFn) -> PrefillRequest:
    prompt = draw(st.lists(pages, min_size=0, max_size=12, unique=True))
    fetched = draw(st.lists(st.sampled_from(prompt), unique=True)) if prompt else []
    split = draw(st.integers(0, len(fetched)))
    in_order = sorted(fetched, key=prompt.index)
    runs = tuple(
        run
        for i, part in enumerate((in_order[:split], in_order[split:]))
        for run in FetchRun.runs_of(NodeId(f"peer-{i}"), part, prompt)
    )
    return PrefillRequest(
        request=RequestId(draw(ids)),
        branch=BranchId(draw(ids)),
        prompt_pages=tuple(prompt),
        prompt_tokens=draw(st.integers(1, MAX_TOKENS)),
        output_tokens=draw(st.integers(0, MAX_TOKENS)),
        t_acc=draw(st.floats(min_value=0.01, max_value=16)),
        fetch=runs,
        generated_pages=draw(st.none() | page_lists),
    )


@given(prefill_requests(), st.dictionaries(st.sampled_from(["traceparent", "tracestate"]), st.text(min_size=1)))
def test_prefill_requests_round_trip_with_trace_headers(req: PrefillRequest, trace: dict) -> None:
    message = wire(convert.prefill_request_to_proto(req, trace, {"peer-0": "10.0.0.1:50051"}))
    assert convert.prefill_request_from_proto(message) == req
    assert convert.trace_from_proto(message.trace) == trace
    assert all(run.peer_address == ("10.0.0.1:50051" if run.peer == "peer-0" else "") for run in message.fetch)


def test_empty_generated_pages_differ_from_absent_ones() -> None:
    base = dict(request=RequestId("r"), branch=BranchId("b"), prompt_pages=(), prompt_tokens=3, output_tokens=2)
    for generated in (None, ()):
        req = DecodeRequest(**{**base, "prompt_pages": (PageHash(1),)}, generated_pages=generated)  # type: ignore[arg-type]
        fetch = (FetchRun.of(NodeId("p"), (PageHash(1),), (PageHash(1),)),)
        assert convert.decode_request_from_proto(wire(convert.decode_request_to_proto(req, fetch))) == (req, fetch)


@pytest.mark.parametrize(
    ("to_proto", "from_proto", "members"),
    [
        (convert.phase_to_proto, convert.phase_from_proto, list(Phase)),
        (convert.mode_to_proto, convert.mode_from_proto, list(NodeMode)),
        (convert.tier_to_proto, convert.tier_from_proto, list(Tier)),
        (convert.switch_state_to_proto, convert.switch_state_from_proto, list(SwitchState)),
        (convert.transport_kind_to_proto, convert.transport_kind_from_proto, list(TransportKind)),
    ],
)
def test_enums_round_trip_and_unspecified_is_refused(to_proto, from_proto, members):  # type: ignore[no-untyped-def]
    assert [from_proto(to_proto(m)) for m in members] == members
    assert len({to_proto(m) for m in members}) == len(members)
    with pytest.raises(ValueError, match="value 0 is not allowed here"):
        from_proto(0)


def test_unspecified_tier_in_a_stored_event_names_the_field() -> None:
    message = pb.KvEvent(stored=pb.KvStored(node="n", pages=[1]))
    with pytest.raises(ValueError, match=r"KvStored\.tier.*allowed: TIER_GPU, TIER_HOST"):
        convert.kv_event_from_proto(message)


def test_an_empty_kv_event_is_refused() -> None:
    with pytest.raises(ValueError, match="none of stored, removed, cleared"):
        convert.kv_event_from_proto(pb.KvEvent())


def test_count_arrays_of_unequal_length_are_refused() -> None:
    with pytest.raises(ValueError, match="2 pages but 1 counts"):
        convert.counts_from_proto(pb.CountUpdate(sequence=7, pages=[1, 2], counts=[3]))


def test_invalid_requests_fail_with_the_engines_message() -> None:
    message = pb.SubmitPrefillRequest(request_id="r1", branch_id="b", prompt_tokens=64, t_acc=0.0)
    with pytest.raises(ValueError, match="t_acc: 0.0 must be a finite number"):
        convert.prefill_request_from_proto(message)
