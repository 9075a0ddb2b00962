"""`evolving-infra fleet status`: the fleet's partitions as a table (split, adapting, load, queueing imbalance).

Reads every selected AgentServingCluster (files with `--partitions`, or the cluster with
`--cluster-labels`); `--metrics` also reads each partition router's metrics (in flight, queued) so the
load and queueing imbalance columns fill in; `--gateway URL` shows a running gateway's `/fleet` view
instead (its bound users and requests in flight too). `--json` prints the view as JSON.

Boundary: argument parsing and terminal output; the view is `evolving_infra.fleet.status`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import aiohttp

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.cli.gateway import add_source_arguments, make_source
from evolving_infra.fleet.partitions import FleetFileError
from evolving_infra.fleet.source import fetch_router_loads
from evolving_infra.fleet.status import fleet_view, partition_row, render_table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("fleet", help="a fleet of partitions (AgentServingClusters): status")
    actions = parser.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)
    status = actions.add_parser("status", help="a table of partitions: split, adapting, load, queueing imbalance")
    status.add_argument("--gateway", metavar="URL", help="show a running gateway's /fleet view instead")
    status.add_argument("--metrics", action="store_true", help="read each partition router's metrics (load, queues)")
    status.add_argument("--timeout-s", type=float, default=5.0, help="per request, with --metrics or --gateway")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_source_arguments(status, required=False)
    status.set_defaults(handler=_status)


async def _from_gateway(url: str, timeout_s: float, as_json: bool) -> str:
    fmt = "" if as_json else "?format=table"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url.rstrip("/") + "/fleet" + fmt, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                text = await r.text()
                if r.status != 200:
                    raise CliError(f"{url}/fleet answered {r.status}: {text[:500]}")
                return text
    except aiohttp.ClientError as exc:
        raise CliError(f"cannot reach the gateway at {url}: {exc}") from None


async def _from_partitions(args: argparse.Namespace) -> str:
    source = make_source(args)
    try:
        parts = await source.load()
    finally:
        source.close()
    loads: dict[str, Any] = {}
    if args.metrics:
        async with aiohttp.ClientSession() as session:
            loads = await fetch_router_loads(parts, session, args.timeout_s)
    view = fleet_view([partition_row(p, router=loads.get(p.key)) for p in parts])
    return json.dumps(view.to_json(), indent=2) + "\n" if args.json else render_table(view) + "\n"


def _status(args: argparse.Namespace) -> int:
    if args.gateway:
        if args.partitions or args.cluster_labels:
            raise CliError("give --gateway or a partition source, not both", USAGE_ERROR)
        out = asyncio.run(_from_gateway(args.gateway, args.timeout_s, args.json))
    else:
        if not args.partitions and not args.cluster_labels:
            raise CliError("give --partitions FILE_OR_DIR, --cluster-labels KEY=VALUE or --gateway URL", USAGE_ERROR)
        try:
            out = asyncio.run(_from_partitions(args))
        except FleetFileError as exc:
            raise CliError(f"the partitions cannot be used:\n{exc}", USAGE_ERROR) from None
    sys.stdout.write(out)
    return 0
