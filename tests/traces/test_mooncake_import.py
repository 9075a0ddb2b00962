"""Mooncake import: conversations rebuilt from prefix chains; both shared traces import and load."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evolving_infra.traces.loader import load_trace, trace_from_records
from evolving_infra.traces.mooncake import (
    MooncakeError,
    MooncakeRow,
    block_seen_share,
    convert_mooncake,
    import_mooncake,
    read_mooncake,
)
from evolving_infra.traces.records import Relation
from evolving_infra.traces.stats import trace_stats

# The shared folder sits beside the repository checkout (as in CI); the variable overrides it.
_REPO = Path(__file__).resolve().parents[2]
MOONCAKE_DIR = Path(
    os.environ.get("EVOLVING_INFRA_MOONCAKE_DIR", str(_REPO.parent / "shared" / "traces" / "mooncake"))
)

# ts ms, input, output, hash_ids. Block 0 is in every row (a shared prefix).
ROWS = [
    (0, 1100, 100, [0, 1, 2]),  # r1: full blocks 0, 1; context 1200
    (1000, 700, 20, [0, 5]),  # r2: a new conversation (shares only block 0)
    (1500, 1600, 50, [0, 1, 3, 4]),  # r3: continues r1 (blocks 0, 1)
    (3500, 1700, 10, [0, 1, 3, 6]),  # r4: continues r3 (blocks 0, 1, 3)
    (4000, 1100, 30, [0, 1, 8]),  # r5: continues r1 again: a fork
]


def rows(data: list[tuple[int, int, int, list[int]]] = ROWS) -> list[MooncakeRow]:
    return [MooncakeRow(i + 1, t, n, o, tuple(ids)) for i, (t, n, o, ids) in enumerate(data)]


def test_conversations_rebuilt_from_prefix_chains() -> None:
    records, report = convert_mooncake(rows(), name="t", source="unit test")
    trace = trace_from_records(records)
    assert [p.tokens for p in trace.prefixes.values()] == [512]
    r1, r2, r3, r4, r5 = trace.requests
    assert (r1.shared, r1.keep, r1.new, r1.after) == ("mooncake:shared", 512, 588, ())
    assert (r2.shared, r2.keep) == ("mooncake:shared", 512) and r2.agent != r1.agent
    assert (r3.base, r3.keep, r3.new, r3.after, r3.delay_s) == ("r1", 1024, 576, ("r1",), 1.5)
    assert (r4.base, r4.keep, r4.delay_s, r4.branch) == ("r3", 1536, 2.0, r3.branch)
    assert (r5.base, r5.keep, r5.delay_s) == ("r1", 1024, 4.0)
    assert r5.branch != r1.branch and r5.relation is Relation.FORK
    assert r3.relation is Relation.REWRITE  # only the shared blocks are kept, not r1's whole context
    assert {r1.agent} == {r.agent for r in (r3, r4, r5)}
    assert trace.agents[r2.agent].start_s == 1.0
    assert (report.agents, report.branches, report.forks, report.linked_rows) == (2, 3, 1, 3)
    assert report.keep_tokens == 512 + 512 + 1024 + 1536 + 1024


def test_extend_to_context_turns_continuations_into_appends() -> None:
    records, report = convert_mooncake(rows(), name="t", source="unit test", extend_to_context=True)
    trace = trace_from_records(records)
    r3 = trace.request("r3")
    assert (r3.keep, r3.relation) == (1200, Relation.APPEND)  # r1's context: 1100 + 100, and r3 has 1600 >= 1200
    r4, r5 = trace.request("r4"), trace.request("r5")
    assert (r4.keep, r4.relation) == (1650, Relation.APPEND)  # r3's context 1600 + 50, and r4 has 1700 >= 1650
    assert r5.keep == 1024  # r5 (1100 tokens) is shorter than r1's context (1200): only the shared blocks
    assert report.extended_rows == 2


def test_no_common_block_means_no_prefix_and_keep_never_exceeds_the_input() -> None:
    data = [(0, 600, 5, [10, 11]), (10, 300, 0, [12]), (20, 1024, 3, [10, 13])]
    records, report = convert_mooncake(rows(data), name="t", source="unit test")
    trace = trace_from_records(records)
    assert not trace.prefixes and report.prefix_blocks == 0
    assert trace.request("r2").output_tokens == 1 and report.clamped_outputs == 1
    r3 = trace.request("r3")
    assert (r3.base, r3.keep, r3.new) == ("r1", 512, 512)


def test_block_seen_share_counts_every_block() -> None:
    assert block_seen_share(rows()) == pytest.approx((0 + 1 + 2 + 3 + 2) / (3 + 2 + 4 + 4 + 3))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
         '{"timestamp": 4, "input_length": 10, "output_length": 1, "hash_ids": [2]}', "sorted"),
        ('{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "expected 2"),
        ('{"timestamp": 5, "input_length": 600, "output_length": -1, "hash_ids": [1, 2]}', "output_length"),
        ('{"timestamp": 5, "input_length": 600', "JSON"),
    ],
)  # fmt: skip
def test_malformed_rows_are_refused_with_their_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(MooncakeError, match=message) as info:
        read_mooncake(path)
    assert info.value.line == line.count("\n") + 1


def _shared(name: str) -> Path:
    path = MOONCAKE_DIR / name
    if not path.exists():
        message = f"{path} is not available (set EVOLVING_INFRA_MOONCAKE_DIR)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI always has shared/ beside the clone: a missing trace is a defect
        pytest.skip(message)
    return path


@pytest.mark.parametrize(
    ("name", "readme_share"), [("synthetic_trace.jsonl", 0.640), ("conversation_trace.jsonl", 0.366)]
)
def test_shared_mooncake_traces_import_and_load(tmp_path: Path, name: str, readme_share: float) -> None:
    source = _shared(name)
    out = tmp_path / "out.jsonl.gz"
    report = import_mooncake(source, out)
    trace = load_trace(out)
    n_rows = sum(1 for line in source.read_text().splitlines() if line.strip())
    assert len(trace.requests) == report.rows == n_rows
    assert report.block_seen_share == pytest.approx(readme_share, abs=5e-4)
    first = json.loads(source.read_text().splitlines()[0])
    assert trace.requests[0].prompt_tokens == first["input_length"]
    stats = trace_stats(trace)
    assert stats.prompt_tokens == report.input_tokens
    # Token-weighted h* with 64-token pages is close to the README's block-weighted share.
    assert abs(stats.ideal_hit_rate - readme_share) < 0.03
