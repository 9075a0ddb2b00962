"""`evolving-infra bench engine`: engine steps per second and the cost and accuracy of online fitting.

Three measurements, one run, same machine:
1. decode: a node in decode mode with a running batch of `--batch` requests; steps per wall-clock second;
2. chunked prefill: a node in prefill mode with a queue of 20K-token prompts sharing cached prefixes; steps
   per second and prefilled tokens per second;
3. fitting: a node in collocated mode (the warmup) serves agent-like request chains on the profile's ground
   truth (eq. 1/2 plus what they leave out, `node_agent.engine.groundtruth`) with `--noise` (5 %) iteration
   noise for `--warmup` simulated seconds; its iteration records are fitted by NNLS (`router.fitting`);
   printed are the fitting time, the fit's own held-out error, the error of the frozen model on the
   iterations of the next `--horizon` simulated seconds (never seen by the fit; `later_error_*`, with
   percentiles), the ground truth's own error against those noisy iterations (`noise_floor_*`: noise only),
   and the model's error against the noise-free ground truth (`model_form_error_*`: what eq. 1/2 cannot
   capture). `--plot FILE` draws predicted against measured iteration times, as figure 5 does.

Boundary: measurement and printing only; everything measured is the pure engine core and fitter.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rich.console import Console
from rich.table import Table

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.itermodel import IterationRecord, mean_relative_error
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId
from evolving_infra.node_agent.engine import DecodeRequest, EngineCore, IterationKind, PrefillRequest
from evolving_infra.node_agent.engine.groundtruth import IterationTimes
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
    parser.add_argument("--noise", type=float, default=0.05,
                        help="relative std. dev. of the engine's iteration-time noise in the fitting run (default 0.05)")
    parser.add_argument("--exact-models", action="store_true",
                        help="debugging switch: the engine times iterations by eq. 1/2 alone (no ground-truth effects)")
    parser.add_argument("--plot", metavar="FILE.png", help="write predicted vs measured iteration times (figure 5)")
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


@dataclass(frozen=True)
class FitSamples:
    """The later iterations of the fitting run: measured, predicted by the fitted model, and the noise-free
    ground truth, per phase."""

    measured: dict[Phase, list[float]]
    predicted: dict[Phase, list[float]]
    truth: dict[Phase, list[float]]


def bench_fitting(
    profile: HardwareProfile, warmup: float, horizon: float, seed: int, noise: float = 0.05,
    exact_models: bool = False,
) -> tuple[dict[str, float], FitSamples]:
    rng = random.Random(seed)
    engine = EngineCore(NODE, profile, NodeMode.COLLOCATED, BranchCountEviction(), noise=noise,
                        rng=rng if noise > 0 else None, exact_models=exact_models)
    truth = IterationTimes(NODE, profile, exact=exact_models)
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
    samples = FitSamples({Phase.PREFILL: [], Phase.DECODE: []}, {Phase.PREFILL: [], Phase.DECODE: []},
                         {Phase.PREFILL: [], Phase.DECODE: []})
    for r in later:
        if r.phase is Phase.PREFILL:
            predicted, true = model.prefill_iteration_time(r.prefill), truth.prefill(r.prefill)
        else:
            predicted, true = model.decode_iteration_time(r.decode_batch), truth.decode(r.decode_batch, r.context_tokens)
        samples.measured[r.phase].append(r.duration)
        samples.predicted[r.phase].append(predicted)
        samples.truth[r.phase].append(true)
    figures: dict[str, float] = {
        "warmup_iterations": float(sum(fitter.samples)),
        "fit_ms": fit_s * 1e3,
        "noise": noise,
        "exact_models": float(exact_models),
        "held_out_error_prefill": result.held_out_error_prefill or float("nan"),
        "held_out_error_decode": result.held_out_error_decode or float("nan"),
        "later_iterations": float(len(later)),
    }
    for phase in Phase:
        name = phase.value
        measured, fitted, truths = samples.measured[phase], samples.predicted[phase], samples.truth[phase]
        figures[f"later_error_{name}"] = mean_relative_error(fitted, measured)
        figures[f"noise_floor_{name}"] = mean_relative_error(truths, measured)
        figures[f"model_form_error_{name}"] = mean_relative_error(fitted, truths)
        errors = relative_errors(fitted, measured)
        for q in (50, 90, 99):
            figures[f"later_error_{name}_p{q}"] = float(np.percentile(errors, q))
    return figures, samples


def relative_errors(predicted: list[float], measured: list[float]) -> np.ndarray:
    """|predicted - measured| / measured per sample (measured > 0)."""
    pred, meas = np.asarray(predicted), np.asarray(measured)
    keep = meas > 0
    return np.abs(pred[keep] - meas[keep]) / meas[keep]


def plot_fit(samples: FitSamples, figures: dict[str, float], title: str, path: Path) -> Path:
    """Predicted against measured iteration time per phase, with the error percentiles (figure 5's view)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for ax, phase in zip(axes, Phase, strict=True):
        measured = np.asarray(samples.measured[phase]) * 1e3
        predicted = np.asarray(samples.predicted[phase]) * 1e3
        if measured.size:
            ax.scatter(measured, predicted, s=6, alpha=0.5, label="fitted model")
            ax.scatter(measured, np.asarray(samples.truth[phase]) * 1e3, s=3, alpha=0.4, marker="x",
                       label="ground truth (no noise)")
            low, high = float(min(measured.min(), predicted.min())), float(max(measured.max(), predicted.max()))
            ax.plot([low, high], [low, high], color="black", linewidth=0.8, label="predicted = measured")
        name = phase.value
        ax.set_title(f"{name}: error p50 {100 * figures[f'later_error_{name}_p50']:.1f} %, "
                     f"p90 {100 * figures[f'later_error_{name}_p90']:.1f} %, "
                     f"p99 {100 * figures[f'later_error_{name}_p99']:.1f} %", fontsize=9)
        ax.set_xlabel("measured iteration time (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    console = Console(stderr=True, quiet=args.json)
    with console.status("decode batch..."):
        decode = bench_decode(profile, args.batch, args.steps)
    with console.status("chunked prefill..."):
        prefill = bench_prefill(profile, args.steps)
    with console.status("collocated warmup and fitting..."):
        fitting, samples = bench_fitting(profile, args.warmup, args.horizon, args.seed, args.noise, args.exact_models)
    result: dict[str, object] = {"profile": profile.name, "decode": decode, "prefill": prefill, "fitting": fitting}
    if args.plot:
        title = (f"{profile.name}: fitted after {args.warmup:g} s of warmup, scored on the next {args.horizon:g} s "
                 f"({'exact models' if args.exact_models else 'ground truth'}, noise {args.noise:g})")
        result["plot"] = str(plot_fit(samples, fitting, title, Path(args.plot)))
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
    table.add_row("  percentiles p50 / p90 / p99, prefill (%)",
                  " / ".join(f"{100 * fitting[f'later_error_prefill_p{q}']:.1f}" for q in (50, 90, 99)))
    table.add_row("  percentiles p50 / p90 / p99, decode (%)",
                  " / ".join(f"{100 * fitting[f'later_error_decode_p{q}']:.1f}" for q in (50, 90, 99)))
    table.add_row("  ground truth on the same iterations (noise floor, %)",
                  f"{100 * fitting['noise_floor_prefill']:.2f} / {100 * fitting['noise_floor_decode']:.2f}")
    table.add_row("  fitted model against the noise-free ground truth (%)",
                  f"{100 * fitting['model_form_error_prefill']:.2f} / {100 * fitting['model_form_error_decode']:.2f}")
    Console().print(table)
    return 0
