"""The loader keeps one object per distinct `new`, `output_tokens` and `delay_s` value of a trace; each request still
answers exactly the value written (the same type, and the sign of a zero pause), whole or loaded agent by agent."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.traces.loader import trace_from_records
from tests.traces.agent_blocks import agent_blocks, growing

DELAYS = st.one_of(st.none(), st.sampled_from([0, 0.0, -0.0, 1, 1.0, 2.5, 2.5000000000000004]),
                   st.floats(0, 1e6, allow_nan=False, allow_infinity=False), st.integers(0, 10**6))  # fmt: skip
TOKENS = st.one_of(st.integers(1, 300), st.integers(1, 10**12))
REQUEST = st.tuples(st.integers(0, 2), DELAYS, st.integers(0, 5000), TOKENS)


def records_of(requests: list[tuple[int, Any, int, int]]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [{"kind": "header", "version": 1}]
    records += [{"kind": "agent", "agent": f"a{i}", "workload": "w", "start_s": 0} for i in range(3)]
    for k, (agent, delay, new, output) in enumerate(requests):
        rec: dict[str, Any] = {"kind": "request", "id": f"r{k}", "agent": f"a{agent}", "branch": f"b{agent}.{k}",
                               "input": {"new": new + 1}, "output_tokens": output}  # fmt: skip
        if delay is not None:
            rec["delay_s"] = delay
        records.append(rec)
    return records


def written(value: Any) -> str:
    return repr(type(value)) + repr(value)


@settings(max_examples=150)
@given(requests=st.lists(REQUEST, max_size=30))
def test_requests_answer_the_values_written(requests: list[tuple[int, Any, int, int]]) -> None:
    records = records_of(requests)
    head, blocks = agent_blocks(records)
    stream = growing(head, blocks)
    stream.load_all()
    whole = trace_from_records(records)
    by_id = {r["id"]: r for r in records if r["kind"] == "request"}
    for trace in (whole, stream):
        for req in trace.requests:
            rec = by_id[req.id]
            delay = rec.get("delay_s", 0.0)
            assert written(req.delay_s) == written(float(delay))
            assert written(req.new) == written(rec["input"]["new"])
            assert written(req.output_tokens) == written(rec["output_tokens"])
        shared: dict[tuple[str, str], object] = {}
        for req in trace.requests:
            for name in ("new", "output_tokens", "delay_s"):
                value = getattr(req, name)
                if written(value) != written(-0.0):
                    assert shared.setdefault((name, written(value)), value) is value, "one object per value"
