"""`evolving-infra profile ...`: list the built-in hardware profiles, show one, validate a profile file.

A profile that does not load (unknown name, bad syntax, an invalid field) ends with `error: <file>: field
'<name>': <reason>` and exit status 2.
Boundary: argument parsing and terminal output only; loading and validation live in
`evolving_infra.node_agent.profiles`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.node_agent.profiles import ProfileError, builtin_profiles, load_profile, profile_to_data


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("profile", help="hardware profiles: coefficients and capacities of a node type")
    actions = parser.add_subparsers(dest="profile_command", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="list the built-in profiles")
    listing.add_argument("--json", action="store_true", help="print the names as a JSON list")
    listing.set_defaults(handler=_list)

    show = actions.add_parser("show", help="print a profile: every number and where it comes from")
    show.add_argument("profile", metavar="NAME_OR_PATH", help="a built-in name or a .yaml/.yml/.json file")
    show.add_argument("--json", action="store_true", help="print the profile as JSON only")
    show.set_defaults(handler=_show)

    validate = actions.add_parser("validate", help="check a profile file; exit 2 naming the invalid field")
    validate.add_argument("file", help="profile file (.yaml, .yml or .json)")
    validate.set_defaults(handler=_validate)


def _load(name_or_path: str) -> HardwareProfile:
    try:
        return load_profile(name_or_path)
    except ProfileError as exc:
        raise CliError(str(exc), USAGE_ERROR) from exc


def _list(args: argparse.Namespace) -> int:
    names = builtin_profiles()
    if args.json:
        print(json.dumps(names))
        return 0
    table = Table(title="built-in hardware profiles")
    table.add_column("name", no_wrap=True, min_width=max(map(len, names), default=4))
    for column in ("gpu", "model", "parallelism"):
        table.add_column(column)
    for name in names:
        profile = load_profile(name)
        table.add_row(name, f"{profile.gpus_per_node}x {profile.gpu}", profile.model, profile.parallelism)
    Console().print(table)
    return 0


def _show(args: argparse.Namespace) -> int:
    profile = _load(args.profile)
    if args.json:
        print(json.dumps(profile_to_data(profile), indent=2))
        return 0
    console = Console()
    console.print(f"[bold]{profile.name}[/bold]: {profile.model} on {profile.gpus_per_node}x {profile.gpu}, "
                  f"{profile.parallelism}")  # fmt: skip
    if profile.description:
        console.print(profile.description)
    table = Table()
    table.add_column("field", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("source")
    data = profile_to_data(profile)
    for name in HardwareProfile.numeric_fields():
        table.add_row(name, _format(_lookup(data, name)), profile.sources.get(name, "[red]no source given[/red]"))
    console.print(table)
    console.print(
        f"decode iteration: {profile.decode_time(8) * 1e3:.1f} ms at 8 running requests, "
        f"{profile.decode_time(64) * 1e3:.1f} ms at 64",
        soft_wrap=True,
    )
    return 0


def _validate(args: argparse.Namespace) -> int:
    profile = _load(args.file)
    missing = [name for name in HardwareProfile.numeric_fields() if name not in profile.sources]
    print(f"ok: {args.file} is a valid profile ({profile.name})")
    if missing:
        print(f"note: no source given for {', '.join(missing)}")
    return 0


def _lookup(data: dict[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        value = value[part]
    return value


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        shown = [_format(v) for v in value]
        if len(shown) > 4:  # keep the table's columns readable
            shown = [*shown[:2], "...", shown[-1]]
        return f"[{', '.join(shown)}] ({len(value)})"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value != 0 and not 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"
