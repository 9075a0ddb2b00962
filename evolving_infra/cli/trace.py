"""`evolving-infra trace ...`: validate a trace, print its statistics, import other trace formats.

Bad input (a broken trace, an unreadable file, a bad flag value) ends with `error: ...` and exit status 2.
Boundary: argument parsing and terminal output only; the work is done by `evolving_infra.traces`.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.cli.trace_agents import register_agent_imports, register_transforms
from evolving_infra.core.pages import DEFAULT_PAGE_TOKENS
from evolving_infra.traces.content import ContentModel, ProgressFn
from evolving_infra.traces.errors import TraceError
from evolving_infra.traces.loader import load_trace
from evolving_infra.traces.mooncake import ASSUMPTIONS, MooncakeError, import_mooncake
from evolving_infra.traces.mooncake_export import EXPORT_ASSUMPTIONS, BlockTokens, export_mooncake
from evolving_infra.traces.records import Trace
from evolving_infra.traces.stats import Counts, TraceStats, ideal_hit_tokens_from_pages, trace_stats


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("trace", help="validate, summarize and import agent traces")
    actions = parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    validate = actions.add_parser("validate", help="check a trace against the format (version 1)")
    validate.add_argument("file", help="trace file (.jsonl or .jsonl.gz)")
    validate.set_defaults(handler=_validate)

    stats = actions.add_parser("stats", help="counts per workload and the ideal KV hit rate h*")
    stats.add_argument("file", help="trace file (.jsonl or .jsonl.gz)")
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON only")
    stats.add_argument(
        "--page-tokens",
        default=str(DEFAULT_PAGE_TOKENS),
        metavar="N",
        help=f"tokens per KV page (a positive integer; default {DEFAULT_PAGE_TOKENS})",
    )
    stats.add_argument(
        "--check-pages",
        action="store_true",
        help="also hash every page with the content model and check that it gives the same h*",
    )
    stats.set_defaults(handler=_stats)

    imports = actions.add_parser("import", help="convert another trace format into this one")
    formats = imports.add_subparsers(dest="import_format", metavar="FORMAT", required=True)
    epilog = "assumptions:\n" + "\n".join(
        textwrap.fill(a, width=100, initial_indent="  - ", subsequent_indent="    ") for a in ASSUMPTIONS
    )
    mooncake = formats.add_parser(
        "mooncake",
        help="Mooncake request traces (timestamp, input_length, output_length, hash_ids)",
        description="Rebuild conversations of a Mooncake trace from its hash_ids prefix chains.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mooncake.add_argument("input", help="Mooncake .jsonl file")
    mooncake.add_argument("output", help="trace to write (.jsonl, or .jsonl.gz to compress)")
    mooncake.add_argument("--workload", default="mooncake", help="workload label of every agent (default: mooncake)")
    mooncake.add_argument("--prefix-name", default="mooncake:shared", help="name of the shared prefix record")
    mooncake.add_argument("--name", default=None, help="trace name in the header (default: mooncake-<input stem>)")
    mooncake.add_argument(
        "--extend-to-context",
        action="store_true",
        help="a row that shares all of its base's full blocks and is at least as long as the base's context "
        "keeps the whole context (an append) instead of only the shared blocks",
    )
    mooncake.add_argument("--json", action="store_true", help="print the import report as JSON only")
    mooncake.set_defaults(handler=_import_mooncake)
    register_agent_imports(formats)
    _register_export(actions)
    register_transforms(actions)


def _load(path: str, progress: ProgressFn | None = None) -> Trace:
    try:
        return load_trace(path, progress)
    except TraceError as exc:
        raise CliError(f"{path}:{exc.line}: [{exc.rule.value}] {exc.message}", USAGE_ERROR) from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", USAGE_ERROR) from None


def _summary(trace: Trace) -> str:
    n_prefixes = len(trace.prefixes)
    return (
        f"{len(trace.requests):,} requests, {len(trace.agents):,} agents, {len(trace.branches):,} branches, "
        f"{n_prefixes} prefix{'es' if n_prefixes != 1 else ''}, {len(trace.branch_ends):,} branch ends"
    )


def _validate(args: argparse.Namespace) -> int:
    trace = _load(args.file)
    print(f"OK {args.file}: {_summary(trace)} (format version 1)")
    return 0


def _page_tokens(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        message = f"--page-tokens must be a positive integer number of tokens per KV page, got {text!r}"
        raise CliError(message, USAGE_ERROR)
    return value


@contextmanager
def _progress(enabled: bool) -> Iterator[Progress | None]:
    """A transient progress display on stderr (shown only on a terminal, and only while work lasts)."""
    if not enabled:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        yield progress


def _tracker(progress: Progress | None, label: str) -> ProgressFn | None:
    if progress is None:
        return None
    task = progress.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return update


def _stats(args: argparse.Namespace) -> int:
    page_tokens = _page_tokens(args.page_tokens)
    with _progress(not args.json) as progress:
        trace = _load(args.file, _tracker(progress, "loading"))
        stats = trace_stats(trace, page_tokens)
        if args.check_pages:
            model = ContentModel(trace, page_tokens, progress=_tracker(progress, "hashing pages"))
            by_pages = int(ideal_hit_tokens_from_pages(model, _tracker(progress, "matching pages")).sum())
    if args.check_pages and by_pages != stats.ideal_hit_tokens:
        raise CliError(
            f"the content model's page hashes give {by_pages:,} ideal hit tokens but the trace structure gives "
            f"{stats.ideal_hit_tokens:,}; this is a bug, please report it with the trace"
        )
    if args.json:
        print(json.dumps(stats.to_dict(), indent=2))
        return 0
    console = Console()
    console.print(_stats_table(stats, args.file))
    if args.check_pages:
        console.print(
            f"page check: the content model's page hashes agree ({by_pages:,} hit tokens; "
            f"{model.memory_bytes() / 2**20:,.1f} MiB of page hashes)"
        )
    return 0


_ROWS: tuple[tuple[str, str], ...] = (
    ("agents", "agents"),
    ("branches", "branches"),
    ("requests", "requests"),
    ("  first of agent (root)", "roots"),
    ("  append", "appends"),
    ("  fork", "forks"),
    ("  sub-agent", "sub_agents"),
    ("  compaction / rewrite", "compactions"),
    ("prompt tokens", "prompt_tokens"),
    ("output tokens", "output_tokens"),
    ("mean prompt / request", "mean_prompt_tokens"),
    ("mean output / request", "mean_output_tokens"),
    ("mean delay_s / request", "mean_delay_s"),
    ("ideal KV hit rate h*", "ideal_hit_rate"),
)


def _cell(counts: Counts, key: str) -> str:
    value = getattr(counts, key)
    if key == "ideal_hit_rate":
        return f"{value:.3f}"
    if key == "mean_delay_s":
        return f"{value:,.2f}"
    if isinstance(value, float):
        return f"{value:,.0f}"
    return f"{value:,}"


def _stats_table(stats: TraceStats, path: str) -> Table:
    title = f"{stats.name or Path(path).name}: {stats.page_tokens}-token pages"
    caption = (
        f"{stats.prefixes} shared prefix{'es' if stats.prefixes != 1 else ''} ({stats.prefix_tokens:,} tokens); "
        f"last agent start {stats.last_start_s:,.1f} s; h* with an unlimited cache"
    )
    table = Table(title=title, caption=caption)
    table.add_column("")
    table.add_column("all", justify="right", style="bold")
    workloads = list(stats.by_workload.items()) if len(stats.by_workload) > 1 else []
    for name, _ in workloads:
        table.add_column(name, justify="right")
    for label, key in _ROWS:
        table.add_row(label, _cell(stats, key), *(_cell(c, key) for _, c in workloads))
    return table


def _import_mooncake(args: argparse.Namespace) -> int:
    try:
        report = import_mooncake(
            args.input,
            args.output,
            workload=args.workload,
            prefix_name=args.prefix_name,
            extend_to_context=args.extend_to_context,
            name=args.name,
        )
    except MooncakeError as exc:
        raise CliError(f"{args.input}:{exc.line}: {exc.message}", USAGE_ERROR) from None
    except OSError as exc:
        raise CliError(f"cannot convert {args.input} to {args.output}: {exc.strerror or exc}", USAGE_ERROR) from None
    trace = _load(args.output)  # the written file must pass its own validator
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    table = Table(title=f"Mooncake import: {args.input} -> {args.output}", show_header=False)
    table.add_column("")
    table.add_column("", justify="right")
    for key, value in report.to_dict().items():
        shown = f"{value:.3f}" if isinstance(value, float) else (f"{value:,}" if isinstance(value, int) else value)
        table.add_row(key.replace("_", " "), str(shown))
    console = Console()
    console.print(table)
    console.print(f"OK {args.output}: {_summary(trace)}; next: evolving-infra trace stats {args.output}")
    return 0


def _register_export(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    exports = actions.add_parser("export", help="convert a trace into another format")
    formats = exports.add_subparsers(dest="export_format", metavar="FORMAT", required=True)
    epilog = "assumptions:\n" + "\n".join(
        textwrap.fill(a, width=100, initial_indent="  - ", subsequent_indent="    ") for a in EXPORT_ASSUMPTIONS
    )
    mooncake = formats.add_parser(
        "mooncake",
        help="Mooncake request rows (timestamp, input_length, output_length, hash_ids, session_id, delay)",
        description="Write one Mooncake row per request, e.g. for Dynamo's trace replay.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mooncake.add_argument("input", help="trace file (.jsonl or .jsonl.gz)")
    mooncake.add_argument("output", help="Mooncake .jsonl file to write")
    mooncake.add_argument(
        "--block-tokens", type=int, choices=[b.value for b in BlockTokens], default=BlockTokens.MOONCAKE.value,
        help="tokens per hash id (512: Mooncake's public traces; 64: engine KV pages); default 512",
    )  # fmt: skip
    mooncake.add_argument(
        "--service-s", type=float, default=0.0, metavar="S",
        help="service time assumed per request for the open-loop timestamps (default 0)",
    )  # fmt: skip
    mooncake.add_argument("--json", action="store_true", help="print the export report as JSON only")
    mooncake.set_defaults(handler=_export_mooncake)


def _export_mooncake(args: argparse.Namespace) -> int:
    if args.service_s < 0:
        raise CliError(f"--service-s must be >= 0, got {args.service_s}", USAGE_ERROR)
    try:
        report = export_mooncake(args.input, args.output, block_tokens=args.block_tokens, service_s=args.service_s)
    except TraceError as exc:
        raise CliError(f"{args.input}:{exc.line}: [{exc.rule.value}] {exc.message}", USAGE_ERROR) from None
    except OSError as exc:
        raise CliError(f"cannot export {args.input} to {args.output}: {exc.strerror or exc}", USAGE_ERROR) from None
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    print(
        f"OK {args.output}: {report.rows:,} rows, {report.sessions:,} sessions, {report.distinct_blocks:,} distinct "
        f"{report.block_tokens}-token blocks, {report.cross_branch_waits:,} cross-branch waits estimated"
    )
    return 0
