"""Give Dynamo's mocker engine the iteration times of one of our hardware profiles.

Dynamo's mocker reads an interpolated timing model (a `.npz` of five arrays): a prefill iteration costs
`prefill_ttft_ms(n)` for `n` new (uncached) tokens in the iteration, whatever their cached context, and a
decode iteration costs `decode_itl(active_kv_tokens, context_length)` per generated token, with
context_length = active KV tokens / running requests. (Measured on ai-dynamo 1.6.1: a 16,384-token prompt
takes two 8,192-token chunks at f(8192) each; a prompt with 8,192 cached tokens and 4,096 new costs
f(4096); two prompts in one iteration cost f(sum).)

Our profile's prefill iteration is eq. 1, `c0 + c1 sum t_uc + c2 sum (t_uc t_c + t_uc (t_uc + 1) / 2)`, whose
attention term depends on each chunk's cached context t_c, which the mocker's model cannot see. The fit
charges every new token the workload's token-weighted mean context `ctx` (from the trace, with every kept
prefix cached and chunks of the profile's `chunk_tokens`):

    f(n) = c0 + c1 n + c2 n (ctx + (n + 1) / 2)

so the *total* prefill time of the trace's chunks is the same under both models (the c2 t_uc t_c term is
linear in t_c), while a chunk with a longer context than `ctx` is charged less than eq. 1 and a shorter one
more; `TimingFit.chunk_error` reports how much. Decode: our engine produces `t_acc` tokens per request per
iteration of eq. 2 time T(B), which does not depend on KV tokens, so

    decode_itl(kv, ctx) = T(max(1, kv / ctx)) / t_acc.

Boundary: pure numpy over a profile and a trace; writing the `.npz` is the caller's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from evolving_infra.core.itermodel import PrefillItem, decode_iteration_time, prefill_iteration_time
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.traces.records import Trace

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TimingFit:
    """The mocker's timing tables for one profile and workload, and how well they match eq. 1 and 2."""

    profile: str
    context_tokens: float
    """Token-weighted mean cached context of a prefill chunk (ctx above)."""
    chunks: int
    chunk_error_mean: float
    """Mean |f(t_uc) - eq. 1| / eq. 1 over the trace's single-request chunks."""
    chunk_error_p95: float
    total_prefill_error: float
    """(sum f - sum eq. 1) / sum eq. 1 over the same chunks (0 by construction, up to rounding)."""
    decode_error_max: float
    """Largest relative error of the interpolated decode table against T(B) / t_acc (`decode_error`)."""
    tables: dict[str, list[Any]]

    def arrays(self) -> dict[str, FloatArray]:
        """The tables as the arrays the mocker's `.npz` holds."""
        return {k: np.asarray(v, dtype=np.float64) for k, v in self.tables.items()}

    def describe(self) -> dict[str, Any]:
        """Everything but the tables (for reports)."""
        data = asdict(self)
        data.pop("tables")
        return data


def trace_chunks(trace: Trace, page_tokens: int, chunk_tokens: int) -> list[PrefillItem]:
    """The prefill chunks of every request with its kept prefix cached (whole pages) and the rest computed
    in chunks of at most `chunk_tokens`."""
    if page_tokens < 1 or chunk_tokens < 1:
        raise ValueError(f"page_tokens and chunk_tokens must be >= 1, got {page_tokens}, {chunk_tokens}")
    items: list[PrefillItem] = []
    for r in trace.requests:
        cached = min(r.keep // page_tokens * page_tokens, r.prompt_tokens - 1)
        done = cached
        while done < r.prompt_tokens:
            chunk = min(chunk_tokens, r.prompt_tokens - done)
            items.append(PrefillItem(t_uc=chunk, t_c=done))
            done += chunk
    return items


def mean_context(items: list[PrefillItem]) -> float:
    """Token-weighted mean cached context of `items`: sum t_uc t_c / sum t_uc."""
    tokens = sum(i.t_uc for i in items)
    return sum(i.t_uc * i.t_c for i in items) / tokens if tokens else 0.0


def prefill_table(profile: HardwareProfile, context_tokens: float, max_tokens: int, points: int = 129) -> tuple[
    FloatArray, FloatArray
]:
    """(new tokens, ms) of f(n) at `points` evenly spaced n in 0..max_tokens."""
    c = profile.prefill
    n = np.linspace(0.0, float(max_tokens), points)
    ms = 1000.0 * (c.c0 + c.c1 * n + c.c2 * n * (context_tokens + (n + 1.0) / 2.0))
    return n, ms


def decode_table(
    profile: HardwareProfile, max_kv_tokens: int, max_context: int, points: int = 128
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(active KV tokens, context lengths, ITL ms[kv, ctx]) with ITL = T(max(1, kv / ctx)) / t_acc."""
    coef = profile.decode.coefficients()
    # Geometric axes: the mocker interpolates bilinearly in (kv, ctx) while the time depends on kv / ctx, which
    # changes fastest at small kv and ctx; geometric spacing keeps the error small there (`decode_error`).
    kv = np.concatenate([[0.0], np.geomspace(float(profile.page_tokens), float(max_kv_tokens), points - 1)])
    ctx = np.geomspace(1.0, float(max_context), points)
    itl = np.empty((points, points))
    for i, k in enumerate(kv):
        for j, c in enumerate(ctx):
            itl[i, j] = 1000.0 * decode_iteration_time(coef, max(1.0, k / c)) / profile.decode.t_acc
    return kv, ctx, itl


def bilinear(x_axis: FloatArray, y_axis: FloatArray, table: FloatArray, x: float, y: float) -> float:
    """Bilinear interpolation of `table[x, y]` at (x, y), clamped to the axes (as the mocker reads its table)."""
    x = min(max(x, float(x_axis[0])), float(x_axis[-1]))
    y = min(max(y, float(y_axis[0])), float(y_axis[-1]))
    i = int(np.clip(np.searchsorted(x_axis, x) - 1, 0, len(x_axis) - 2))
    j = int(np.clip(np.searchsorted(y_axis, y) - 1, 0, len(y_axis) - 2))
    tx = (x - x_axis[i]) / (x_axis[i + 1] - x_axis[i])
    ty = (y - y_axis[j]) / (y_axis[j + 1] - y_axis[j])
    top = table[i, j] * (1 - ty) + table[i, j + 1] * ty
    bottom = table[i + 1, j] * (1 - ty) + table[i + 1, j + 1] * ty
    return float(top * (1 - tx) + bottom * tx)


def decode_error(profile: HardwareProfile, kv: FloatArray, ctx: FloatArray, itl: FloatArray) -> float:
    """Largest relative error of the interpolated ITL against T(B) / t_acc over batches 1..512 and contexts from
    1K tokens to the table's longest."""
    coef = profile.decode.coefficients()
    worst = 0.0
    for batch in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 512):
        for c in np.geomspace(1024.0, float(ctx[-1]), 9):
            if batch * c > kv[-1]:
                continue
            true = 1000.0 * decode_iteration_time(coef, batch) / profile.decode.t_acc
            worst = max(worst, abs(bilinear(kv, ctx, itl, batch * c, c) - true) / true)
    return worst


def fit_timing(profile: HardwareProfile, trace: Trace, *, max_context: int | None = None) -> TimingFit:
    """The mocker's timing tables for `profile` on `trace` (see the module docstring)."""
    items = trace_chunks(trace, profile.page_tokens, profile.chunk_tokens)
    ctx = mean_context(items)
    longest = max((r.context_tokens for r in trace.requests), default=profile.chunk_tokens)
    n, prefill_ms = prefill_table(profile, ctx, 4 * profile.chunk_tokens)
    kv, ctx_axis, itl = decode_table(profile, 2 * profile.l1_tokens, max_context or max(longest, 1024))
    coef = profile.prefill.coefficients()
    true = np.array([prefill_iteration_time(coef, [i]) for i in items])
    fitted = np.interp([i.t_uc for i in items], n, prefill_ms) / 1000.0
    rel = np.abs(fitted - true) / true if len(items) else np.zeros(1)
    return TimingFit(
        profile=profile.name,
        context_tokens=ctx,
        chunks=len(items),
        chunk_error_mean=float(rel.mean()),
        chunk_error_p95=float(np.percentile(rel, 95)),
        total_prefill_error=float((fitted.sum() - true.sum()) / true.sum()) if len(items) else 0.0,
        decode_error_max=decode_error(profile, kv, ctx_axis, itl),
        tables={
            "prefill_isl": n.tolist(),
            "prefill_ttft_ms": prefill_ms.tolist(),
            "decode_active_kv_tokens": kv.tolist(),
            "decode_context_length": ctx_axis.tolist(),
            "decode_itl": itl.tolist(),
        },
    )
