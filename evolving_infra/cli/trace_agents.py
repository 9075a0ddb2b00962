"""`evolving-infra trace import mini-swe-agent | claude-code | openai-log` and `trace scale | merge | slice`.

Bad input ends with `error: FILE:LINE: message` and exit status 2. Boundary: argument parsing and terminal
output only; the work is done by `evolving_infra.traces` (importers and `transforms`).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.traces import claude_code, miniswe, openai_log, transforms
from evolving_infra.traces.errors import TraceError
from evolving_infra.traces.importing import AgentImportReport, ImportKind, LogFormatError
from evolving_infra.traces.loader import load_trace
from evolving_infra.traces.records import Trace
from evolving_infra.traces.writer import write_records

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


def register_agent_imports(formats: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    print(
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


def register_transforms(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `trace scale`, `trace merge` and `trace slice`."""
    scale = actions.add_parser("scale", help="replicate every agent with fresh content (named prefixes stay shared)")
    scale.add_argument("input", help="trace file")
    scale.add_argument("output", help="trace to write (.jsonl or .jsonl.gz)")
    scale.add_argument("--copies", type=int, required=True, metavar="K", help="number of copies (>= 1)")
    scale.add_argument("--stagger", type=float, default=0.0, metavar="S", help="copy c starts c*S seconds later")
    scale.set_defaults(handler=_scale)

    merge = actions.add_parser("merge", help="several traces in one run, each keeping (or setting) its workload")
    merge.add_argument("output", help="trace to write (.jsonl or .jsonl.gz)")
    merge.add_argument(
        "inputs", nargs="+", metavar="FILE[=WORKLOAD]",
        help="input traces; '=WORKLOAD' relabels every agent of that input; ids get the prefix 'iN/'",
    )  # fmt: skip
    merge.add_argument("--name", default="merged", help="trace name in the header")
    merge.set_defaults(handler=_merge)

    sliced = actions.add_parser("slice", help="the agents of a start-time range and/or a range of agent positions")
    sliced.add_argument("input", help="trace file")
    sliced.add_argument("output", help="trace to write (.jsonl or .jsonl.gz)")
    sliced.add_argument("--from-s", type=float, default=0.0, help="keep agents starting at or after this time")
    sliced.add_argument("--to-s", type=float, default=float("inf"), help="keep agents starting before this time")
    sliced.add_argument("--agents", default=None, metavar="LO:HI", help="keep agents at positions LO..HI-1 (file order)")
    sliced.add_argument("--keep-time", action="store_true", help="keep start times (default: the first kept agent starts at 0)")
    sliced.set_defaults(handler=_slice)


def _write(records: list[dict[str, Any]], path: str) -> Trace:
    try:
        write_records(records, path)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}", USAGE_ERROR) from None
    return _load(path)


def _scale(args: argparse.Namespace) -> int:
    if args.copies < 1 or args.stagger < 0:
        raise CliError(f"--copies must be >= 1 and --stagger >= 0, got {args.copies} and {args.stagger}", USAGE_ERROR)
    trace = _write(transforms.scale(_load(args.input), args.copies, args.stagger), args.output)
    print(f"OK {args.output}: {len(trace.requests):,} requests, {len(trace.agents):,} agents ({args.copies} copies)")
    return 0


def _merge(args: argparse.Namespace) -> int:
    items = []
    for n, spec in enumerate(args.inputs):
        path, workload = spec, None
        if not Path(spec).exists() and "=" in spec:
            path, workload = spec.rsplit("=", 1)
        items.append(transforms.MergeInput(_load(path), f"i{n}", workload or None))
    trace = _write(transforms.merge(items, name=args.name), args.output)
    workloads = sorted({a.workload for a in trace.agents.values()})
    print(f"OK {args.output}: {len(trace.requests):,} requests, {len(trace.agents):,} agents; workloads {', '.join(workloads)}")
    return 0


def _slice(args: argparse.Namespace) -> int:
    agents = None
    if args.agents is not None:
        try:
            lo, hi = (int(x) for x in args.agents.split(":"))
        except ValueError:
            raise CliError(f"--agents must be LO:HI (two integers), got {args.agents!r}", USAGE_ERROR) from None
        agents = (lo, hi)
    records, report = transforms.slice_trace(
        _load(args.input), from_s=args.from_s, to_s=args.to_s, agents=agents, rebase_time=not args.keep_time
    )
    trace = _write(records, args.output)
    print(f"OK {args.output}: {len(trace.requests):,} requests, {len(trace.agents):,} agents; "
          f"{report.detached} requests lost a base outside the slice (now fresh prompts of the same length)")  # fmt: skip
    return 0
