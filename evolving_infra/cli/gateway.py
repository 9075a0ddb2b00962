"""`evolving-infra gateway serve`: the fleet's global router (docs/gateway.md).

Partitions come from AgentServingCluster files (`--partitions FILE_OR_DIR`, repeatable; local runs) or
from the cluster (`--cluster-labels key=value[,key=value]`, optionally `--namespace`), read with the pod's
service account or the kubeconfig. Serves until SIGINT/SIGTERM.

Boundary: argument parsing and the process lifecycle; the work is in `evolving_infra.gateway`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from pydantic import ValidationError

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.fleet.partitions import FleetFileError
from evolving_infra.fleet.source import FileSource, KubeSource, PartitionSource

log = logging.getLogger(__name__)


def parse_labels(text: str) -> dict[str, str]:
    """`key=value[,key=value...]` into a mapping (an argparse type)."""
    out: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected key=value[,key=value...], got {item!r}")
        out[key.strip()] = value.strip()
    return out


def add_source_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """The partition source flags shared by `gateway serve` and `fleet status`."""
    source = parser.add_mutually_exclusive_group(required=required)
    source.add_argument(
        "--partitions", action="append", type=Path, metavar="FILE_OR_DIR",
        help="AgentServingCluster YAML files or directories (repeatable)",
    )  # fmt: skip
    source.add_argument(
        "--cluster-labels", type=parse_labels, metavar="KEY=VALUE[,...]",
        help="read the AgentServingClusters carrying these labels from the cluster",
    )  # fmt: skip
    parser.add_argument("--namespace", "-n", help="namespace of the AgentServingClusters (default: every namespace)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig instead of the service account or KUBECONFIG")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")


def make_source(args: argparse.Namespace) -> PartitionSource:
    if args.partitions:
        return FileSource(tuple(args.partitions))
    from evolving_infra.operator.kube import KubeApi, NoCredentials, load_client

    try:
        client = load_client(args.kubeconfig, args.context)
    except NoCredentials as exc:
        raise CliError(str(exc)) from exc
    return KubeSource(KubeApi(client, field_manager="evolving-infra-gateway"), args.cluster_labels, args.namespace)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("gateway", help="the fleet's global router over partitions (AgentServingClusters)")
    actions = parser.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)
    serve = actions.add_parser("serve", help="bind users to partitions and forward their requests")
    add_source_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in a pod)")
    serve.add_argument("--port", type=int, default=8080, help="API port")
    serve.add_argument("--admin-port", type=int, default=None, help="port of /metrics, /healthz, /readyz")
    serve.add_argument("--user-header", default="x-evolving-user", help="request header naming the user")
    serve.add_argument("--requirements-header", default="x-evolving-requirements", help="request header with requirements")
    serve.add_argument("--api-key-file", type=Path, help="API keys (name:key per line); the key name is the user")
    serve.add_argument("--key-requirements", type=Path, help="YAML: API key name -> requirements (region=eu,...)")
    serve.add_argument("--load-factor", type=float, default=None, help="bounded-load factor c > 1 (default 1.25)")
    for flag, help_text in (
        ("--refresh-s", "seconds between re-reads of the partition set"),
        ("--health-interval-s", "seconds between readiness probes of the partition routers"),
        ("--retry-after-s", "Retry-After of a 503 when the user's partition is down"),
        ("--user-idle-s", "a user unseen this long is unbound"),
        ("--branch-idle-s", "a branch idle this long loses its pin"),
        ("--request-timeout-s", "longest a forwarded request may take"),
    ):
        serve.add_argument(flag, type=float, default=None, help=help_text)
    serve.add_argument(
        "--upstream", metavar="URL", help="send every request here with its partition header (a Gateway API listener)"
    )
    serve.add_argument("--verbose", "-v", action="store_true", help="log debug messages")
    serve.set_defaults(handler=_serve)

    bench = actions.add_parser("bench", help="measure binding (binds/s, balance, movement) and forwarding overhead")
    bench.add_argument("--users", type=int, default=30_720, help="users to bind (the D.2 fleet: 30,720)")
    bench.add_argument("--partitions", type=int, default=8, help="equal partitions")
    bench.add_argument("--load-factor", type=float, default=1.25, help="bounded-load factor c")
    bench.add_argument("--requests", type=int, default=400, help="completions sent, directly and through the gateway")
    bench.add_argument("--concurrency", type=int, default=8, help="completions in flight at a time")
    bench.add_argument("--json", action="store_true", help="print JSON (the default prints it too, indented)")
    bench.set_defaults(handler=_bench)

    routes = actions.add_parser("httproutes", help="print one Gateway API HTTPRoute per partition (the --upstream setup)")
    add_source_arguments(routes)
    routes.add_argument("--gateway-name", required=True, help="the Gateway (parentRef) the routes attach to")
    routes.add_argument("--gateway-namespace", help="its namespace, if not the partitions' own")
    routes.set_defaults(handler=_httproutes)


def _settings(args: argparse.Namespace) -> object:
    from evolving_infra.gateway.settings import GatewaySettings

    given = {
        "host": args.host,
        "port": args.port,
        "admin_port": args.admin_port,
        "partition_files": tuple(args.partitions or ()),
        "cluster_labels": args.cluster_labels,
        "cluster_namespace": args.namespace,
        "user_header": args.user_header,
        "requirements_header": args.requirements_header,
        "api_key_file": args.api_key_file,
        "key_requirements_file": args.key_requirements,
        "load_factor": args.load_factor,
        "refresh_s": args.refresh_s,
        "health_interval_s": args.health_interval_s,
        "retry_after_s": args.retry_after_s,
        "user_idle_s": args.user_idle_s,
        "branch_idle_s": args.branch_idle_s,
        "request_timeout_s": args.request_timeout_s,
        "upstream_url": args.upstream,
    }
    try:
        return GatewaySettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}" for e in exc.errors())
        raise CliError(f"invalid gateway settings: {problems}", USAGE_ERROR) from None


def _serve(args: argparse.Namespace) -> int:
    from evolving_infra.gateway.server import start_gateway
    from evolving_infra.gateway.settings import GatewaySettings
    from evolving_infra.router.http.security import ApiKeyFileError

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = _settings(args)
    assert isinstance(settings, GatewaySettings)
    source = make_source(args)

    async def main() -> None:
        gateway = await start_gateway(settings, source)
        log.info("gateway on %s (%d partitions from %s)", gateway.url, len(gateway.state.partitions), source.describe())
        if gateway.admin_url:
            log.info("metrics on %s/metrics", gateway.admin_url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await gateway.stop()
            source.close()

    try:
        asyncio.run(main())
    except FleetFileError as exc:
        raise CliError(f"the partitions cannot be used:\n{exc}", USAGE_ERROR) from None
    except (ApiKeyFileError, ValueError) as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    except OSError as exc:
        raise CliError(f"cannot serve on {settings.host}:{settings.port}: {exc}") from None
    return 0


def _httproutes(args: argparse.Namespace) -> int:
    import sys

    import yaml

    from evolving_infra.gateway.httproutes import build_httproutes

    source = make_source(args)
    try:
        partitions = asyncio.run(source.load())
    except FleetFileError as exc:
        raise CliError(f"the partitions cannot be used:\n{exc}", USAGE_ERROR) from None
    finally:
        source.close()
    sys.stdout.write(yaml.safe_dump_all(build_httproutes(partitions, args.gateway_name, args.gateway_namespace), sort_keys=False))
    return 0


def _bench(args: argparse.Namespace) -> int:
    import json
    import sys

    from evolving_infra.gateway.bench import run_bench

    if not (1 <= args.users <= 10_000_000 and 1 <= args.partitions <= 4096 and 1 <= args.requests <= 100_000):
        raise CliError("--users 1..10M, --partitions 1..4096, --requests 1..100k", USAGE_ERROR)
    if not (1 <= args.concurrency <= 256 and args.load_factor > 1):
        raise CliError("--concurrency 1..256 and --load-factor > 1", USAGE_ERROR)
    logging.basicConfig(level=logging.WARNING)
    figures = run_bench(args.users, args.partitions, args.load_factor, args.requests, args.concurrency)
    sys.stdout.write(json.dumps(figures, indent=None if args.json else 2) + "\n")
    return 0
