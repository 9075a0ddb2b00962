"""`evolving-infra trace import mini-swe-agent | claude-code | openai-log` and `trace scale | merge | slice`.

Bad input ends with `error: FILE:LINE: message` and exit status 2. Boundary: argument parsing and terminal
output only; the work is done by `evolving_infra.traces` (importers and `transforms`).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.traces import claude_code, miniswe, openai_log
from evolving_infra.traces.errors import TraceError
from evolving_infra.traces.importing import AgentImportReport, ImportKind, LogFormatError
from evolving_infra.traces.loader import load_trace
from evolving_infra.traces.records import Trace

_IMPORTERS: dict[ImportKind, tuple[Callable[..., AgentImportReport], tuple[str, ...], str, str]] = {
    ImportKind.MINI_SWE_AGENT: (
        miniswe.import_mini_swe_agent, miniswe.ASSUMPTIONS,
        "mini-swe-agent trajectories (*.traj.json, formats mini-swe-agent-1 and 1.1)",
        "a .traj.json file or a folder of them",
    ),
    ImportKind.CLAUDE_CODE: (
        claude_code.import_claude_code, claude_code.ASSUMPTIONS,
        "Claude Code session logs (SESSION.jsonl with SESSION/subagents/agent-*.jsonl sidechains)",
        "a Claude Code project folder (~/.claude/projects/<project>) or one SESSION.jsonl",
    ),
    ImportKind.OPENAI_LOG: (
        openai_log.import_openai_log, openai_log.ASSUMPTIONS,
        "a JSONL log of OpenAI-compatible chat/completions requests and responses with usage",
        "the .jsonl log (rows with request, response, optional session_id, start_time, end_time)",
    ),
}  # fmt: skip


def register_agent_imports(formats: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add one `trace import KIND` parser per agent-log format."""
    for kind, (_, assumptions, help_text, src_help) in _IMPORTERS.items():
        epilog = "assumptions:\n" + "\n".join(
            textwrap.fill(a, width=100, initial_indent="  - ", subsequent_indent="    ") for a in assumptions
        )
        parser = formats.add_parser(
            kind.value, help=help_text, description=f"Convert {help_text} into an agent trace.", epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        parser.add_argument("input", help=src_help)
        parser.add_argument("output", help="trace to write (.jsonl, or .jsonl.gz to compress)")
        parser.add_argument("--workload", default=kind.value, help=f"workload label of every agent (default: {kind.value})")
        parser.add_argument("--name", default=None, help="trace name in the header")
        parser.add_argument("--report", action="store_true", help="print the import report (counts, estimates, clamps)")
        parser.add_argument("--json", action="store_true", help="print the import report as JSON only")
        parser.set_defaults(handler=_import_agents, import_kind=kind)


def _import_agents(args: argparse.Namespace) -> int:
    convert = _IMPORTERS[args.import_kind][0]
    try:
        report = convert(args.input, args.output, workload=args.workload, name=args.name)
    except LogFormatError as exc:
        raise CliError(f"{exc.path}:{exc.line}: {exc.message}", USAGE_ERROR) from None
    except OSError as exc:
        raise CliError(f"cannot convert {args.input} to {args.output}: {exc.strerror or exc}", USAGE_ERROR) from None
    trace = _load(args.output)  # the written file must pass the validator
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    console = Console()
    if args.report:
        table = Table(title=f"{report.kind} import: {args.input} -> {args.output}", show_header=False)
        table.add_column("")
        table.add_column("", justify="right")
        for key, value in report.to_dict().items():
            if key not in ("kind", "notes"):
                table.add_row(key.replace("_", " "), f"{value:,}")
        console.print(table)
    console.print(
        f"OK {args.output}: {len(trace.requests):,} requests, {len(trace.agents):,} agents, "
        f"{len(trace.branches):,} branches; next: evolving-infra trace stats {args.output}"
    )
    return 0


def _load(path: str) -> Trace:
    try:
        return load_trace(path)
    except TraceError as exc:
        raise CliError(f"{path}:{exc.line}: [{exc.rule.value}] {exc.message}", USAGE_ERROR) from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", USAGE_ERROR) from None
