"""`evolving-infra evaluate peers`: one workload through Dynamo's own replay and through our simulator (its
`dynamo` preset, our re-implementation of Dynamo's KV router at the same split, and our system), TTFT, E2E,
throughput and prefix reuse side by side, differences over 10 % flagged.

Boundary: argument parsing and terminal output; the work is `evolving_infra.peers.judge`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.peers.dynamo_replay import DynamoReplayError, DynamoUnavailable
from evolving_infra.peers.judge import REFERENCE, OurSide, judge_dynamo
from evolving_infra.peers.metrics import DEFAULT_TOLERANCE, ComparisonRow, Figure, render_markdown
from evolving_infra.traces.errors import TraceError
from evolving_infra.traces.mooncake_export import BlockTokens

WORKLOADS = ("cc", "putnam", "osworld", "mixed", "shift")
PROFILE = {"putnam": "glm-5.2-4xgb300-tp4", "cc": "glm-5.2-4xgb300-tp4", "osworld": "kimi-k2.6-4xgb300-tp4"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "peers",
        help="our simulator vs Dynamo's own replay on one workload (needs scripts/peers/setup-dynamo.sh)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--workload", choices=WORKLOADS, help="generate this workload (open loop)")
    p.add_argument("--agents", type=int, default=10, help="agents of the generated workload (default 10)")
    p.add_argument("--trace", help="replay this trace file instead of a generated workload")
    p.add_argument("--split", default="4P5D", help="prefill/decode split of nine nodes (default 4P5D)")
    p.add_argument("--profile", help="hardware profile (default: the paper's for the workload)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--sides", default=",".join(s.value for s in OurSide),
        help=f"our configurations to compare (default {','.join(s.value for s in OurSide)})",
    )  # fmt: skip
    p.add_argument("--block-tokens", type=int, choices=[b.value for b in BlockTokens], default=64)
    p.add_argument("--service-s", type=float, default=0.0, help="service time assumed for cross-branch arrivals")
    p.add_argument("--no-host-offload", action="store_true", help="no host-memory tier in Dynamo's mocker")
    p.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help="closed loop: N agents active on our side, N sessions in Dynamo's replay (needs one branch "
                   "per agent, e.g. putnam; default: open loop)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for Dynamo's replay")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="flag differences above this")
    p.add_argument("--log", help="write Dynamo's log to this file")
    p.add_argument("--out", help="also write the JSON report to this file")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run)

    g = sub.add_parser(
        "smg",
        help="our cache-aware policy vs the real SGLang gateway on one request stream (scripts/peers/setup-smg.sh)",
        description="Replay a request stream through smg (127.0.0.1) in front of workers speaking SGLang's API, "
        "decide each request with our cache-aware policy too, and report the agreement and its causes.",
    )
    g.add_argument("--trace", help="trace file (default: a generated --workload)")
    g.add_argument("--workload", choices=WORKLOADS, default="putnam", help="generated workload (default putnam)")
    g.add_argument("--agents", type=int, default=12, help="agents of the generated workload (default 12)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--requests", type=int, default=200, help="requests to replay (default 200)")
    g.add_argument("--workers", type=int, default=3)
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight at most (default 8)")
    g.add_argument("--balance-abs-threshold", type=int, default=64)
    g.add_argument("--balance-rel-threshold", type=float, default=1.5)
    g.add_argument("--cache-threshold", type=float, default=0.3)
    g.add_argument("--gate", choices=["spill", "global"], default="spill",
                   help="our policy's balance gate: spill (smg 1.13, default) or global (the classic rule)")
    g.add_argument("--smg-defaults", action="store_true",
                   help="keep smg's warm-up slice and backend-reported loads (off by default: the documented rule)")
    g.add_argument("--timeout", type=float, default=300.0)
    g.add_argument("--json", action="store_true")
    g.set_defaults(handler=run_smg)


def _sides(text: str) -> list[OurSide]:
    try:
        return [OurSide(s.strip()) for s in text.split(",") if s.strip()]
    except ValueError:
        raise CliError(f"--sides: unknown side in {text!r}; known: {', '.join(s.value for s in OurSide)}",
                       USAGE_ERROR) from None  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from evolving_infra.sim.run import workload_trace
    from evolving_infra.traces.loader import load_trace

    if (args.trace is None) == (args.workload is None):
        raise CliError("give either --workload KIND or --trace FILE (not both)", USAGE_ERROR)
    if args.agents < 1 or args.timeout <= 0 or args.tolerance < 0 or args.service_s < 0:
        raise CliError("--agents must be >= 1, --timeout > 0, --tolerance and --service-s >= 0", USAGE_ERROR)
    if args.concurrency is not None and args.concurrency < 1:
        raise CliError(f"--concurrency must be >= 1, got {args.concurrency}", USAGE_ERROR)
    sides = _sides(args.sides)
    try:
        trace = workload_trace(args.workload, args.agents, args.seed) if args.workload else load_trace(args.trace)
    except (TraceError, OSError) as exc:
        raise CliError(f"cannot load the trace: {exc}", USAGE_ERROR) from None
    profile = args.profile or PROFILE.get(args.workload or "", "glm-5.2-4xgb300-tp4")
    try:
        report = judge_dynamo(
            trace, profile=profile, split=args.split, sides=sides, seed=args.seed, block_tokens=args.block_tokens,
            service_s=args.service_s, host_offload=not args.no_host_offload, timeout_s=args.timeout,
            tolerance=args.tolerance, log_path=Path(args.log) if args.log else None, concurrency=args.concurrency,
        )  # fmt: skip
    except DynamoUnavailable as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    except DynamoReplayError as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    report["command"] = " ".join(["evolving-infra evaluate peers", *_argv(args)])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    rows = [
        ComparisonRow(Figure(r["figure"]), r["values"], r["differences"], tuple(r["flagged"]))
        for r in report["comparison"]
    ]
    loop = "open loop" if args.concurrency is None else f"closed loop, {args.concurrency} agents"
    print(f"{report['trace']['requests']:,} requests ({report['matched_requests']:,} completed by every side), "
          f"profile {profile}, split {args.split}, {loop}; reference: {REFERENCE}")  # fmt: skip
    print(render_markdown(rows, REFERENCE))
    speed = ", ".join(f"{k} {v['requests_per_wall_s']:,.0f} req/wall-s" for k, v in report["speed"].items())
    print(f"speed: {speed}")
    return 0


def run_smg(args: argparse.Namespace) -> int:
    import asyncio

    from evolving_infra.peers.smg_judge import SmgUnavailable, run_differential
    from evolving_infra.router.routing.cache_aware import BalanceGate, CacheAwareSettings
    from evolving_infra.sim.run import workload_trace
    from evolving_infra.traces.loader import load_trace

    if args.requests < 1 or args.workers < 2 or args.concurrency < 1 or args.timeout <= 0:
        raise CliError("--requests >= 1, --workers >= 2, --concurrency >= 1 and --timeout > 0 please", USAGE_ERROR)
    try:
        settings = CacheAwareSettings(cache_threshold=args.cache_threshold,
                                      balance_abs_threshold=args.balance_abs_threshold,
                                      balance_rel_threshold=args.balance_rel_threshold,
                                      gate=BalanceGate(args.gate))  # fmt: skip
        trace = load_trace(args.trace) if args.trace else workload_trace(args.workload, args.agents, args.seed)
        report = asyncio.run(run_differential(
            trace, workers=args.workers, concurrency=args.concurrency, max_requests=args.requests,
            settings=settings, timeout_s=args.timeout, warmup_slice=args.smg_defaults,
            backend_loads=args.smg_defaults,
        ))  # fmt: skip
    except SmgUnavailable as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    except (TraceError, OSError, ValueError) as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    except TimeoutError as exc:
        raise CliError(f"the gateway differential timed out: {exc}") from None
    data = report.to_dict()
    data["settings"]["gate"] = args.gate
    data["same_loads"] = sum(d.loads == d.gateway_loads for d in report.decisions)
    by_reason: dict[str, list[int]] = {}
    for d in report.decisions:
        by_reason.setdefault(d.reason, [0, 0])[0] += 1
        by_reason[d.reason][1] += d.gateway == d.ours
    data["by_our_reason"] = {k: {"requests": n, "agreements": a} for k, (n, a) in by_reason.items()}
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"{data['requests']} requests, agreement {data['agreement_rate']:.1%}; disagreements by cause: "
          f"{data['causes'] or 'none'}; our load counts equal the gateway's at {data['same_loads']} decisions")
    for reason, v in data["by_our_reason"].items():
        print(f"  our reason {reason}: {v['agreements']}/{v['requests']} agree")
    return 0


def _argv(args: argparse.Namespace) -> list[str]:
    out = [f"--workload {args.workload} --agents {args.agents}" if args.workload else f"--trace {args.trace}"]
    out.append(f"--split {args.split} --seed {args.seed} --sides {args.sides} --block-tokens {args.block_tokens}")
    if args.service_s:
        out.append(f"--service-s {args.service_s:g}")
    if args.no_host_offload:
        out.append("--no-host-offload")
    if args.concurrency is not None:
        out.append(f"--concurrency {args.concurrency}")
    return out
