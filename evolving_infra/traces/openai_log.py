"""Import a JSON Lines log of OpenAI-compatible chat completions (request body, response with `usage`, as a
proxy records them) into trace format version 1, finding prefix reuse from message-list prefixes.

A log row is an object with `request` (the chat/completions body: `messages`, optional `tools`, `user`,
`metadata.session_id`) and `response` (with `usage`, optional `created` and `choices[0].message`), and
optionally `session_id`, `start_time` and `end_time` (ISO 8601 or epoch seconds/milliseconds).

Invariant: each request's prompt has exactly the row's `usage.prompt_tokens` and its output its
`completion_tokens`; only the split into kept and fresh tokens, the grouping into agents and the pauses are
inferred (see `ASSUMPTIONS`).

Boundary: `parse_log` and `convert_log` are pure; `import_openai_log` reads and writes files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
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
    "One request per log row: prompt = usage.prompt_tokens, output = usage.completion_tokens (reasoning "
    "included; 0 is raised to 1 and counted). Rows without usage are skipped and counted.",
    "A prompt is the list [tools, messages...]; a message is compared by role, text content, tool calls, "
    "tool_call_id and name. A row's base is the latest earlier row sharing the longest leading run of that "
    "list, counting the earlier row's answer (choices[0].message) as one more element.",
    "keep: the base's whole context when the row repeats the base's messages and answer (unless the base "
    "generated reasoning tokens, which are not sent back: then its prompt); the base's prompt when it repeats "
    "only its messages; for a shorter run, the base's prompt tokens in proportion to the characters of the "
    "shared messages (estimated and counted). Keeps are clamped to the prompt.",
    "The leading system messages and tools form a shared prefix (one per distinct content); its tokens are "
    "estimated in proportion to characters, the smallest estimate over the rows using it. A row that shares "
    "no more than that prefix starts from it.",
    "Agents: the row's session (session_id, request.metadata.session_id, request.user) when given, else the "
    "chain of bases (a row without a base starts a new agent). A row continues its base's branch when the "
    "base is that branch's latest request, otherwise it forks; a session's row with no base in the session "
    "starts a sub-agent branch after the session's latest request.",
    "Pauses: delay_s = start_time - end_time of the request waited for when both are logged, else the gap "
    "between start times (response.created when no start_time), clamped at 0 and counted. Agents start at "
    "their first row's time minus the earliest row's.",
)


@dataclass(frozen=True, slots=True)
class LogRow:
    line: int
    session: str | None
    items: tuple[str, ...]  # canonical keys of [tools?, *messages]
    chars: tuple[int, ...]  # characters of each item
    system_items: int  # leading tools / system items
    answer: str | None
    prompt: int
    output: int
    reasoning: int
    start_s: float | None
    end_s: float | None


def _dict_or_empty(value: object) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) and isinstance(p.get("text"), str) else "" for p in content)
    return ""


def _canonical(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    shaped = {
        "role": message.get("role"), "content": _text(message.get("content")),
        "tool_calls": [[c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
                       for c in calls if isinstance(c, dict)],
        "tool_call_id": message.get("tool_call_id"), "name": message.get("name"),
    }  # fmt: skip
    return json.dumps(shaped, sort_keys=True, ensure_ascii=False)


def _nonneg(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _row(obj: object, path: str, line: int) -> LogRow | None:
    if not isinstance(obj, dict):
        raise LogFormatError(path, line, "each row must be a JSON object")
    request, response = obj.get("request"), obj.get("response")
    if not isinstance(request, dict) or not isinstance(response, dict):
        raise LogFormatError(path, line, "a row needs 'request' and 'response' objects")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise LogFormatError(path, line, "request.messages must be a non-empty list of objects")
    usage = response.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt, output = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
    details = usage.get("completion_tokens_details") or {}
    reasoning = details.get("reasoning_tokens", 0) if isinstance(details, dict) else 0
    for key, value in (("prompt_tokens", prompt), ("completion_tokens", output), ("reasoning_tokens", reasoning)):
        if not _nonneg(value if key != "reasoning_tokens" or value is not None else 0):
            raise LogFormatError(path, line, f"usage.{key} must be a non-negative integer, got {value!r}")
    assert isinstance(prompt, int) and isinstance(output, int)  # checked just above
    items: list[str] = []
    chars: list[int] = []
    tools = request.get("tools")
    if tools:
        text = json.dumps(tools, sort_keys=True, ensure_ascii=False)
        items.append("tools:" + hashlib.sha256(text.encode()).hexdigest())
        chars.append(len(text))
    for m in messages:
        items.append(_canonical(m))
        chars.append(len(_text(m.get("content"))) + len(json.dumps(m.get("tool_calls") or [])) + 1)
    system = (1 if tools else 0) + next((i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")), len(messages))
    choices = response.get("choices")
    answer = None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) and isinstance(choices[0].get("message"), dict):
        answer = _canonical(choices[0]["message"])
    meta = _dict_or_empty(request.get("metadata"))
    session = next((v for v in (obj.get("session_id"), meta.get("session_id"), request.get("user"))
                    if isinstance(v, str) and v), None)  # fmt: skip
    times: dict[str, float | None] = {}
    for key, values in (("start", (obj.get("start_time"), response.get("created"))), ("end", (obj.get("end_time"),))):
        times[key] = None
        for value in values:
            if value is not None:
                times[key] = parse_time(value)
                if times[key] is None:
                    raise LogFormatError(path, line, f"{value!r} is not a time (ISO 8601 or epoch seconds)")
                break
    return LogRow(line, session, tuple(items), tuple(chars), system, answer, prompt, output, reasoning or 0,
                  times["start"], times["end"])  # fmt: skip


def parse_log(text: str, path: str) -> tuple[list[LogRow], int]:
    """The rows of a log (and how many were skipped for having no usage)."""
    rows: list[LogRow] = []
    skipped = 0
    for line, data in enumerate(text.splitlines(), start=1):
        if not data.strip():
            continue
        try:
            obj = json.loads(data)
        except json.JSONDecodeError as exc:
            raise LogFormatError(path, line, f"not valid JSON: {exc.msg}") from None
        row = _row(obj, path, line)
        if row is None:
            skipped += 1
        else:
            rows.append(row)
    return rows, skipped


def _chain(items: Sequence[str]) -> list[bytes]:
    """hashes[j] names the list's first j + 1 items."""
    out: list[bytes] = []
    h = b""
    for item in items:
        h = hashlib.blake2b(h + item.encode(), digest_size=16).digest()
        out.append(h)
    return out


def convert_log(
    rows: Sequence[LogRow], *, name: str, source: str, workload: str = "openai-log", skipped: int = 0
) -> tuple[list[dict[str, Any]], AgentImportReport]:
    """Records of trace format version 1 for log rows, and a report (see `ASSUMPTIONS`)."""
    report = AgentImportReport(kind=ImportKind.OPENAI_LOG.value, files=1, skipped_calls=skipped)
    builder = TraceBuilder(report, name=name, source=source, notes=" ".join(ASSUMPTIONS))
    chains = [_chain(r.items) for r in rows]
    prefix_of: list[str | None] = []
    for r, chain in zip(rows, chains, strict=True):
        total = sum(r.chars)
        if r.system_items and total:
            new_prefix = "openai-log:" + chain[r.system_items - 1].hex()[:10]
            builder.prefix(new_prefix, max(1, r.prompt * sum(r.chars[: r.system_items]) // total))
            prefix_of.append(new_prefix)
        else:
            prefix_of.append(None)
    report.estimated_prefix_tokens = sum(builder.prefix_tokens(p) for p in set(prefix_of) if p)
    times = [r.start_s for r in rows if r.start_s is not None]
    origin = min(times) if times else 0.0
    seen: dict[bytes, int] = {}  # prefix hash -> latest row whose list starts with it
    ends: dict[bytes, int] = {}  # hash of a whole prompt list, or of a prompt list and its answer -> latest row
    agent_of: list[str] = []
    branch_of: list[str] = []
    tail: dict[str, int] = {}
    last_of_agent: dict[str, int] = {}
    branches_of: dict[str, int] = {}
    for i, r in enumerate(rows):
        run = _run(chains[i], seen)
        base = None
        if run > r.system_items:
            base = ends.get(chains[i][run - 1], seen[chains[i][run - 1]])
        agent = r.session or (agent_of[base] if base is not None else f"o{len(branches_of)}")
        if agent not in branches_of:
            branches_of[agent] = 0
            builder.agent(agent, workload, (r.start_s if r.start_s is not None else origin) - origin)
        waits: int | None
        if base is not None and agent_of[base] == agent:
            branch = branch_of[base]
            if tail[branch] != base:
                branch = _new_branch(agent, branches_of)
                report.forks += 1
            waits = base
        else:
            branch = _new_branch(agent, branches_of)
            waits = last_of_agent.get(agent)
            if waits is not None and base is None:
                report.sub_agents += 1
        after = [f"r{rows[waits].line}"] if waits is not None else []
        delay = _delay(r, rows[waits]) if waits is not None else 0.0
        if waits is not None and delay is None:
            report.missing_timestamps += 1
        common: dict[str, Any] = {"agent": agent, "branch": branch, "prompt": r.prompt, "output": r.output,
                                  "after": after, "delay_s": delay or 0.0, "extra": {"openai_log_line": r.line}}  # fmt: skip
        if base is not None:
            b = rows[base]
            if run == len(b.items) + 1:
                keep = append_keep(b.prompt, b.output, r.prompt, output_sent_back=b.reasoning == 0)
            elif run == len(b.items):
                keep = min(b.prompt, r.prompt)
            else:
                keep = b.prompt * sum(b.chars[:run]) // max(1, sum(b.chars))
                report.estimated_keeps += 1
            builder.request(f"r{r.line}", base=f"r{b.line}", keep=keep, **common)
        else:
            prefix = prefix_of[i]
            builder.request(f"r{r.line}", shared=prefix, keep=builder.prefix_tokens(prefix) if prefix else 0, **common)
        agent_of.append(agent)
        branch_of.append(branch)
        tail[branch] = i
        last_of_agent[agent] = i
        for h in chains[i]:
            seen[h] = i
        ends[chains[i][-1]] = i
        if r.answer is not None:
            answered = hashlib.blake2b(chains[i][-1] + r.answer.encode(), digest_size=16).digest()
            seen[answered] = ends[answered] = i
    return builder.records(), report


def _new_branch(agent: str, branches_of: dict[str, int]) -> str:
    branch = f"{agent}.b{branches_of[agent]}"
    branches_of[agent] += 1
    return branch


def _delay(row: LogRow, waited: LogRow) -> float | None:
    if row.start_s is None:
        return None
    if waited.end_s is not None:
        return row.start_s - waited.end_s
    if waited.start_s is not None:
        return row.start_s - waited.start_s
    return None


def _run(chain: Sequence[bytes], seen: dict[bytes, int]) -> int:
    """Length of the longest leading run of the list already seen (prefix hashes make it monotone)."""
    lo, hi = 0, len(chain)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if chain[mid - 1] in seen:
            lo = mid
        else:
            hi = mid - 1
    return lo


def import_openai_log(
    src: str | os.PathLike[str], out_path: str | os.PathLike[str], *, workload: str = "openai-log",
    name: str | None = None,
) -> AgentImportReport:
    """Convert the log at `src` into a trace at `out_path`."""
    path = Path(src)
    rows, skipped = parse_log(path.read_text(encoding="utf-8"), str(path))
    records, report = convert_log(
        rows, name=name or f"openai-log-{path.stem}", workload=workload, skipped=skipped,
        source=f"OpenAI-compatible request log {path.name}, converted by evolving-infra trace import",
    )  # fmt: skip
    write_records(records, out_path)
    return report
