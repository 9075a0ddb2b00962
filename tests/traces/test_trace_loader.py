"""The loader refuses every broken rule with its line and rule id, and loads valid files (plain, gzip)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from evolving_infra.traces.errors import Rule, TraceError
from evolving_infra.traces.loader import load_trace, parse_lines
from evolving_infra.traces.records import Relation
from evolving_infra.traces.writer import trace_to_records, write_records

VALID = [
    {"kind": "header", "version": 1, "name": "t"},  # line 1
    {"kind": "prefix", "name": "S", "tokens": 8},  # line 2
    {"kind": "agent", "agent": "a", "workload": "cc", "start_s": 0},  # line 3
    {"kind": "agent", "agent": "b", "workload": "osworld", "start_s": 1.5},  # line 4
    {"kind": "request", "id": "a.r1", "agent": "a", "branch": "a.m", "after": [], "delay_s": 0,
     "input": {"shared": "S", "keep": 8, "new": 4}, "output_tokens": 2},  # line 5: context 14
    {"kind": "request", "id": "a.r2", "agent": "a", "branch": "a.m", "after": ["a.r1"], "delay_s": 1.0,
     "input": {"base": "a.r1", "keep": 14, "new": 3}, "output_tokens": 1},  # line 6
    {"kind": "request", "id": "b.r1", "agent": "b", "branch": "b.m", "input": {"new": 5}, "output_tokens": 3},  # 7
]  # fmt: skip


def lines(*extra: object) -> list[str]:
    out = [json.dumps(r) for r in VALID]
    out.extend(e if isinstance(e, str) else json.dumps(e) for e in extra)
    return out


def req(rid: str = "a.r3", agent: str = "a", branch: str = "a.m", **fields: object) -> dict[str, object]:
    record: dict[str, object] = {"kind": "request", "id": rid, "agent": agent, "branch": branch,
                                 "input": {"base": "a.r2", "keep": 18, "new": 1}, "output_tokens": 1}  # fmt: skip
    record.update(fields)
    return record


# (rule, extra lines appended after VALID; the error is on the last line unless `line` says otherwise)
BROKEN: list[tuple[Rule, list[object]]] = [
    (Rule.INVALID_JSON, ['{"kind": "agent", "agent": "c",']),
    (Rule.NOT_OBJECT, ["[1, 2, 3]"]),
    (Rule.MISSING_KIND, [{"agent": "c", "workload": "cc", "start_s": 0}]),
    (Rule.UNKNOWN_KIND, [{"kind": "tool_call", "id": "x"}]),
    (Rule.HEADER_NOT_FIRST, [{"kind": "header", "version": 1}]),
    (Rule.MISSING_FIELD, [{"kind": "agent", "agent": "c", "start_s": 0}]),
    (Rule.MISSING_FIELD, [req(input={"base": "a.r2", "new": 1})]),  # keep is required with a base
    (Rule.MISSING_FIELD, [req(output_tokens=None)]),
    (Rule.WRONG_TYPE, [req(after="a.r2")]),
    (Rule.WRONG_TYPE, [req(agent=7)]),
    (Rule.WRONG_TYPE, [{"kind": "agent", "agent": "", "workload": "cc", "start_s": 0}]),
    (Rule.WRONG_TYPE, [req(input=[1, 2])]),
    (Rule.NOT_INTEGER, [req(output_tokens=2.0)]),
    (Rule.NOT_INTEGER, [req(input={"base": "a.r2", "keep": True, "new": 1})]),
    (Rule.NOT_INTEGER, [{"kind": "prefix", "name": "T", "tokens": "10"}]),
    (Rule.NOT_NUMBER, [req(delay_s="1")]),
    (Rule.NOT_NUMBER, ['{"kind": "agent", "agent": "c", "workload": "cc", "start_s": NaN}']),
    (Rule.NOT_NUMBER, [req(delay_s=True)]),
    (Rule.DUPLICATE_PREFIX, [{"kind": "prefix", "name": "S", "tokens": 3}]),
    (Rule.DUPLICATE_AGENT, [{"kind": "agent", "agent": "a", "workload": "cc", "start_s": 0}]),
    (Rule.DUPLICATE_REQUEST, [req(rid="a.r1")]),
    (Rule.NEGATIVE_TOKENS, [{"kind": "prefix", "name": "T", "tokens": -1}]),
    (Rule.NEGATIVE_START, [{"kind": "agent", "agent": "c", "workload": "cc", "start_s": -0.5}]),
    (Rule.NEGATIVE_DELAY, [req(delay_s=-1)]),
    (Rule.NEGATIVE_KEEP, [req(input={"base": "a.r2", "keep": -1, "new": 3})]),
    (Rule.NEGATIVE_NEW, [req(input={"base": "a.r2", "keep": 3, "new": -1})]),
    (Rule.EMPTY_PROMPT, [req(input={"new": 0})]),
    (Rule.EMPTY_PROMPT, [req(input={"base": "a.r2", "keep": 0, "new": 0})]),
    (Rule.NO_OUTPUT, [req(output_tokens=0)]),
    (Rule.UNDEFINED_AGENT, [req(agent="zz", branch="zz.m", input={"new": 1})]),
    (Rule.UNDEFINED_AFTER, [req(after=["a.r9"])]),
    (Rule.UNDEFINED_AFTER, [req(after=["a.r3"])]),  # itself: not defined on an earlier line
    (Rule.AFTER_OTHER_AGENT, [req(rid="b.r2", agent="b", branch="b.m", after=["a.r1"], input={"new": 1})]),
    (Rule.BRANCH_OTHER_AGENT, [req(rid="b.r2", agent="b", branch="a.m", input={"new": 1})]),
    (Rule.UNDEFINED_BASE, [req(input={"base": "a.r9", "keep": 1, "new": 1})]),
    (Rule.UNDEFINED_BASE, [req(input={"base": "a.r3", "keep": 1, "new": 1})]),  # itself
    (Rule.UNDEFINED_PREFIX, [req(input={"shared": "T", "keep": 1, "new": 1})]),
    (Rule.BASE_AND_SHARED, [req(input={"base": "a.r2", "shared": "S", "keep": 1, "new": 1})]),
    (Rule.KEEP_EXCEEDS_CONTEXT, [req(input={"base": "a.r1", "keep": 15, "new": 1})]),  # context 8+4+2 = 14
    (Rule.KEEP_EXCEEDS_PREFIX, [req(input={"shared": "S", "keep": 9, "new": 1})]),
    (Rule.KEEP_WITHOUT_SOURCE, [req(input={"keep": 3, "new": 1})]),
    (Rule.UNDEFINED_BRANCH, [{"kind": "branch_end", "branch": "zz", "after": "a.r2"}]),
    (Rule.BRANCH_END_NOT_IN_BRANCH, [{"kind": "branch_end", "branch": "a.m", "after": "b.r1"}]),
    (Rule.BRANCH_END_NOT_IN_BRANCH, [{"kind": "branch_end", "branch": "a.m", "after": "a.r9"}]),
    (Rule.DUPLICATE_BRANCH_END, [{"kind": "branch_end", "branch": "a.m", "after": "a.r2"},
                                 {"kind": "branch_end", "branch": "a.m", "after": "a.r1"}]),  # fmt: skip
    (Rule.REQUEST_AFTER_BRANCH_END, [{"kind": "branch_end", "branch": "a.m", "after": "a.r1"}, req()]),
    (Rule.MISSING_FIELD, [{"kind": "branch_end", "branch": "a.m"}]),
]


@pytest.mark.parametrize(("rule", "extra"), BROKEN, ids=[f"{r.value}-{i}" for i, (r, _) in enumerate(BROKEN)])
def test_each_broken_rule_is_refused_with_its_line(rule: Rule, extra: list[object]) -> None:
    text = lines(*extra)
    with pytest.raises(TraceError) as info:
        parse_lines(text, source="t.jsonl")
    assert info.value.rule is rule, str(info.value)
    assert info.value.line == len(text)
    assert str(info.value).startswith(f"t.jsonl:{len(text)}: [{rule.value}] ")


def test_every_rule_has_a_broken_example() -> None:
    covered = {rule for rule, _ in BROKEN} | {Rule.UNSUPPORTED_VERSION, Rule.NOT_UTF8, Rule.UNREADABLE}
    assert covered == set(Rule)


def test_header_version_other_than_1_is_refused_on_line_1() -> None:
    with pytest.raises(TraceError) as info:
        parse_lines([json.dumps({"kind": "header", "version": 2})])
    assert (info.value.line, info.value.rule) == (1, Rule.UNSUPPORTED_VERSION)


def test_first_error_in_file_order_wins() -> None:
    text = lines(req(output_tokens=0), "{broken")
    with pytest.raises(TraceError) as info:
        parse_lines(text)
    assert (info.value.line, info.value.rule) == (len(VALID) + 1, Rule.NO_OUTPUT)


def test_forward_reference_is_refused_even_if_defined_later() -> None:
    text = lines(req(input={"base": "a.r4", "keep": 1, "new": 1}), req(rid="a.r4"))
    with pytest.raises(TraceError) as info:
        parse_lines(text)
    assert (info.value.line, info.value.rule) == (len(VALID) + 1, Rule.UNDEFINED_BASE)


def test_not_utf8_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(("\n".join(lines()) + "\n").encode() + b'{"kind": "\xff"}\n')
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.line, info.value.rule) == (len(VALID) + 1, Rule.NOT_UTF8)


def test_truncated_gzip_is_refused(tmp_path: Path) -> None:
    data = gzip.compress(("\n".join(lines()) + "\n").encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.rule is Rule.UNREADABLE
    assert info.value.line >= 1


def test_valid_file_with_unknown_keys_and_blank_lines_loads(tmp_path: Path) -> None:
    records = [dict(r, future_field={"x": 1}) for r in VALID]
    records[5]["input"] = dict(records[5]["input"], modality="image")  # type: ignore[arg-type]
    text = [json.dumps(r) for r in records]
    text.insert(3, "   ")
    text.append("")
    path = tmp_path / "ok.jsonl"
    path.write_text("\n".join(text) + "\n")
    trace = load_trace(path)
    assert [r.id for r in trace.requests] == ["a.r1", "a.r2", "b.r1"]
    assert trace.request("a.r2").line == 7  # blank lines still count
    assert trace.agents["b"].start_s == 1.5 and trace.agents["b"].workload == "osworld"


def test_gzip_loads_like_plain(tmp_path: Path) -> None:
    plain = tmp_path / "t.jsonl"
    plain.write_text("\n".join(lines()) + "\n")
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_trace(packed).requests == load_trace(plain).requests


def test_trace_model_fields_and_relations() -> None:
    trace = parse_lines(lines())
    r1, r2, b1 = trace.requests
    assert (r1.prompt_tokens, r1.output_tokens, r1.context_tokens) == (12, 2, 14)
    assert (r2.base, r2.keep, r2.new, r2.after, r2.delay_s) == ("a.r1", 14, 3, ("a.r1",), 1.0)
    assert (b1.after, b1.delay_s, b1.base, b1.shared, b1.keep) == ((), 0.0, None, None, 0)
    assert [r.relation for r in trace.requests] == [Relation.ROOT, Relation.APPEND, Relation.ROOT]
    assert trace.branches["a.m"].requests == ("a.r1", "a.r2")
    assert trace.branches["a.m"].agent == "a" and trace.branches["a.m"].end is None
    assert list(trace.prefixes) == ["S"] and trace.header is not None and trace.name == "t"
    with pytest.raises(TypeError):
        trace.agents["c"] = trace.agents["a"]  # type: ignore[index]


def test_relations_fork_sub_agent_rewrite() -> None:
    text = lines(
        req(rid="a.f1", branch="a.fork", input={"base": "a.r1", "keep": 10, "new": 1}),
        req(rid="a.s1", branch="a.sub", input={"shared": "S", "keep": 8, "new": 1}),
        req(rid="a.n1", branch="a.sub2", input={"new": 4}),
        req(rid="a.r3", input={"base": "a.r2", "keep": 8, "new": 5}),
        req(rid="a.r4", input={"base": "a.r1", "keep": 14, "new": 5}),  # rewind to an older request
        {"kind": "branch_end", "branch": "a.sub", "after": "a.s1"},
    )
    trace = parse_lines(text)
    got = {r.id: r.relation for r in trace.requests}
    assert got["a.f1"] is Relation.FORK
    assert got["a.s1"] is Relation.SUB_AGENT and got["a.n1"] is Relation.SUB_AGENT
    assert got["a.r3"] is Relation.REWRITE and got["a.r4"] is Relation.REWRITE
    assert trace.branches["a.sub"].end is not None and trace.branches["a.sub"].end.after == "a.s1"


def test_written_records_load_back_equal(tmp_path: Path) -> None:
    trace = parse_lines(lines({"kind": "branch_end", "branch": "a.m", "after": "a.r2"}))
    path = tmp_path / "round.jsonl.gz"
    write_records(trace_to_records(trace), path)
    again = load_trace(path)
    assert again.requests == trace.requests
    assert again.branch_ends == trace.branch_ends
    assert dict(again.agents) == dict(trace.agents)
