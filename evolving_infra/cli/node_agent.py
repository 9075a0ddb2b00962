"""`evolving-infra node-agent serve [--settings FILE] [flags]`: run one node agent (emulated engine).

Every setting of `NodeAgentSettings` has a flag generated from the settings model (`--grpc-port`,
`--speed-up`, `--mode` ...; booleans as `--x/--no-x`), plus `--transport` (the transfer kind) and
`--peer NODE=HOST:PORT` (repeatable). Precedence: defaults < `--settings FILE` (YAML) <
`EVOLVING_NODE_*` environment < flags. Once serving it prints one JSON line to stdout with its
addresses (`{"node", "address", "metrics_address", ...}`); logs go to stderr. SIGTERM/SIGINT drain and
exit 0 (see docs/node-agent.md).

Boundary: argument parsing and terminal output; the service is `evolving_infra.node_agent.service`.
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
from evolving_infra.node_agent.api.auth import CredentialsError
from evolving_infra.node_agent.profiles import ProfileError
from evolving_infra.node_agent.service.main import run
from evolving_infra.node_agent.service.settings import NodeAgentSettings, SettingsError, load_settings
from evolving_infra.node_agent.transfer import TransportKind, TransportUnavailable

CUSTOM_FLAGS = {"transfer": "--transport", "peers": "--peer", "peer_networks": "--peer-network"}
"""Settings whose flags are not generated: the transfer section (its kind) and the peer map."""


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _scalar(annotation: Any) -> Any:
    """The non-None member of `X | None`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return members[0]
    return annotation


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, generated from `NodeAgentSettings` (types, choices and help from the model)."""
    for name, info in NodeAgentSettings.model_fields.items():
        if name in CUSTOM_FLAGS:
            continue
        kind = _scalar(info.annotation)
        help_text = (info.description or "").replace("%", "%%")
        if kind is bool:
            parser.add_argument(flag_name(name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            choices = [m.value for m in kind]
            parser.add_argument(flag_name(name), dest=name, choices=choices, default=None, help=help_text)
        else:
            parser.add_argument(flag_name(name), dest=name, type=kind, default=None, help=help_text)
    parser.add_argument(
        "--transport", dest="transport", choices=[k.value for k in TransportKind], default=None,
        help="KV transport: grpc (fallback, default) or mooncake-tcp (listens on every interface).",
    )
    parser.add_argument(
        "--peer", dest="peer", action="append", default=None, metavar="NODE=HOST:PORT",
        help="a peer node agent's gRPC address (repeatable).",
    )
    parser.add_argument(
        "--peer-network", dest="peer_network", action="append", default=None, metavar="CIDR",
        help="a network fetch runs' peer addresses may point into (repeatable; replaces the loopback default).",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("node-agent", help="run a node agent (emulated engine, gRPC API, metrics)")
    actions = parser.add_subparsers(dest="node_agent_command", metavar="ACTION", required=True)
    serve = actions.add_parser("serve", help="serve one node until SIGTERM/SIGINT (then drain and exit 0)")
    serve.add_argument("--settings", type=Path, default=None, metavar="FILE", help="YAML settings file")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level")
    add_settings_flags(serve)
    serve.set_defaults(handler=_serve)


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Settings overrides from parsed flags (unset flags are left out)."""
    flags: dict[str, Any] = {
        name: getattr(args, name)
        for name in NodeAgentSettings.model_fields
        if name not in CUSTOM_FLAGS and getattr(args, name, None) is not None
    }
    if args.transport is not None:
        flags["transfer"] = {"kind": args.transport}
    if args.peer:
        flags["peers"] = parse_addresses(args.peer, "--peer", "NODE")
    if args.peer_network:
        flags["peer_networks"] = list(args.peer_network)
    return flags


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(args.settings, flags_from_args(args))
    except SettingsError as exc:
        raise CliError(f"invalid node agent settings: {exc}", USAGE_ERROR) from exc

    def ready(info: dict[str, Any]) -> None:
        print(json.dumps(info), flush=True)

    try:
        return run(settings, ready)
    except ProfileError as exc:
        raise CliError(f"hardware profile: {exc}", USAGE_ERROR) from exc
    except TransportUnavailable as exc:
        raise CliError(f"transport {settings.transfer.kind.value}: {exc} (or use --transport grpc)", 1) from exc
    except CredentialsError as exc:
        raise CliError(f"credentials: {exc}", USAGE_ERROR) from exc
    except OSError as exc:
        raise CliError(f"cannot serve on {settings.host}: {exc}", 1) from exc
