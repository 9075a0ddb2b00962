"""The agent-log importers (mini-swe-agent, Claude Code, OpenAI-compatible logs): exact traces on hand-written
fixtures, malformed input refused with file and line, and the 20 real mini-swe-agent trajectories."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from evolving_infra.traces.claude_code import import_claude_code
from evolving_infra.traces.importing import LogFormatError
from evolving_infra.traces.loader import load_trace
from evolving_infra.traces.miniswe import import_mini_swe_agent
from evolving_infra.traces.openai_log import import_openai_log
from evolving_infra.traces.records import Relation

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_REPO = Path(__file__).resolve().parents[2]
SAMPLES = Path(os.environ.get("EVOLVING_INFRA_MINI_SWE_DIR", str(_REPO.parent / "shared" / "traces" / "mini-swe-agent")))


def _body(path: Path) -> list[dict[str, Any]]:
    """Every record but the header, without the importer's extra source-line keys."""
    out = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] != "header":
            out.append({k: v for k, v in record.items() if not k.endswith("_line")})
    return out


def _req(rid: str, agent: str, branch: str, after: list[str], delay: float, spec: dict[str, Any], out: int) -> dict[str, Any]:
    return {"kind": "request", "id": rid, "agent": agent, "branch": branch, "after": after, "delay_s": delay,
            "input": spec, "output_tokens": out}  # fmt: skip


# --- Claude Code -----------------------------------------------------------------------------------------


def test_claude_code_fixture_exact_trace(tmp_path: Path) -> None:
    out = tmp_path / "cc.jsonl"
    report = import_claude_code(FIXTURES / "claude-code" / "project", out)
    main_p, sub_p = "claude-code:claude-opus-4:main", "claude-code:claude-opus-4:sub-agent"
    assert _body(out) == [
        {"kind": "prefix", "name": main_p, "tokens": 2000},  # smallest cache read of the main first calls
        {"kind": "prefix", "name": sub_p, "tokens": 1500},
        {"kind": "agent", "agent": "sess1", "workload": "claude-code", "start_s": 0.0},
        # Two streaming rows of msg_1: one call, the larger output_tokens.
        _req("sess1.r0", "sess1", "sess1.main", [], 0.0, {"shared": main_p, "keep": 2000, "new": 1010}, 40),
        # The sub-agent starts after the Task call (its meta.json names the tool use), 1 s after it ended.
        _req("sess1.a1.r0", "sess1", "sess1.a1", ["sess1.r0"], 1.0, {"shared": sub_p, "keep": 1500, "new": 200}, 15),
        _req("sess1.a1.r1", "sess1", "sess1.a1", ["sess1.a1.r0"], 4.0, {"base": "sess1.a1.r0", "keep": 1715, "new": 40}, 25),
        {"kind": "branch_end", "branch": "sess1.a1", "after": "sess1.a1.r1"},
        # The parent waits for the sub-agent; its pause runs from the later end (10:00:12) to the tool result.
        _req("sess1.r1", "sess1", "sess1.main", ["sess1.r0", "sess1.a1.r1"], 8.0,
             {"base": "sess1.r0", "keep": 3050, "new": 40}, 20),
        # Compaction: only the cached system prefix survives.
        _req("sess1.r2", "sess1", "sess1.main", ["sess1.r1"], 38.0, {"base": "sess1.r1", "keep": 2000, "new": 500}, 30),
        # Model switch: no KV of the other model; sonnet has no prefix evidence, so from nothing.
        _req("sess1.r3", "sess1", "sess1.main", ["sess1.r2"], 5.0, {"new": 3000}, 10),
    ]  # fmt: skip
    assert (report.sub_agents, report.compactions, report.model_switches, report.missing_sidechains) == (1, 1, 1, 1)
    assert (report.requests, report.branches, report.agents, report.prompt_tokens) == (6, 2, 1, 15055)
    trace = load_trace(out)
    relations = [r.relation for r in trace.requests]
    assert relations == [Relation.ROOT, Relation.SUB_AGENT, Relation.APPEND, Relation.APPEND, Relation.REWRITE,
                         Relation.REWRITE]  # fmt: skip


def test_claude_code_without_meta_links_the_sub_agent_through_the_tool_result(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "sess1" / "subagents").mkdir(parents=True)
    src = FIXTURES / "claude-code" / "project"
    (project / "sess1.jsonl").write_text((src / "sess1.jsonl").read_text())
    side = "sess1/subagents/agent-a1.jsonl"
    (project / side).write_text((src / side).read_text())
    out = tmp_path / "cc.jsonl"
    import_claude_code(project, out)
    sub = load_trace(out).request("sess1.a1.r0")
    assert sub.after == ("sess1.r0",) and sub.relation is Relation.SUB_AGENT


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a row"]', "must be a JSON object"),
        ('{"message": {}}', "no 'type'"),
        ('{"type": "assistant", "message": {"id": "m", "model": "x", "usage": {"input_tokens": -1}}}', "usage.input_tokens"),
        ('{"type": "user", "timestamp": "yesterday", "message": {"role": "user", "content": "x"}}', "ISO 8601"),
    ],
)
def test_claude_code_malformed_rows_name_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    session = tmp_path / "s.jsonl"
    good = (FIXTURES / "claude-code" / "project" / "sess1.jsonl").read_text().splitlines()
    session.write_text("\n".join([*good[:2], row, *good[2:]]) + "\n")
    with pytest.raises(LogFormatError) as info:
        import_claude_code(tmp_path, tmp_path / "out.jsonl")
    assert (info.value.path, info.value.line) == (str(session), 3) and message in info.value.message


# --- OpenAI-compatible log --------------------------------------------------------------------------------


def test_openai_log_fixture_exact_trace(tmp_path: Path) -> None:
    out = tmp_path / "ol.jsonl"
    report = import_openai_log(FIXTURES / "openai-log" / "proxy.jsonl", out)
    body = _body(out)
    prefix = body[0]["name"]
    assert body[0] == {"kind": "prefix", "name": prefix, "tokens": 100}  # the system message's share of chars
    assert body[1:] == [
        {"kind": "agent", "agent": "o0", "workload": "openai-log", "start_s": 0.0},
        _req("r1", "o0", "o0.b0", [], 0.0, {"shared": prefix, "keep": 100, "new": 20}, 10),
        # Repeats r1's messages and its answer: an append; the pause runs from r1's end_time.
        _req("r2", "o0", "o0.b0", ["r1"], 2.0, {"base": "r1", "keep": 130, "new": 20}, 8),
        {"kind": "agent", "agent": "o1", "workload": "openai-log", "start_s": 2.0},
        _req("r3", "o1", "o1.b0", [], 0.0, {"shared": prefix, "keep": 100, "new": 25}, 5),
        # Same messages as r2, another answer (a retry): keeps r2's prompt.
        _req("r4", "o0", "o0.b0", ["r2"], 1.5, {"base": "r2", "keep": 150, "new": 0}, 6),
        # Line 5 has no usage: skipped. Line 6 repeats r1's context only: a fork of r1.
        _req("r6", "o0", "o0.b1", ["r1"], 7.0, {"base": "r1", "keep": 130, "new": 10}, 4),
        {"kind": "agent", "agent": "s9", "workload": "openai-log", "start_s": 10.0},
        _req("r7", "s9", "s9.b0", [], 0.0, {"shared": prefix, "keep": 100, "new": 40}, 3),
        # Shares two of r7's three messages: keep estimated from characters; output 0 raised to 1.
        _req("r8", "s9", "s9.b0", ["r7"], 1.0, {"base": "r7", "keep": 135, "new": 10}, 1),
        # Same session, nothing shared beyond the system prompt: a sub-agent; its negative pause is clamped.
        _req("r9", "s9", "s9.b1", ["r8"], 0.0, {"shared": prefix, "keep": 100, "new": 10}, 2),
    ]  # fmt: skip
    assert (report.skipped_calls, report.forks, report.sub_agents) == (1, 1, 1)
    assert (report.estimated_keeps, report.estimated_outputs, report.clamped_delays) == (1, 1, 1)
    assert load_trace(out).request("r9").relation is Relation.SUB_AGENT


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{", "not valid JSON"),
        ('{"request": {"messages": []}, "response": {}}', "non-empty list"),
        ('{"request": {"messages": [{"role": "user"}]}}', "'request' and 'response'"),
        ('{"request": {"messages": [{"role": "user"}]}, "response": {"usage": {"prompt_tokens": 1.5}}}', "prompt_tokens"),
    ],
)
def test_openai_log_malformed_rows_name_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    log = tmp_path / "log.jsonl"
    good = (FIXTURES / "openai-log" / "proxy.jsonl").read_text().splitlines()
    log.write_text("\n".join([good[0], "", row]) + "\n")
    with pytest.raises(LogFormatError) as info:
        import_openai_log(log, tmp_path / "out.jsonl")
    assert (info.value.path, info.value.line) == (str(log), 3) and message in info.value.message


# --- mini-swe-agent ---------------------------------------------------------------------------------------


def _traj(messages: list[dict[str, Any]], fmt: str = "mini-swe-agent-1") -> dict[str, Any]:
    return {"info": {}, "messages": messages, "trajectory_format": fmt, "instance_id": "t1"}


def _answer(prompt: int, completion: int, reasoning: int, created: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "completion_tokens_details": {"reasoning_tokens": reasoning}}  # fmt: skip
    return {"role": "assistant", "content": "THOUGHT: x", "extra": {"response": {"created": created, "usage": usage}}}


def test_mini_swe_agent_fixture_exact_trace(tmp_path: Path) -> None:
    system = {"role": "system", "content": "s" * 100}
    messages = [
        system, {"role": "user", "content": "u" * 300},
        _answer(400, 50, 30, 1000),  # reasoning: the next prompt keeps only this prompt
        {"role": "user", "content": "obs"},
        _answer(440, 20, 0, 1010),  # no reasoning: the next prompt keeps prompt + answer
        {"role": "user", "content": "obs"},
        {"role": "assistant", "content": "format error, no usage"},  # skipped
        {"role": "user", "content": "obs"},
        _answer(500, 0, 0, 1009),  # output 0 -> 1; created earlier than the previous call: delay clamped
        {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
    ]  # fmt: skip
    (tmp_path / "t1.traj.json").write_text(json.dumps(_traj(messages), indent=1))
    out = tmp_path / "t.jsonl"
    report = import_mini_swe_agent(tmp_path, out)
    body = _body(out)
    prefix = body[0]["name"]
    assert body[0]["tokens"] == 100  # 400 prompt tokens x 100 / 400 characters
    assert body[1:] == [
        {"kind": "agent", "agent": "t1", "workload": "mini-swe-agent", "start_s": 0.0},
        _req("t1.r0", "t1", "t1.main", [], 0.0, {"shared": prefix, "keep": 100, "new": 300}, 50),
        _req("t1.r1", "t1", "t1.main", ["t1.r0"], 10.0, {"base": "t1.r0", "keep": 400, "new": 40}, 20),
        _req("t1.r2", "t1", "t1.main", ["t1.r1"], 0.0, {"base": "t1.r1", "keep": 460, "new": 40}, 1),
    ]  # fmt: skip
    assert (report.skipped_calls, report.estimated_outputs, report.clamped_delays) == (1, 1, 1)


def test_mini_swe_agent_1_1_tool_calls_and_response_api(tmp_path: Path) -> None:
    messages = [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "bash"}}],
         "extra": {"timestamp": 50.0, "response": {"usage": {"prompt_tokens": 30, "completion_tokens": 5}}}},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
        {"object": "response", "created_at": 52, "output": [],
         "usage": {"input_tokens": 45, "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0}}},
        {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
    ]  # fmt: skip
    (tmp_path / "x.traj.json").write_text(json.dumps(_traj(messages, "mini-swe-agent-1.1")))
    out = tmp_path / "t.jsonl"
    import_mini_swe_agent(tmp_path / "x.traj.json", out)
    trace = load_trace(out)
    assert [(r.prompt_tokens, r.output_tokens, r.keep, r.relation) for r in trace.requests] == [
        (30, 5, trace.requests[0].keep, Relation.ROOT), (45, 9, 35, Relation.APPEND)]  # fmt: skip
    assert trace.requests[1].delay_s == 2.0


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('{"messages": [],\n "trajectory_format": "other"}', 1, "trajectory_format"),
        ('{"trajectory_format": "mini-swe-agent-1",\n "messages": [\n {"role": "user"},\n 7\n]}', 4, "message 1"),
        ('{"trajectory_format": "mini-swe-agent-1",\n "messages": [\n\n {"role": "assistant", "extra": {"response":'
         ' {"usage": {"prompt_tokens": -3, "completion_tokens": 1}}}}]}', 4, "prompt tokens"),
        ('{"trajectory_format": "mini-swe-agent-1",\n\n "messages": [}', 3, "not valid JSON"),
    ],
)
def test_mini_swe_agent_malformed_files_name_file_and_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    path = tmp_path / "bad.traj.json"
    path.write_text(text)
    with pytest.raises(LogFormatError) as info:
        import_mini_swe_agent(path, tmp_path / "out.jsonl")
    assert (info.value.path, info.value.line) == (str(path), line) and message in info.value.message


def test_the_20_real_mini_swe_agent_trajectories(tmp_path: Path) -> None:
    if not SAMPLES.is_dir():
        message = f"{SAMPLES} is not available (set EVOLVING_INFRA_MINI_SWE_DIR)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI always has shared/ beside the clone
        pytest.skip(message)
    out = tmp_path / "msa.jsonl.gz"
    report = import_mini_swe_agent(SAMPLES, out)
    trace = load_trace(out)  # validates
    calls = prompt = output = 0
    for path in sorted(SAMPLES.glob("*.traj.json")):
        for m in json.loads(path.read_text())["messages"]:
            usage = (m.get("extra") or {}).get("response", {}).get("usage") if m["role"] == "assistant" else None
            if usage:
                calls += 1
                prompt += usage["prompt_tokens"]
                output += max(1, usage["completion_tokens"])
    assert len(trace.agents) == 20 and report.files == 20
    assert len(trace.requests) == calls == report.requests
    assert sum(r.prompt_tokens for r in trace.requests) == prompt == report.prompt_tokens
    assert sum(r.output_tokens for r in trace.requests) == output
    assert all(r.keep <= r.prompt_tokens for r in trace.requests)
    # Every call but an agent's first continues its predecessor: an append, or a rewrite after reasoning.
    assert {r.relation for r in trace.requests} == {Relation.ROOT, Relation.APPEND, Relation.REWRITE}


def test_claude_code_older_layout_sidechains_beside_the_sessions(tmp_path: Path) -> None:
    src = FIXTURES / "claude-code" / "project"
    (tmp_path / "sess1.jsonl").write_text((src / "sess1.jsonl").read_text())
    (tmp_path / "agent-a1.jsonl").write_text((src / "sess1" / "subagents" / "agent-a1.jsonl").read_text())
    out = tmp_path / "cc.jsonl"
    report = import_claude_code(tmp_path, out)
    trace = load_trace(out)
    assert len(trace.agents) == 1 and report.sub_agents == 1
    assert trace.request("sess1.a1.r0").after == ("sess1.r0",)
