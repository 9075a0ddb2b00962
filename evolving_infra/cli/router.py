"""`evolving-infra router serve [--settings FILE] [flags]`: run the live router (HTTP front end, router core,
node agent clients, planner).

Every scalar setting of `RouterSettings` has a flag generated from the settings model (`--port`, `--planner`,
`--prefill-routing`, `--applier` ...; booleans as `--x/--no-x`), plus `--node ID=HOST:PORT` (repeatable).
Precedence: defaults < `--settings FILE` (YAML) < `EVOLVING_ROUTER_*` environment < flags. The hardware
profile named by `profile` gives the models' shape and coefficients (`shape_from_profile`). Once serving it
prints one JSON line with its URL (`{"url", "metrics_url", ...}`); logs go to stderr. SIGTERM/SIGINT shut
it down gracefully.

Boundary: argument parsing, profile loading and terminal output; the service is `evolving_infra.router.service`.
"""

from __future__ import annotations

import argparse
import enum
import json
import logging
import sys
import types
import typing
from pathlib import Path
from typing import Any

from evolving_infra.cli.args import parse_addresses
from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.node_agent.profiles import ProfileError, load_profile
from evolving_infra.router.service import ModelShape, RouterSettings, SettingsError, load_settings
from evolving_infra.router.http.security import ApiKeyFileError, ApiKeys
from evolving_infra.router.service.client import CredentialsError, load_node_credentials
from evolving_infra.router.service.main import run
from evolving_infra.sim.models import shape_of

SKIPPED = {"nodes", "planner_settings", "routing_settings"}
"""Settings without a generated flag: mappings (the node map has `--node`; the others come from the file)."""


def shape_from_profile(profile: HardwareProfile) -> ModelShape:
    """The router's view of a hardware profile (the simulator builds the same one)."""
    return shape_of(profile)


def _scalar(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("router", help="run the live router (OpenAI-compatible HTTP, routing core, planner)")
    actions = parser.add_subparsers(dest="router_command", metavar="ACTION", required=True)
    serve = actions.add_parser("serve", help="serve until SIGTERM/SIGINT (then shut down gracefully)")
    serve.add_argument("--settings", type=Path, default=None, metavar="FILE", help="YAML settings file")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level")
    serve.add_argument("--node", action="append", default=None, metavar="ID=HOST:PORT", help="a node agent (repeatable)")
    for name, info in RouterSettings.model_fields.items():
        if name in SKIPPED:
            continue
        kind = _scalar(info.annotation)
        flag = "--" + name.replace("_", "-")
        text = (info.description or "").replace("%", "%%")
        if kind is bool:
            serve.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            serve.add_argument(flag, dest=name, choices=[m.value for m in kind], default=None, help=text)
        else:
            serve.add_argument(flag, dest=name, type=kind, default=None, help=text)
    serve.set_defaults(handler=_serve)


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    flags = {n: getattr(args, n) for n in RouterSettings.model_fields if n not in SKIPPED and getattr(args, n, None) is not None}
    if args.node:
        flags["nodes"] = parse_addresses(args.node, "--node", "ID")
    return flags


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(args.settings, flags_from_args(args))
    except SettingsError as exc:
        raise CliError(f"invalid router settings: {exc}", USAGE_ERROR) from exc
    try:
        shape = shape_from_profile(load_profile(settings.profile))
    except ProfileError as exc:
        raise CliError(f"hardware profile: {exc}", USAGE_ERROR) from exc

    def ready(info: dict[str, Any]) -> None:
        print(json.dumps(info), flush=True)

    if settings.api_key_file is None and not settings.insecure:
        raise CliError("no API keys: give --api-key-file FILE, or --insecure to serve without keys (local runs only)", USAGE_ERROR)
    try:  # fail fast, before connecting to any node
        if settings.api_key_file is not None:
            ApiKeys.load(settings.api_key_file)
        load_node_credentials(settings.cluster_token_file, settings.tls_cert_file, settings.tls_key_file,
                              settings.tls_ca_file, settings.insecure)  # fmt: skip
    except (CredentialsError, ApiKeyFileError) as exc:
        raise CliError(f"credentials: {exc}", USAGE_ERROR) from exc
    try:
        return run(settings, shape, ready)
    except (CredentialsError, ApiKeyFileError) as exc:
        raise CliError(f"credentials: {exc}", USAGE_ERROR) from exc
    except OSError as exc:
        raise CliError(f"cannot serve on {settings.host}:{settings.port}: {exc}", 1) from exc
