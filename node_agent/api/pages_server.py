"""A standalone process serving a host KV arena to peers: `python -m evolving_infra.node_agent.api.pages_server`.

It fills an arena with emulated pages (`demo_chain(pages, seed)`), optionally starts a Mooncake engine
over it, serves `ReadPages` and `GetTransferEndpoint` (with health and reflection) on 127.0.0.1, prints
one JSON line `{"address", "mooncake_address", "pages", "page_bytes", "seed"}` to stdout, and serves until
its stdin closes. Benchmarks and tests use it as the peer node agent process of the KV data plane.

Boundary: process wiring only.
"""

from __future__ import annotations

import argparse
import json
import sys

from evolving_infra.node_agent.api.pages_service import PagesServicer
from evolving_infra.node_agent.api.server import start_server
from evolving_infra.node_agent.transfer.arena import KvArena
from evolving_infra.node_agent.transfer.content import demo_chain
from evolving_infra.node_agent.transfer.mooncake import MooncakeTransport


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pages_server", description=__doc__.splitlines()[0])
    parser.add_argument("--node", default="peer", help="node id to report")
    parser.add_argument("--pages", type=int, required=True, help="emulated pages to store")
    parser.add_argument("--slots", type=int, default=0, help="arena slots (default: --pages)")
    parser.add_argument("--page-bytes", type=int, required=True, help="bytes per page slot")
    parser.add_argument("--seed", type=int, default=0, help="seed of the page hash chain")
    parser.add_argument("--mooncake", action="store_true", help="also start a Mooncake engine over the arena")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve gRPC on")
    args = parser.parse_args(argv)
    if args.pages < 0 or args.page_bytes < 1:
        parser.error(f"--pages must be >= 0 and --page-bytes >= 1, got {args.pages} and {args.page_bytes}")
    if args.slots and args.slots < args.pages:
        parser.error(f"--slots ({args.slots}) must hold --pages ({args.pages})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    arena = KvArena(args.slots or max(1, args.pages), args.page_bytes)
    for page in demo_chain(args.pages, args.seed):
        arena.store_emulated(page)
    mooncake = MooncakeTransport(arena) if args.mooncake else None
    running = start_server(
        PagesServicer(arena, args.node, mooncake.address if mooncake else None), host=args.host
    )
    info = {
        "address": running.address,
        "mooncake_address": mooncake.address if mooncake else None,
        "pages": args.pages,
        "page_bytes": args.page_bytes,
        "seed": args.seed,
    }
    print(json.dumps(info), flush=True)
    try:
        sys.stdin.read()  # serve until the parent closes our stdin
    except KeyboardInterrupt:
        pass
    running.stop()
    if mooncake is not None:
        mooncake.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
