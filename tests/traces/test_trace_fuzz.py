"""Bounded fuzzing of the trace loader: byte-mutated copies of the sample trace, and records built from
random JSON values with the trace's field names, either load or raise `TraceError` naming a line; nothing
else escapes (hypothesis, a few hundred examples)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolving_infra.traces.errors import TraceError
from evolving_infra.traces.loader import load_trace, parse_lines

SAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "traces" / "sample-agents.jsonl").read_bytes()
FIELDS = ["kind", "version", "name", "tokens", "agent", "id", "branch", "parent", "start_s", "prompt_tokens",
          "output_tokens", "prefix", "after", "workload", "x"]  # fmt: skip
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=5),
    max_leaves=12,
)
_records = st.fixed_dictionaries(
    {"kind": st.sampled_from(["header", "prefix", "agent", "request", "branch", "end"]) | _values},
    optional={k: _values for k in FIELDS[1:]},
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(SAMPLE)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["set", "insert", "delete"]))
        if op == "set":
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.sampled_from([b"\xff", b"\n", b"{", b"}", b'"', b"-1", b"1e999", b"null", b"[]"]))
        else:
            del data[pos : pos + draw(st.integers(1, 40))]
    return bytes(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_files_load_or_name_the_line(data: bytes) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".jsonl") as handle:
        handle.write(data)
        handle.flush()
        try:
            load_trace(handle.name)
        except TraceError as error:
            assert error.line >= 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_records | _values, max_size=6))
def test_random_records_load_or_name_the_line(records: list[object]) -> None:
    try:
        parse_lines([json.dumps(r) for r in records])
    except TraceError as error:
        assert error.line >= 1
