"""Import mini-SWE-agent trajectories (`*.traj.json`, formats `mini-swe-agent-1` and `mini-swe-agent-1.1`)
into trace format version 1: one agent per file, one request per assistant call that reports `usage`.

Invariant: a request's prompt has exactly the provider's `prompt_tokens` (`input_tokens`) and its output the
provider's `completion_tokens` (`output_tokens`, reasoning included); only how the prompt splits into kept
and fresh tokens is inferred (see `ASSUMPTIONS`).

Boundary: `convert_trajectories` is pure (parsed files in, records and a report out); `import_mini_swe_agent`
reads and writes files.
"""

from __future__ import annotations

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
    short_hash,
)
from evolving_infra.traces.writer import write_records

FORMATS = ("mini-swe-agent-1", "mini-swe-agent-1.1")

ASSUMPTIONS: tuple[str, ...] = (
    "One agent per trajectory file (id: instance_id, else the file name), one branch, one request per "
    "assistant message whose response reports usage; assistant messages without usage are skipped and counted.",
    "prompt = usage prompt_tokens (or input_tokens); output = completion_tokens (or output_tokens), reasoning "
    "tokens included; an output of 0 is raised to 1 and counted as estimated.",
    "The history is linear (mini-swe-agent only appends messages), so each call's prompt continues the previous "
    "call's. It keeps the previous prompt and answer (an append) when that call generated no reasoning tokens "
    "and the prompt is long enough; after a call with reasoning tokens (not sent back, and generated before "
    "the answer) it keeps only the previous prompt. Keeps larger than the prompt are clamped and counted.",
    "The first call starts from a shared prefix per distinct system message; its tokens are estimated from the "
    "first call's prompt tokens in proportion to the system message's share of the characters sent, the "
    "smallest estimate over the files that share it.",
    "A call is issued at its response's created time (mini-swe-agent-1: extra.response.created; 1.1: also "
    "extra.timestamp or created_at). delay_s = created - previous call's created, i.e. measured from the "
    "previous call's arrival (the timestamps have a one-second resolution and no completion time). Agents "
    "start at their first call's time minus the earliest first call of all files.",
)


@dataclass(frozen=True, slots=True)
class Call:
    """One assistant call of a trajectory."""

    prompt: int
    output: int
    reasoning: int
    time_s: float | None


@dataclass(frozen=True, slots=True)
class Trajectory:
    agent: str
    path: str
    system: str
    system_share: float
    calls: tuple[Call, ...]
    skipped: int


def _dict_or_empty(value: object) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(part.get("text", "")) if isinstance(part, dict) else _text(part) for part in content)
    return ""


def _usage(message: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(usage, response) of an assistant message of either format."""
    extra = _dict_or_empty(message.get("extra"))
    response = _dict_or_empty(extra.get("response"))
    for holder in (response, message, extra):
        usage = holder.get("usage")
        if isinstance(usage, dict):
            return usage, response
    return None, response


def _call(message: dict[str, Any], path: str, line: int) -> Call | None:
    usage, response = _usage(message)
    if usage is None:
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    output = usage.get("completion_tokens", usage.get("output_tokens"))
    details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    reasoning = details.get("reasoning_tokens", 0) if isinstance(details, dict) else 0
    for key, value in (("prompt tokens", prompt), ("completion tokens", output), ("reasoning tokens", reasoning)):
        if _int(value if value is not None else 0) is None:
            raise LogFormatError(path, line, f"usage {key} must be a non-negative integer, got {value!r}")
    if prompt is None or output is None:
        return None
    extra = _dict_or_empty(message.get("extra"))
    time_s = None
    for value in (response.get("created"), extra.get("timestamp"), message.get("created_at"), message.get("created")):
        time_s = parse_time(value)
        if time_s is not None:
            break
    return Call(prompt=prompt, output=output, reasoning=reasoning or 0, time_s=time_s)


def _message_lines(raw: str) -> list[int]:
    """1-based line where each element of the top-level `messages` list starts (for error messages)."""
    lines: list[int] = []
    decoder = json.JSONDecoder()
    start = raw.find('"messages"')
    if start < 0:
        return lines
    i = raw.find("[", start) + 1
    while i > 0:
        while i < len(raw) and raw[i] in " \t\r\n,":
            i += 1
        if i >= len(raw) or raw[i] == "]":
            break
        lines.append(raw.count("\n", 0, i) + 1)
        try:
            _, i = decoder.raw_decode(raw, i)
        except json.JSONDecodeError:
            break
    return lines


def parse_trajectory(raw: str, path: str) -> Trajectory:
    """Check and read one trajectory file's text."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise LogFormatError(path, exc.lineno, f"not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise LogFormatError(path, 1, "a trajectory must be a JSON object")
    fmt = data.get("trajectory_format")
    if fmt not in FORMATS:
        raise LogFormatError(path, 1, f"trajectory_format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise LogFormatError(path, 1, "'messages' must be a list")
    lines = _message_lines(raw)
    calls: list[Call] = []
    skipped = 0
    system = ""
    sent_chars = first_chars = 0
    for i, message in enumerate(messages):
        line = lines[i] if i < len(lines) else 0
        if not isinstance(message, dict):
            raise LogFormatError(path, line, f"message {i} must be an object")
        role = message.get("role")
        is_call = role == "assistant" or message.get("object") == "response"
        if not is_call and not isinstance(role, str):
            raise LogFormatError(path, line, f"message {i} has no role")
        if is_call:
            call = _call(message, path, line)
            if call is None:
                skipped += 1
                continue
            if not calls:
                first_chars = sent_chars
            calls.append(call)
        elif role == "system" and not system:
            system = _text(message.get("content"))
        if role != "exit":
            sent_chars += len(_text(message.get("content")))
    agent = data.get("instance_id") if isinstance(data.get("instance_id"), str) and data.get("instance_id") else None
    name = Path(path).name.removesuffix(".json").removesuffix(".traj")
    share = len(system) / first_chars if first_chars else 0.0
    return Trajectory(agent or name, path, system, share, tuple(calls), skipped)


def convert_trajectories(
    trajectories: Sequence[Trajectory], *, name: str, source: str, workload: str = "mini-swe-agent"
) -> tuple[list[dict[str, Any]], AgentImportReport]:
    """Records of trace format version 1 for parsed trajectories, and a report (see `ASSUMPTIONS`)."""
    report = AgentImportReport(kind=ImportKind.MINI_SWE_AGENT.value, files=len(trajectories))
    builder = TraceBuilder(report, name=name, source=source, notes=" ".join(ASSUMPTIONS))
    used = [t for t in trajectories if t.calls]
    seen: set[str] = set()
    for t in trajectories:
        report.skipped_calls += t.skipped
        if t.agent in seen:
            raise LogFormatError(t.path, 1, f"agent {t.agent!r} appears in two files")
        seen.add(t.agent)
    prefix_of: dict[str, str | None] = {}
    for t in used:
        estimate = int(t.calls[0].prompt * t.system_share)
        if t.system and estimate > 0:
            new_prefix = f"mini-swe-agent:system:{short_hash(t.system)}"
            builder.prefix(new_prefix, estimate)
            prefix_of[t.agent] = new_prefix
        else:
            prefix_of[t.agent] = None
    report.estimated_prefix_tokens = sum(builder.prefix_tokens(p) for p in set(prefix_of.values()) if p)
    times = [t.calls[0].time_s for t in used if t.calls[0].time_s is not None]
    origin = min(times) if times else 0.0
    order = sorted(used, key=lambda t: (t.calls[0].time_s if t.calls[0].time_s is not None else origin, t.agent))
    for t in order:
        first = t.calls[0]
        builder.agent(t.agent, workload, (first.time_s - origin) if first.time_s is not None else 0.0)
        branch = f"{t.agent}.main"
        previous: str | None = None
        for k, call in enumerate(t.calls):
            rid = f"{t.agent}.r{k}"
            report.missing_timestamps += call.time_s is None
            if previous is None:
                prefix = prefix_of[t.agent]
                keep = builder.prefix_tokens(prefix) if prefix else 0
                builder.request(rid, agent=t.agent, branch=branch, prompt=call.prompt, output=call.output,
                                after=[], delay_s=0.0, shared=prefix, keep=keep)  # fmt: skip
            else:
                before = t.calls[k - 1]
                prev_prompt, prev_output = builder.context(previous)
                keep = append_keep(prev_prompt, prev_output, call.prompt, output_sent_back=before.reasoning == 0)
                delay = 0.0
                if call.time_s is not None and before.time_s is not None:
                    delay = call.time_s - before.time_s
                builder.request(rid, agent=t.agent, branch=branch, prompt=call.prompt, output=call.output,
                                after=[previous], delay_s=delay, base=previous, keep=keep)  # fmt: skip
            previous = rid
    return builder.records(), report


def trajectory_files(src: str | os.PathLike[str]) -> list[Path]:
    """The trajectory files of `src`: the file itself, or every `*.traj.json` / `*.traj` under a folder."""
    path = Path(src)
    if path.is_dir():
        return sorted({*path.rglob("*.traj.json"), *path.rglob("*.traj")})
    return [path]


def import_mini_swe_agent(
    src: str | os.PathLike[str], out_path: str | os.PathLike[str], *, workload: str = "mini-swe-agent",
    name: str | None = None,
) -> AgentImportReport:
    """Convert the trajectories at `src` (a file or a folder) and write the trace to `out_path`."""
    files = trajectory_files(src)
    if not files:
        raise LogFormatError(str(src), 0, "no *.traj.json files found")
    parsed = [parse_trajectory(f.read_text(encoding="utf-8"), str(f)) for f in files]
    records, report = convert_trajectories(
        parsed, name=name or f"mini-swe-agent-{Path(src).name}",
        source=f"{len(files)} mini-swe-agent trajectories from {src}, converted by evolving-infra trace import",
        workload=workload,
    )  # fmt: skip
    write_records(records, out_path)
    return report
