"""`evolving-infra bench engine`: engine steps per second and the cost and accuracy of online fitting.

Three measurements, one run, same machine:
1. decode: a node in decode mode with a running batch of `--batch` requests; steps per wall-clock second;
2. chunked prefill: a node in prefill mode with a queue of 20K-token prompts sharing cached prefixes; steps
   per second and prefilled tokens per second;
3. fitting: a node in collocated mode (the warmup) serves agent-like request chains with 5 % iteration noise
   for `--warmup` simulated seconds; its iteration records are fitted by NNLS (`router.fitting`); printed are
   the fitting time, the fit's own held-out error, and the error of the frozen model on the iterations of
   the next `--horizon` simulated seconds (never seen by the fit).

Boundary: measurement and printing only; everything measured is the pure engine core and fitter.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.itermodel import (
    IterationRecord,
    decode_iteration_time,
    mean_relative_error,
    prefill_iteration_time,
)
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId
from evolving_infra.node_agent.engine import DecodeRequest, EngineCore, IterationKind, PrefillRequest
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.router.fitting import ModelFitter

NODE = NodeId("bench")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("engine", help="engine steps/s, model fitting time and held-out error")
    parser.add_argument("--profile", default="glm-5.2-4xgb300-tp4", help="hardware profile (name or file)")
    parser.add_argument("--batch", type=int, default=64, help="running decode requests (default 64)")
    parser.add_argument("--steps", type=int, default=2000, help="steps timed per engine benchmark")
    parser.add_argument("--warmup", type=float, default=60.0, help="simulated seconds of collocated warmup")
    parser.add_argument("--horizon", type=float, default=120.0, help="simulated seconds scored after warmup")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.set_defaults(handler=_run)


def _pages(tag: str, count: int, parent: int = 0) -> tuple[PageHash, ...]:
    return tuple(chain_hashes((f"{tag}:{i}".encode() for i in range(count)), parent))


def bench_decode(profile: HardwareProfile, batch: int, steps: int) -> dict[str, float]:
    engine = EngineCore(NODE, profile, NodeMode.DECODE, BranchCountEviction())
    prompt = 4096
    # Long enough that no request finishes during the timed steps, small enough that all fit in GPU memory.
    output = int(steps * profile.decode.t_acc) + 2 * profile.page_tokens
    for i in range(batch):
        rid = RequestId(f"d{i}")
        pages = _pages(rid, prompt // profile.page_tokens)
        engine.submit_decode(DecodeRequest(rid, BranchId(rid), pages, prompt, output_tokens=output), 0.0)
    now = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        out = engine.step(now)
        if out.record is None or out.record.decode_batch != batch:
            raise RuntimeError(f"decode batch is not {batch} requests at step {_}: {out.kind}")
        now = out.end
    wall = time.perf_counter() - start
    return {"steps_per_s": steps / wall, "batch": float(batch), "sim_iteration_ms": (now / steps) * 1e3}


def bench_prefill(profile: HardwareProfile, steps: int) -> dict[str, float]:
    engine = EngineCore(NODE, profile, NodeMode.PREFILL, BranchCountEviction())
    p = profile.page_tokens
    system = _pages("system", 16384 // p)
    now = 0.0
    done = tokens = 0
    start = time.perf_counter()
    submitted = 0
    while done < steps:
        while engine.gauges().prefill_queued < 4:
            rid = RequestId(f"p{submitted}")
            fresh = _pages(rid, (20480 - 16384) // p, system[-1])
            engine.submit_prefill(PrefillRequest(rid, BranchId(rid), system + fresh, 20480 + 17), now)
            submitted += 1
        out = engine.step(now)
        if out.record is not None:
            tokens += sum(item.t_uc for item in out.record.prefill)
        now = out.end
        done += 1
    wall = time.perf_counter() - start
    return {"steps_per_s": steps / wall, "prefill_tokens_per_s": tokens / wall}


@dataclass
class _Chain:
    branch: BranchId
    pages: tuple[PageHash, ...]
    next_at: float
    turn: int = 0


def bench_fitting(profile: HardwareProfile, warmup: float, horizon: float, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    engine = EngineCore(NODE, profile, NodeMode.COLLOCATED, BranchCountEviction(), noise=0.05, rng=rng)
    decode = profile.decode
    fitter = ModelFitter(NODE, decode.k, decode.experts, decode.t_fwd)
    p = profile.page_tokens
    system = _pages("system", 8192 // p)
    chains = [_Chain(BranchId(f"a{i}"), system, rng.uniform(0, 5)) for i in range(24)]
    later: list[IterationRecord] = []
    now = 0.0
    while now < warmup + horizon:
        for chain in chains:
            if chain.next_at <= now and len(chain.pages) * p < 120_000:
                new_pages = rng.randint(8, 96)
                pages = chain.pages + _pages(f"{chain.branch}:{chain.turn}", new_pages, chain.pages[-1])
                rid = RequestId(f"{chain.branch}.{chain.turn}")
                out_tokens = rng.randint(32, 600)
                engine.submit_prefill(
                    PrefillRequest(rid, chain.branch, pages, len(pages) * p + 5, output_tokens=out_tokens), now
                )
                chain.pages, chain.turn, chain.next_at = pages, chain.turn + 1, now + rng.uniform(2, 12)
        out = engine.step(now)
        if out.kind is IterationKind.IDLE:
            now = min(c.next_at for c in chains)
            continue
        if out.record is not None:
            (fitter.observe if now < warmup else later.append)(out.record)
        now = out.end
    start = time.perf_counter()
    model = fitter.freeze()
    fit_s = time.perf_counter() - start
    result = fitter.fit()
    pre = [r for r in later if r.phase is Phase.PREFILL]
    dec = [r for r in later if r.phase is Phase.DECODE]
    prefill_true = profile.prefill.coefficients()
    decode_true = profile.decode.coefficients()
    return {
        "warmup_iterations": float(sum(fitter.samples)),
        "fit_ms": fit_s * 1e3,
        "held_out_error_prefill": result.held_out_error_prefill or float("nan"),
        "held_out_error_decode": result.held_out_error_decode or float("nan"),
        "later_error_prefill": mean_relative_error(
            [model.prefill_iteration_time(r.prefill) for r in pre], [r.duration for r in pre]
        ),
        "later_error_decode": mean_relative_error(
            [model.decode_iteration_time(r.decode_batch) for r in dec], [r.duration for r in dec]
        ),
        "noise_floor_prefill": mean_relative_error(
            [prefill_iteration_time(prefill_true, r.prefill) for r in pre], [r.duration for r in pre]
        ),
        "noise_floor_decode": mean_relative_error(
            [decode_iteration_time(decode_true, r.decode_batch) for r in dec], [r.duration for r in dec]
        ),
        "later_iterations": float(len(later)),
    }


def _run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    console = Console(stderr=True, quiet=args.json)
    with console.status("decode batch..."):
        decode = bench_decode(profile, args.batch, args.steps)
    with console.status("chunked prefill..."):
        prefill = bench_prefill(profile, args.steps)
    with console.status("collocated warmup and fitting..."):
        fitting = bench_fitting(profile, args.warmup, args.horizon, args.seed)
    result = {"profile": profile.name, "decode": decode, "prefill": prefill, "fitting": fitting}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title=f"engine core and fitting ({profile.name})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row(f"decode steps/s (batch {args.batch})", f"{decode['steps_per_s']:,.0f}")
    table.add_row("chunked prefill steps/s (8,192-token chunks)", f"{prefill['steps_per_s']:,.0f}")
    table.add_row("  prefill tokens/s (emulated)", f"{prefill['prefill_tokens_per_s']:,.0f}")
    table.add_row(f"warmup iterations ({args.warmup:g} simulated s)", f"{fitting['warmup_iterations']:,.0f}")
    table.add_row("NNLS fit time (ms)", f"{fitting['fit_ms']:.1f}")
    table.add_row("held-out error prefill / decode (%)",
                  f"{100 * fitting['held_out_error_prefill']:.2f} / {100 * fitting['held_out_error_decode']:.2f}")
    table.add_row(f"error on the next {args.horizon:g} s, prefill / decode (%)",
                  f"{100 * fitting['later_error_prefill']:.2f} / {100 * fitting['later_error_decode']:.2f}")
    table.add_row("  true model on the same iterations (noise floor, %)",
                  f"{100 * fitting['noise_floor_prefill']:.2f} / {100 * fitting['noise_floor_decode']:.2f}")
    Console().print(table)
    return 0
