"""Load and validate a trace (format version 1): every rule is checked before a `Trace` is returned.

The first broken rule, in file order, raises `TraceError(line, rule, message)`; nothing partial escapes.
Decisions the spec leaves open (documented in docs/traces.md): blank (whitespace-only) lines are skipped but
still counted for line numbers; a gzip file is recognised by its magic bytes, whatever its name; `after`
defaults to `[]` and `delay_s` to 0; `keep` defaults to 0 only when neither `base` nor `shared` is given; an
explicit `null` counts as absent for optional fields; a `base` may name a request of another agent.

Boundary: reading the file is the only I/O; `parse_records` validates records already in memory.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from evolving_infra.core.types import AgentId, BranchId, RequestId
from evolving_infra.traces.errors import Rule, TraceError
from evolving_infra.traces.records import (
    FORMAT_VERSION,
    Agent,
    Branch,
    BranchEnd,
    Header,
    Prefix,
    Relation,
    Request,
    Trace,
)

KINDS = ("header", "prefix", "agent", "request", "branch_end")
_GZIP_MAGIC = b"\x1f\x8b"
_PROGRESS_LINES = 2000


def load_trace(path: str | os.PathLike[str], progress: Callable[[int, int], None] | None = None) -> Trace:
    """Read and validate the trace at `path` (`.jsonl`, or gzip-compressed).

    `progress(bytes_read, file_bytes)` is called every few thousand lines (compressed bytes for gzip).
    """
    source = str(path)
    return parse_records(_read_records(Path(path), source, progress), source=source)


def parse_lines(lines: Iterable[str], source: str | None = None) -> Trace:
    """Validate a trace given as text lines (line numbers count from 1, blank lines included)."""
    return parse_records(_decode_lines(enumerate(lines, start=1), source), source=source)


def parse_records(records: Iterable[tuple[int, object]], source: str | None = None) -> Trace:
    """Validate `(line, record)` pairs in file order; a record should be a JSON object (a Mapping)."""
    builder = _Builder(source)
    for line, record in records:
        builder.add(line, record)
    return builder.finish()


def trace_from_records(records: Iterable[Mapping[str, object]], source: str | None = None) -> Trace:
    """Validate records held in memory; record i (from 0) is reported as line i + 1."""
    return parse_records(enumerate(records, start=1), source=source)


def _read_records(
    path: Path, source: str, progress: Callable[[int, int], None] | None = None
) -> Iterator[tuple[int, object]]:
    size = path.stat().st_size
    raw = path.open("rb")
    gz = raw.read(2) == _GZIP_MAGIC
    raw.seek(0)
    stream = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
    line = 0
    with raw, stream:
        while True:
            if progress is not None and line % _PROGRESS_LINES == 0:
                progress(raw.tell(), size)
            try:
                data = stream.readline()
            except (OSError, EOFError, zlib.error) as exc:
                raise TraceError(line + 1, Rule.UNREADABLE, f"cannot read the compressed file: {exc}", source) from None
            if not data:
                if progress is not None:
                    progress(size, size)
                return
            line += 1
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                message = f"line is not UTF-8 ({exc.reason} at byte {exc.start})"
                raise TraceError(line, Rule.NOT_UTF8, message, source) from None
            yield from _decode_lines([(line, text)], source)


def _decode_lines(lines: Iterable[tuple[int, str]], source: str | None) -> Iterator[tuple[int, object]]:
    for line, text in lines:
        if not text.strip():
            continue
        try:
            yield line, json.loads(text)
        except json.JSONDecodeError as exc:
            message = f"not valid JSON: {exc.msg} (column {exc.colno})"
            raise TraceError(line, Rule.INVALID_JSON, message, source) from None


class _Builder:
    """Accumulates records, checking each against what earlier lines defined."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        self.count = 0
        self.header: Header | None = None
        self.prefixes: dict[str, Prefix] = {}
        self.agents: dict[AgentId, Agent] = {}
        self.requests: list[Request] = []
        self.by_id: dict[RequestId, Request] = {}
        self.branch_agent: dict[BranchId, AgentId] = {}
        self.branch_requests: dict[BranchId, list[RequestId]] = {}
        self.branch_end: dict[BranchId, BranchEnd] = {}
        self.first_branch: dict[AgentId, BranchId] = {}
        self.line = 0
        self.ints: dict[int, int] = {}
        self.floats: dict[float, float] = {}
        """One shared object per distinct `new`, `output_tokens` and `delay_s` value (see `shared_int`)."""

    # -- helpers ---------------------------------------------------------------------------------------
    def fail(self, rule: Rule, message: str) -> TraceError:
        return TraceError(self.line, rule, message, self.source)

    def get(self, rec: Mapping[str, object], key: str, what: str, required: bool = True) -> object:
        value = rec.get(key)
        if value is None and required:
            raise self.fail(Rule.MISSING_FIELD, f"{what} needs field {key!r}")
        return value

    def string(self, rec: Mapping[str, object], key: str, what: str, required: bool = True) -> str | None:
        value = self.get(rec, key, what, required)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(Rule.WRONG_TYPE, f"{what} field {key!r} must be a non-empty string, got {value!r}")
        return value

    def integer(self, rec: Mapping[str, object], key: str, what: str, default: int | None = None) -> int:
        value = self.get(rec, key, what, required=default is None)
        if value is None:
            assert default is not None
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(Rule.NOT_INTEGER, f"{what} field {key!r} must be an integer, got {value!r}")
        return value

    def number(self, rec: Mapping[str, object], key: str, what: str, default: float | None = None) -> float:
        value = self.get(rec, key, what, required=default is None)
        if value is None:
            assert default is not None
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(Rule.NOT_NUMBER, f"{what} field {key!r} must be a finite number, got {value!r}")
        return float(value)

    def shared_int(self, value: int) -> int:
        """`value`, as the one object of its value in this trace: a request's token counts and pauses repeat
        across requests (a few thousand distinct values per hundred thousand requests), and an int or float object
        costs 24 to 32 bytes a request."""
        return self.ints.setdefault(value, value)

    def shared_float(self, value: float) -> float:
        """`value` as the one object of its value (not -0.0, which equals 0.0 but is kept as written)."""
        if value == 0.0 and math.copysign(1.0, value) < 0:
            return value
        return self.floats.setdefault(value, value)

    # -- records ---------------------------------------------------------------------------------------
    def add(self, line: int, record: object) -> None:
        self.line = line
        self.count += 1
        if not isinstance(record, Mapping):
            raise self.fail(Rule.NOT_OBJECT, f"each line must be a JSON object, got {type(record).__name__}")
        kind = record.get("kind")
        if kind is None:
            raise self.fail(Rule.MISSING_KIND, f"record has no 'kind' (one of {', '.join(KINDS)})")
        if kind not in KINDS:
            raise self.fail(Rule.UNKNOWN_KIND, f"unknown kind {kind!r}; known kinds: {', '.join(KINDS)}")
        getattr(self, f"add_{kind}")(record)

    def add_header(self, rec: Mapping[str, object]) -> None:
        if self.count != 1:
            raise self.fail(Rule.HEADER_NOT_FIRST, "a header may only be the first record of the file")
        version = self.integer(rec, "version", "header")
        if version != FORMAT_VERSION:
            message = f"format version {version} is not supported (only {FORMAT_VERSION})"
            raise self.fail(Rule.UNSUPPORTED_VERSION, message)
        texts = {k: self.string(rec, k, "header", required=False) for k in ("name", "source", "notes")}
        self.header = Header(version=version, **texts)

    def add_prefix(self, rec: Mapping[str, object]) -> None:
        name = self.string(rec, "name", "prefix")
        assert name is not None
        if name in self.prefixes:
            first = self.prefixes[name].line
            raise self.fail(Rule.DUPLICATE_PREFIX, f"prefix {name!r} is already defined on line {first}")
        tokens = self.integer(rec, "tokens", f"prefix {name!r}")
        if tokens < 0:
            raise self.fail(Rule.NEGATIVE_TOKENS, f"prefix {name!r} has {tokens} tokens; must be >= 0")
        self.prefixes[name] = Prefix(name=name, tokens=tokens, index=len(self.prefixes), line=self.line)

    def add_agent(self, rec: Mapping[str, object]) -> None:
        agent = AgentId(self.string(rec, "agent", "agent") or "")
        if agent in self.agents:
            first = self.agents[agent].line
            raise self.fail(Rule.DUPLICATE_AGENT, f"agent {agent!r} is already defined on line {first}")
        what = f"agent {agent!r}"
        workload = self.string(rec, "workload", what) or ""
        start_s = self.number(rec, "start_s", what)
        if start_s < 0:
            raise self.fail(Rule.NEGATIVE_START, f"{what} has start_s {start_s}; must be >= 0")
        self.agents[agent] = Agent(agent=agent, workload=workload, start_s=start_s, line=self.line)

    def add_request(self, rec: Mapping[str, object]) -> None:
        rid = RequestId(self.string(rec, "id", "request") or "")
        if rid in self.by_id:
            first = self.by_id[rid].line
            raise self.fail(Rule.DUPLICATE_REQUEST, f"request id {rid!r} is already used on line {first}")
        what = f"request {rid!r}"
        agent = AgentId(self.string(rec, "agent", what) or "")
        if agent not in self.agents:
            raise self.fail(Rule.UNDEFINED_AGENT, f"{what} names agent {agent!r}, which no earlier line defines")
        branch = BranchId(self.string(rec, "branch", what) or "")
        owner = self.branch_agent.get(branch)
        if owner is not None and owner != agent:
            message = f"{what}: branch {branch!r} belongs to agent {owner!r}, not {agent!r}"
            raise self.fail(Rule.BRANCH_OTHER_AGENT, message)
        if branch in self.branch_end:
            end = self.branch_end[branch]
            message = f"{what}: branch {branch!r} already ended on line {end.line}"
            raise self.fail(Rule.REQUEST_AFTER_BRANCH_END, message)
        after = self.after_list(rec, what, agent)
        delay_s = self.number(rec, "delay_s", what, default=0.0)
        if delay_s < 0:
            raise self.fail(Rule.NEGATIVE_DELAY, f"{what} has delay_s {delay_s}; must be >= 0")
        base, shared, keep, new = self.input(rec, what)
        output_tokens = self.integer(rec, "output_tokens", what)
        if output_tokens < 1:
            raise self.fail(Rule.NO_OUTPUT, f"{what} has output_tokens {output_tokens}; must be >= 1")
        relation = self.relation(agent, branch, base, keep)
        request = Request(
            index=len(self.requests), id=rid, agent=agent, branch=branch, after=after,
            delay_s=self.shared_float(delay_s), base=base, shared=shared, keep=keep, new=self.shared_int(new),
            output_tokens=self.shared_int(output_tokens), relation=relation, line=self.line,
        )  # fmt: skip
        self.requests.append(request)
        self.by_id[rid] = request
        self.branch_agent[branch] = agent
        self.branch_requests.setdefault(branch, []).append(rid)
        self.first_branch.setdefault(agent, branch)

    def after_list(self, rec: Mapping[str, object], what: str, agent: AgentId) -> tuple[RequestId, ...]:
        value = rec.get("after")
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(Rule.WRONG_TYPE, f"{what} field 'after' must be a list of request ids, got {value!r}")
        for dep in value:
            earlier = self.by_id.get(RequestId(dep))
            if earlier is None:
                raise self.fail(Rule.UNDEFINED_AFTER, f"{what} waits for {dep!r}, which no earlier line defines")
            if earlier.agent != agent:
                raise self.fail(
                    Rule.AFTER_OTHER_AGENT,
                    f"{what} of agent {agent!r} waits for {dep!r} of agent {earlier.agent!r}; 'after' must name "
                    "requests of the same agent",
                )
        return tuple(RequestId(v) for v in value)

    def input(self, rec: Mapping[str, object], what: str) -> tuple[RequestId | None, str | None, int, int]:
        spec = self.get(rec, "input", what)
        if not isinstance(spec, Mapping):
            raise self.fail(Rule.WRONG_TYPE, f"{what} field 'input' must be an object, got {spec!r}")
        where = f"{what} input"
        base = self.string(spec, "base", where, required=False)
        shared = self.string(spec, "shared", where, required=False)
        if base is not None and shared is not None:
            raise self.fail(Rule.BASE_AND_SHARED, f"{where} has both base {base!r} and shared {shared!r}; give one")
        keep = self.integer(spec, "keep", where, default=None if (base or shared) else 0)
        new = self.integer(spec, "new", where)
        if keep < 0:
            raise self.fail(Rule.NEGATIVE_KEEP, f"{where} has keep {keep}; must be >= 0")
        if new < 0:
            raise self.fail(Rule.NEGATIVE_NEW, f"{where} has new {new}; must be >= 0")
        if base is not None:
            source = self.by_id.get(RequestId(base))
            if source is None:
                raise self.fail(Rule.UNDEFINED_BASE, f"{where} names base {base!r}, which no earlier line defines")
            if keep > source.context_tokens:
                raise self.fail(
                    Rule.KEEP_EXCEEDS_CONTEXT,
                    f"{where} keeps {keep} tokens but base {base!r} has a context of {source.context_tokens} "
                    f"({source.prompt_tokens} prompt + {source.output_tokens} output)",
                )
        elif shared is not None:
            prefix = self.prefixes.get(shared)
            if prefix is None:
                message = f"{where} names prefix {shared!r}, which no earlier line defines"
                raise self.fail(Rule.UNDEFINED_PREFIX, message)
            if keep > prefix.tokens:
                raise self.fail(
                    Rule.KEEP_EXCEEDS_PREFIX,
                    f"{where} keeps {keep} tokens of prefix {shared!r}, which has {prefix.tokens}",
                )
        elif keep != 0:
            raise self.fail(Rule.KEEP_WITHOUT_SOURCE, f"{where} keeps {keep} tokens but names neither base nor shared")
        if keep + new < 1:
            raise self.fail(Rule.EMPTY_PROMPT, f"{where} gives an empty prompt (keep + new = 0); must be >= 1 token")
        return (RequestId(base) if base is not None else None), shared, keep, new

    def relation(self, agent: AgentId, branch: BranchId, base: RequestId | None, keep: int) -> Relation:
        history = self.branch_requests.get(branch)
        if history:
            previous = self.by_id[history[-1]]
            if base == previous.id and keep == previous.context_tokens:
                return Relation.APPEND
            return Relation.REWRITE
        if base is not None and self.by_id[base].agent == agent:
            return Relation.FORK
        if base is None and self.first_branch.get(agent, branch) != branch:
            return Relation.SUB_AGENT
        return Relation.ROOT

    def add_branch_end(self, rec: Mapping[str, object]) -> None:
        branch = BranchId(self.string(rec, "branch", "branch_end") or "")
        after = RequestId(self.string(rec, "after", f"branch_end of {branch!r}") or "")
        if branch not in self.branch_agent:
            raise self.fail(Rule.UNDEFINED_BRANCH, f"branch_end names branch {branch!r}, which no earlier request uses")
        if branch in self.branch_end:
            first = self.branch_end[branch].line
            raise self.fail(Rule.DUPLICATE_BRANCH_END, f"branch {branch!r} already ended on line {first}")
        if after not in self.branch_requests[branch]:
            other = self.by_id.get(after)
            known = "is not defined on an earlier line" if other is None else f"is in branch {other.branch!r}"
            raise self.fail(
                Rule.BRANCH_END_NOT_IN_BRANCH, f"branch_end of {branch!r} names request {after!r}, which {known}"
            )
        self.branch_end[branch] = BranchEnd(branch=branch, after=after, line=self.line)

    def finish(self) -> Trace:
        branches = {
            b: Branch(id=b, agent=self.branch_agent[b], requests=tuple(rids), end=self.branch_end.get(b))
            for b, rids in self.branch_requests.items()
        }
        return Trace(
            header=self.header,
            prefixes=self.prefixes,
            agents=self.agents,
            branches=branches,
            requests=tuple(self.requests),
            branch_ends=tuple(sorted(self.branch_end.values(), key=lambda e: e.line)),
            source=self.source,
        )
