"""Shared parts of the agent-log importers (`miniswe`, `claude_code`, `openai_log`): the error that names a
source file and line, the import report, and a builder that turns per-call token figures into trace records.

Invariant of `TraceBuilder.request`: the prompt it writes has exactly the `prompt` tokens the log reported
(`keep + new == prompt`), `keep` never exceeds the source's length, and every clamp it applies is counted;
so an imported trace's prompt tokens always sum to the usage figures of the calls it kept.

Boundary: pure (no I/O); the importers read files and call `write_records`.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from evolving_infra.traces.records import FORMAT_VERSION


class ImportKind(enum.Enum):
    """The agent-log formats `evolving-infra trace import` reads (besides Mooncake)."""

    MINI_SWE_AGENT = "mini-swe-agent"
    CLAUDE_CODE = "claude-code"
    OPENAI_LOG = "openai-log"


class LogFormatError(ValueError):
    """A log breaks the importer's expectations at `path`:`line` (1-based; 0 when no line applies)."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        super().__init__(f"{path}:{line}: {message}")


@dataclass
class AgentImportReport:
    """What an agent-log import did. Every estimate and clamp the importer made is counted here."""

    kind: str
    files: int = 0
    agents: int = 0
    branches: int = 0
    sub_agents: int = 0
    forks: int = 0
    compactions: int = 0
    model_switches: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    prefixes: int = 0
    estimated_prefix_tokens: int = 0
    estimated_outputs: int = 0
    estimated_keeps: int = 0
    clamped_keeps: int = 0
    clamped_delays: int = 0
    missing_timestamps: int = 0
    skipped_calls: int = 0
    missing_sidechains: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Context:
    prompt: int
    output: int

    @property
    def tokens(self) -> int:
        return self.prompt + self.output


class TraceBuilder:
    """Collects prefixes, agents, requests and branch ends, and emits them in an order the loader accepts
    (header, prefixes, then everything else in call order)."""

    def __init__(self, report: AgentImportReport, *, name: str, source: str, notes: str) -> None:
        self.report = report
        self._header = {"kind": "header", "version": FORMAT_VERSION, "name": name, "source": source, "notes": notes}
        self._prefixes: dict[str, int] = {}
        self._body: list[dict[str, Any]] = []
        self._contexts: dict[str, _Context] = {}
        self._agents: set[str] = set()
        self._branches: dict[str, str] = {}

    def prefix(self, name: str, tokens: int) -> None:
        """Define (or shrink to `tokens`) the shared prefix `name`."""
        self._prefixes[name] = min(tokens, self._prefixes.get(name, tokens))

    def prefix_tokens(self, name: str) -> int:
        return self._prefixes[name]

    def agent(self, agent: str, workload: str, start_s: float) -> None:
        self._agents.add(agent)
        self._body.append({"kind": "agent", "agent": agent, "workload": workload, "start_s": start_s})

    def context(self, rid: str) -> tuple[int, int]:
        """(prompt, output) tokens of an emitted request."""
        c = self._contexts[rid]
        return c.prompt, c.output

    def request(
        self,
        rid: str,
        *,
        agent: str,
        branch: str,
        prompt: int,
        output: int,
        after: list[str],
        delay_s: float,
        base: str | None = None,
        keep: int = 0,
        shared: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Emit one call of `prompt` tokens: `keep` of them from `base` (or `shared`), the rest fresh.

        `keep` is clamped to the source and to the prompt; `output < 1` becomes 1; a negative delay becomes
        0 (each counted in the report)."""
        if output < 1:
            output = 1
            self.report.estimated_outputs += 1
        if delay_s < 0:
            delay_s = 0.0
            self.report.clamped_delays += 1
        limit = prompt
        if base is not None:
            limit = min(limit, self._contexts[base].tokens)
        elif shared is not None:
            limit = min(limit, self._prefixes[shared])
        else:
            keep = 0
        if keep > limit:
            keep = limit
            self.report.clamped_keeps += 1
        keep = max(keep, 0)
        spec: dict[str, Any] = {}
        if base is not None:
            spec["base"] = base
        if shared is not None and base is None:
            spec["shared"] = shared
        if spec:
            spec["keep"] = keep
        spec["new"] = prompt - keep
        record = {
            "kind": "request", "id": rid, "agent": agent, "branch": branch, "after": after,
            "delay_s": round(delay_s, 6), "input": spec, "output_tokens": output,
        }  # fmt: skip
        record.update(extra or {})
        self._body.append(record)
        self._contexts[rid] = _Context(prompt, output)
        self._branches.setdefault(branch, agent)
        self.report.requests += 1
        self.report.prompt_tokens += prompt
        self.report.output_tokens += output

    def branch_end(self, branch: str, after: str) -> None:
        self._body.append({"kind": "branch_end", "branch": branch, "after": after})

    def records(self) -> list[dict[str, Any]]:
        self.report.agents = len(self._agents)
        self.report.branches = len(self._branches)
        self.report.prefixes = len(self._prefixes)
        prefixes = [{"kind": "prefix", "name": n, "tokens": t} for n, t in self._prefixes.items()]
        return [self._header, *prefixes, *self._body]


def append_keep(prev_prompt: int, prev_output: int, prompt: int, *, output_sent_back: bool) -> int:
    """What a follow-up prompt of `prompt` tokens keeps of its predecessor's context.

    The whole context when the answer was sent back and fits; only the predecessor's prompt when the answer
    was not sent back as generated (reasoning tokens precede it) or the prompt is shorter than the context."""
    if output_sent_back and prompt >= prev_prompt + prev_output:
        return prev_prompt + prev_output
    return min(prev_prompt, prompt)


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]


def parse_time(value: object) -> float | None:
    """Seconds since the epoch from an ISO 8601 string or a number (seconds, or milliseconds when > 1e11)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) / 1000 if value > 1e11 else float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
