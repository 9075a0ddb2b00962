"""Agent traces (format version 1, `shared/trace-format.md`): loading, validation, the content model that
gives each prompt its KV page hashes, statistics, and importers of other formats.

Modules: `errors` (Rule, TraceError), `records` (the immutable Trace model), `loader` (load and validate),
`content` (ContentModel: page hashes), `stats` (TraceStats, ideal hit rate h*), `mooncake` (importer),
`miniswe`, `claude_code`, `openai_log` (agent-log importers, with `importing`: their shared builder and
report), `transforms` (scale, merge, slice), `writer` (writing records), `testing` (random valid traces and
hypothesis strategies). See docs/traces.md.

Boundary: pure parsing and computation over records; reading a trace (`load_trace`) and the importer's and
writer's files are the only I/O.
"""

from evolving_infra.traces.content import ContentModel
from evolving_infra.traces.errors import Rule, TraceError
from evolving_infra.traces.loader import load_trace, parse_lines, trace_from_records
from evolving_infra.traces.mooncake import ImportReport, import_mooncake
from evolving_infra.traces.records import Agent, Branch, BranchEnd, Header, Prefix, Relation, Request, Trace
from evolving_infra.traces.stats import TraceStats, trace_stats

__all__ = [
    "Agent",
    "Branch",
    "BranchEnd",
    "ContentModel",
    "Header",
    "ImportReport",
    "Prefix",
    "Relation",
    "Request",
    "Rule",
    "Trace",
    "TraceError",
    "TraceStats",
    "import_mooncake",
    "load_trace",
    "parse_lines",
    "trace_from_records",
    "trace_stats",
]
