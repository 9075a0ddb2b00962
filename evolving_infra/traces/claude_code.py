"""Import Claude Code session logs (a project folder of `SESSION.jsonl` files, each with its sub-agents'
sidechains in `SESSION/subagents/agent-*.jsonl`) into trace format version 1.

One agent per session; the main conversation and every sub-agent are branches. Invariant: every request's
prompt has exactly the tokens the API reported for that call (`input_tokens + cache_creation_input_tokens +
cache_read_input_tokens`) and its output the reported `output_tokens`; only the split into kept and fresh
tokens and the pauses are inferred (see `ASSUMPTIONS`).

Boundary: `parse_session_log` and `convert_sessions` are pure; `import_claude_code` reads the folder and writes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolving_infra.traces.importing import (
    AgentImportReport,
    ImportKind,
    LogFormatError,
    TraceBuilder,
    append_keep,
    parse_time,
)
from evolving_infra.traces.writer import write_records

ASSUMPTIONS: tuple[str, ...] = (
    "One agent per session file; its main conversation is one branch and each sub-agent sidechain "
    "(SESSION/subagents/agent-ID.jsonl, or agent-ID.jsonl beside the sessions naming it in sessionId) another. Rows other than user, assistant and the compact_boundary "
    "system row are skipped.",
    "Streaming rows of one message (same message.id) are one call: their content blocks are merged and the "
    "largest output_tokens is taken. Assistant rows without usage and <synthetic> messages are skipped and "
    "counted.",
    "prompt = input_tokens + cache_creation_input_tokens + cache_read_input_tokens; output = output_tokens "
    "(0 is raised to 1 and counted).",
    "A call continues the previous call of its branch (an append of its whole context, or of its prompt when "
    "the prompt is shorter than that context). After a compact_boundary row the call keeps only the tokens "
    "the API read from its cache (the system prompt and tools that survive the rewrite), at most the "
    "previous prompt. A call on another model than the previous one cannot reuse its KV: it restarts from "
    "that model's shared prefix.",
    "Shared prefixes, one per model and per role (main or sub-agent): tokens = the smallest positive "
    "cache_read_input_tokens among the first calls of that kind (what earlier sessions had cached); a kind "
    "with no such evidence has no prefix and its first calls start from nothing.",
    "A sub-agent branch starts after the parent call that issued its Task tool use (from agent-ID.meta.json's "
    "toolUseId, the parent's tool result toolUseResult.agentId, or else time order). The parent's first call "
    "after the sub-agent's tool result lists the sub-agent's last call in after. A tool result naming an "
    "agentId whose sidechain file is missing is counted; its time stays in the parent's pause.",
    "Pauses: a call is issued at the last user row (prompt or tool result) before it; delay_s = that time - "
    "the end (last streaming row) of the latest call it waits for, clamped at 0 and counted. Agents start at "
    "their first call's issue time minus the earliest one of all sessions.",
)


@dataclass
class Call:
    """One API call (possibly several streaming rows)."""

    message_id: str
    model: str
    prompt: int
    output: int
    cache_read: int
    line: int
    first_s: float | None
    last_s: float | None
    issued_s: float | None
    compacted: bool
    tool_uses: list[str] = field(default_factory=list)


@dataclass
class BranchLog:
    """The calls of one file (the main conversation or one sidechain) and its tool results."""

    path: str
    agent_id: str | None
    calls: list[Call]
    results: dict[str, tuple[float | None, str | None]]  # tool_use_id -> (time, sub-agent id it names)
    skipped: int
    first_s: float | None
    meta_tool_use: str | None = None


def _nonneg(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _time(row: dict[str, Any], path: str, line: int) -> float | None:
    value = row.get("timestamp")
    if value is None:
        return None
    parsed = parse_time(value)
    if parsed is None:
        raise LogFormatError(path, line, f"timestamp {value!r} is not an ISO 8601 time")
    return parsed


def parse_session_log(text: str, path: str, agent_id: str | None = None) -> BranchLog:
    """Check and read one session or sidechain file."""
    calls: dict[str, Call] = {}
    results: dict[str, tuple[float | None, str | None]] = {}
    skipped = 0
    compacted = False
    issued: float | None = None
    first_s: float | None = None
    for line, data in enumerate(text.splitlines(), start=1):
        if not data.strip():
            continue
        try:
            row = json.loads(data)
        except json.JSONDecodeError as exc:
            raise LogFormatError(path, line, f"not valid JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise LogFormatError(path, line, "each row must be a JSON object")
        kind = row.get("type")
        if not isinstance(kind, str):
            raise LogFormatError(path, line, "row has no 'type'")
        if kind == "system" and row.get("subtype") == "compact_boundary":
            compacted = True
            continue
        if kind not in ("user", "assistant"):
            continue
        message = row.get("message")
        if not isinstance(message, dict):
            raise LogFormatError(path, line, f"a {kind} row needs a 'message' object")
        ts = _time(row, path, line)
        if first_s is None:
            first_s = ts
        if kind == "user":
            issued = ts if ts is not None else issued
            compacted = compacted or row.get("isCompactSummary") is True
            _tool_results(row, message, ts, results)
            continue
        usage = message.get("usage")
        model = message.get("model")
        mid = message.get("id") or row.get("requestId") or row.get("uuid") or f"line{line}"
        if not isinstance(usage, dict) or model == "<synthetic>":
            skipped += mid not in calls
            continue
        figures = {k: usage.get(k, 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                                 "cache_read_input_tokens", "output_tokens")}  # fmt: skip
        for key, value in figures.items():
            if not _nonneg(value if value is not None else 0):
                raise LogFormatError(path, line, f"usage.{key} must be a non-negative integer, got {value!r}")
        figures = {k: v or 0 for k, v in figures.items()}
        if not isinstance(model, str) or not model:
            raise LogFormatError(path, line, "an assistant message needs a 'model'")
        uses = [b["id"] for b in message.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool_use"
                and isinstance(b.get("id"), str)]  # fmt: skip
        call = calls.get(mid)
        if call is None:
            prompt = figures["input_tokens"] + figures["cache_creation_input_tokens"] + figures["cache_read_input_tokens"]
            calls[mid] = Call(mid, model, prompt, figures["output_tokens"], figures["cache_read_input_tokens"],
                              line, ts, ts, issued, compacted, uses)  # fmt: skip
            compacted = False
        else:
            call.output = max(call.output, figures["output_tokens"])
            call.last_s = ts if ts is not None else call.last_s
            call.tool_uses.extend(uses)
    return BranchLog(path, agent_id, list(calls.values()), results, skipped, first_s)


def _tool_results(row: dict[str, Any], message: dict[str, Any], ts: float | None,
                  results: dict[str, tuple[float | None, str | None]]) -> None:  # fmt: skip
    content = message.get("content")
    if not isinstance(content, list):
        return
    named = row.get("toolUseResult")
    agent = named.get("agentId") if isinstance(named, dict) and isinstance(named.get("agentId"), str) else None
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str):
            results[block["tool_use_id"]] = (ts, agent)


@dataclass
class Session:
    name: str
    main: BranchLog
    subs: list[BranchLog]


def _prefix_name(model: str, role: str) -> str:
    return f"claude-code:{model}:{role}"


def _prefix_estimates(sessions: Sequence[Session]) -> dict[str, int]:
    evidence: dict[str, list[int]] = {}
    for s in sessions:
        for log in (s.main, *s.subs):
            if log.calls:
                first = log.calls[0]
                role = "main" if log.agent_id is None else "sub-agent"
                evidence.setdefault(_prefix_name(first.model, role), []).append(first.cache_read)
    return {name: min(v for v in values if v > 0) for name, values in evidence.items() if any(values)}


def convert_sessions(
    sessions: Sequence[Session], *, name: str, source: str, workload: str = "claude-code"
) -> tuple[list[dict[str, Any]], AgentImportReport]:
    """Records of trace format version 1 for parsed sessions, and a report (see `ASSUMPTIONS`)."""
    report = AgentImportReport(kind=ImportKind.CLAUDE_CODE.value, files=sum(1 + len(s.subs) for s in sessions))
    builder = TraceBuilder(report, name=name, source=source, notes=" ".join(ASSUMPTIONS))
    prefixes = _prefix_estimates(sessions)
    for prefix, tokens in prefixes.items():
        builder.prefix(prefix, tokens)
    report.estimated_prefix_tokens = sum(prefixes.values())
    starts = [s.main.calls[0].issued_s or s.main.calls[0].first_s for s in sessions if s.main.calls]
    known = [t for t in starts if t is not None]
    origin = min(known) if known else 0.0
    for s in sorted((s for s in sessions if s.main.calls), key=lambda s: (_start(s.main) or origin, s.name)):
        report.skipped_calls += s.main.skipped + sum(sub.skipped for sub in s.subs)
        builder.agent(s.name, workload, (_start(s.main) or origin) - origin)
        _convert_session(s, builder, prefixes)
    return builder.records(), report


def _start(log: BranchLog) -> float | None:
    return log.calls[0].issued_s if log.calls[0].issued_s is not None else log.calls[0].first_s


def _convert_session(s: Session, builder: TraceBuilder, prefixes: dict[str, int]) -> None:
    report = builder.report
    main_ids = [f"{s.name}.r{k}" for k in range(len(s.main.calls))]
    # Launch and join points of every sub-agent in the main conversation.
    launch: dict[int, list[BranchLog]] = {}
    joins: dict[int, list[BranchLog]] = {}
    linked = {sub.agent_id for sub in s.subs}
    for agent_id in {a for _, a in s.main.results.values() if a is not None} - linked:
        report.missing_sidechains += 1
    for sub in (sub for sub in s.subs if sub.calls):
        use = sub.meta_tool_use or next((u for u, (_, a) in s.main.results.items() if a == sub.agent_id), None)
        k = next((i for i, c in enumerate(s.main.calls) if use is not None and use in c.tool_uses), None)
        if k is None:
            first = _start(sub)
            earlier = [i for i, c in enumerate(s.main.calls) if first is None or (c.first_s or 0) <= first]
            k = earlier[-1] if earlier else 0
        launch.setdefault(k, []).append(sub)
        done = s.main.results.get(use, (None, None))[0] if use is not None else None
        if done is None:
            done = sub.calls[-1].last_s
        later = [i for i in range(k + 1, len(s.main.calls)) if done is None or (s.main.calls[i].issued_s or 0) >= done]
        if later:
            joins.setdefault(later[0], []).append(sub)
    last_of: dict[str, str] = {}
    end_of: dict[str, float | None] = {}
    for k, call in enumerate(s.main.calls):
        waits = [main_ids[k - 1]] if k else []
        waits += [last_of[sub.path] for sub in joins.get(k, []) if sub.path in last_of]
        _emit(builder, s.name, f"{s.name}.main", main_ids, k, s.main.calls, "main", prefixes, waits, end_of)
        for sub in launch.get(k, []):
            sub_ids = [f"{s.name}.{sub.agent_id}.r{j}" for j in range(len(sub.calls))]
            branch = f"{s.name}.{sub.agent_id}"
            for j in range(len(sub.calls)):
                _emit(builder, s.name, branch, sub_ids, j, sub.calls, "sub-agent", prefixes,
                      [sub_ids[j - 1]] if j else [main_ids[k]], end_of)  # fmt: skip
            builder.branch_end(branch, sub_ids[-1])
            last_of[sub.path] = sub_ids[-1]
            report.sub_agents += 1


def _emit(builder: TraceBuilder, agent: str, branch: str, ids: list[str], k: int, calls: list[Call], role: str,
          prefixes: dict[str, int], after: list[str], end_of: dict[str, float | None]) -> None:  # fmt: skip
    report = builder.report
    call = calls[k]
    ends = [end_of[a] for a in after if end_of.get(a) is not None]
    delay = 0.0
    if call.issued_s is not None and ends:
        delay = call.issued_s - max(e for e in ends if e is not None)
    elif after:
        report.missing_timestamps += 1
    prefix = _prefix_name(call.model, role)
    shared = prefix if prefix in prefixes else None
    common: dict[str, Any] = {"agent": agent, "branch": branch, "prompt": call.prompt, "output": call.output, "after": after,
              "delay_s": delay, "extra": {"claude_code_line": call.line}}  # fmt: skip
    if k == 0:
        builder.request(ids[k], shared=shared, keep=prefixes.get(prefix, 0), **common)
    elif calls[k - 1].model != call.model:
        report.model_switches += 1
        builder.request(ids[k], shared=shared, keep=prefixes.get(prefix, 0), **common)
    elif call.compacted:
        report.compactions += 1
        prev_prompt, _ = builder.context(ids[k - 1])
        builder.request(ids[k], base=ids[k - 1], keep=min(call.cache_read, prev_prompt), **common)
    else:
        prev_prompt, prev_output = builder.context(ids[k - 1])
        keep = append_keep(prev_prompt, prev_output, call.prompt, output_sent_back=True)
        builder.request(ids[k], base=ids[k - 1], keep=keep, **common)
    end_of[ids[k]] = call.last_s


def _session_of(side: Path) -> str | None:
    """The parent session id a sidechain file of the older layout (beside the sessions) names first."""
    for data in side.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(data)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("sessionId"), str):
            return str(row["sessionId"])
    return None


def read_sessions(src: str | os.PathLike[str]) -> list[Session]:
    """Parse every `*.jsonl` session of a project folder (or one session file) with its sidechains: those in
    `SESSION/subagents/` and, in the layout before Claude Code 2.1.2, `agent-*.jsonl` files beside the sessions
    that name the session in `sessionId`."""
    path = Path(src)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    older: dict[str, list[Path]] = {}
    for f in [f for f in files if f.name.startswith("agent-")]:
        older.setdefault(_session_of(f) or "", []).append(f)
    sessions: list[Session] = []
    for f in (f for f in files if not f.name.startswith("agent-")):
        main = parse_session_log(f.read_text(encoding="utf-8"), str(f))
        subs: list[BranchLog] = []
        for side in [*sorted((f.parent / f.stem / "subagents").glob("agent-*.jsonl")), *older.get(f.stem, [])]:
            agent_id = side.stem.removeprefix("agent-")
            log = parse_session_log(side.read_text(encoding="utf-8"), str(side), agent_id)
            meta = side.with_name(f"{side.stem}.meta.json")
            if meta.is_file():
                try:
                    info = json.loads(meta.read_text(encoding="utf-8"))
                except json.JSONDecodeError as exc:
                    raise LogFormatError(str(meta), exc.lineno, f"not valid JSON: {exc.msg}") from None
                use = info.get("toolUseId") if isinstance(info, dict) else None
                log.meta_tool_use = use if isinstance(use, str) else None
            subs.append(log)
        sessions.append(Session(f.stem, main, subs))
    return sessions


def import_claude_code(
    src: str | os.PathLike[str], out_path: str | os.PathLike[str], *, workload: str = "claude-code",
    name: str | None = None,
) -> AgentImportReport:
    """Convert the Claude Code sessions at `src` (a project folder or one session file) into a trace."""
    sessions = read_sessions(src)
    if not sessions:
        raise LogFormatError(str(src), 0, "no *.jsonl session files found")
    records, report = convert_sessions(
        sessions, name=name or f"claude-code-{Path(src).name}",
        source=f"{len(sessions)} Claude Code sessions from {src}, converted by evolving-infra trace import",
        workload=workload,
    )  # fmt: skip
    write_records(records, out_path)
    return report
