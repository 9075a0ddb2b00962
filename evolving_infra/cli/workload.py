"""`evolving-infra workload ...`: generate synthetic agent traces (`generate`) and list the kinds (`kinds`).

Boundary: argument parsing and printing; generation lives in `evolving_infra.workloads`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.workloads import KINDS, OverrideError, default_params, describe, generate_with, shapes, write_trace
from evolving_infra.workloads.params import format_value, with_overrides
from evolving_infra.workloads.shape import format_shape
from evolving_infra.workloads.window import format_window, window_shape


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("workload", help="generate synthetic agent workloads as traces")
    actions = parser.add_subparsers(dest="workload_command", metavar="ACTION", required=True)

    gen = actions.add_parser(
        "generate",
        help="write a synthetic trace (.jsonl or .jsonl.gz)",
        description="Generate a synthetic agent trace. Every parameter can be set with --set PATH=VALUE "
        "(see `evolving-infra workload kinds`); VALUE is JSON, and a number given for a distribution sets its mean.",
    )
    gen.add_argument("--kind", required=True, choices=list(KINDS), help="workload kind")
    gen.add_argument("--agents", required=True, type=int, help="number of agents (tasks) to generate, >= 1")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0); same seed, same bytes")
    gen.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a parameter, e.g. --set pause_s.mean=8 or --set putnam.steps.sigma=0.5 (repeatable)",
    )
    gen.add_argument("--shape", action="store_true", help="also print the shape of each workload in the trace")
    gen.add_argument(
        "--closed-loop",
        type=int,
        metavar="N",
        help="also print the shape of the requests a closed loop of N agents issues in --window at fixed latencies "
        "(table D.1's CC figures; no simulation): the paper's scored window",
    )
    gen.add_argument(
        "--window", default="1800:5100", metavar="START:END", help="seconds of --closed-loop (default 1800:5100)"
    )
    gen.add_argument("out", metavar="OUT", help="output file, ending in .jsonl or .jsonl.gz")
    gen.set_defaults(handler=_generate)

    kinds = actions.add_parser("kinds", help="list the workload kinds and their default parameters")
    kinds.add_argument("--kind", choices=list(KINDS), help="only this kind")
    kinds.add_argument("--sources", action="store_true", help="also print where each default comes from")
    kinds.set_defaults(handler=_kinds)


def _parse_overrides(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        path, sep, value = item.partition("=")
        if not sep or not path.strip():
            raise CliError(f"--set {item!r}: expected PATH=VALUE, e.g. pause_s.mean=8", USAGE_ERROR)
        out[path.strip()] = value
    return out


def _generate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if not (out.name.endswith(".jsonl") or out.name.endswith(".jsonl.gz")):
        raise CliError(f"OUT {str(out)!r} must end in .jsonl or .jsonl.gz", USAGE_ERROR)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"OUT {str(out)!r}: directory {str(parent)!r} does not exist", USAGE_ERROR)
    if args.agents < 1:
        raise CliError(f"--agents must be >= 1, got {args.agents}", USAGE_ERROR)
    start, end = _window(args.window)
    if args.closed_loop is not None and (args.closed_loop < 1 or not 0 <= start < end):
        raise CliError(f"--closed-loop {args.closed_loop} --window {args.window!r}: need N >= 1 and 0 <= START < END",
                       USAGE_ERROR)  # fmt: skip
    try:
        params = with_overrides(default_params(args.kind), _parse_overrides(args.overrides))
        records = generate_with(args.kind, args.agents, args.seed, params)
    except OverrideError as exc:
        raise CliError(f"--set {exc}", USAGE_ERROR) from None
    except ValueError as exc:
        raise CliError(f"cannot generate {args.kind!r}: {exc}", USAGE_ERROR) from None
    try:
        count = write_trace(records, out)
    except OSError as exc:
        raise CliError(f"cannot write {str(out)!r}: {exc.strerror or exc}", USAGE_ERROR) from None
    found = shapes(records)
    requests = sum(s.requests for s in found.values())
    branches = sum(s.branches for s in found.values())
    mix = ", ".join(f"{label} {s.agents}" for label, s in found.items())
    size = os.path.getsize(out)
    print(
        f"wrote {out}: kind {args.kind}, seed {args.seed}, {args.agents} agents ({mix}), {branches} branches, "
        f"{requests} requests, {count} records, {size / 1e6:.1f} MB"
    )
    if args.shape:
        for label, s in found.items():
            print(format_shape(label, s))
    if args.closed_loop is not None:
        print(format_window(window_shape(records, args.closed_loop, start, end)))
    return 0


def _window(text: str) -> tuple[float, float]:
    first, _, second = text.partition(":")
    try:
        return float(first), float(second)
    except ValueError:
        raise CliError(f"--window {text!r}: expected START:END in seconds, e.g. 1800:5100", USAGE_ERROR) from None


def _kinds(args: argparse.Namespace) -> int:
    names = [args.kind] if args.kind else list(KINDS)
    for name in names:
        kind = KINDS[name]
        print(f"{name}: {kind.summary}")
        for path, value, source in describe(default_params(name)):
            line = f"  {path} = {format_value(value)}"
            print(f"{line}    # {source}" if args.sources and source else line)
    return 0
