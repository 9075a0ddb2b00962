"""The searched best static split, the per-window oracle and the open-loop sustained rate.

- `all_splits(n)`: every split of `n` nodes from 1P(n-1)D to (n-1)P1D, the candidates of the search.
- `best_split`: the candidate with the highest scored throughput (the paper's "best static split": the fixed
  split with the highest throughput over the run); ties go to the candidate listed first.
- `window_oracle`: the best static split of every planning window, from per-window completions of runs at every
  split over the same trace; its throughput is an upper reference that pays no switch and carries no state from
  one window to the next (each window's figure comes from a run that held its split from the start).
- `sustains`: whether an open-loop run meets appendix D.3's latency targets.

Boundary: pure functions of throughput figures and completion series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def all_splits(nodes: int) -> list[str]:
    """`1P{n-1}D` ... `{n-1}P1D`."""
    if nodes < 2:
        raise ValueError(f"a split needs at least 2 nodes, got {nodes}")
    return [f"{p}P{nodes - p}D" for p in range(1, nodes)]


def best_split(throughput: Mapping[str, float | None]) -> tuple[str, float]:
    """The split with the highest throughput among those that ran (None: the run has no figure)."""
    ran = [(split, x) for split, x in throughput.items() if x is not None]
    if not ran:
        raise ValueError("no split has a throughput figure: nothing to choose from")
    best = ran[0]
    for split, x in ran[1:]:
        if x > best[1]:
            best = (split, x)
    return best


@dataclass(frozen=True, slots=True)
class OracleWindow:
    start_s: float
    end_s: float
    split: str
    finished: int
    """Requests the window's best split finished inside it."""


@dataclass(frozen=True, slots=True)
class Oracle:
    windows: tuple[OracleWindow, ...]
    throughput: float
    """Requests the per-window best splits finished in the scored span, per second."""

    def splits(self) -> list[str]:
        return [w.split for w in self.windows]


def window_oracle(series: Mapping[str, Sequence[int]], bucket_s: float, start_s: float, end_s: float,
                  window_s: float = 600.0) -> Oracle:  # fmt: skip
    """The best split of every `window_s` window of [start_s, end_s), from `series[split][i]`: requests finished
    in bucket i (`[i * bucket_s, (i + 1) * bucket_s)`) by the run at that split."""
    if not series:
        raise ValueError("the oracle needs the completion series of at least one split")
    if not (bucket_s > 0 and window_s > 0 and end_s > start_s >= 0):
        raise ValueError(f"need bucket_s > 0, window_s > 0 and 0 <= start_s < end_s, got {bucket_s}, {window_s}, "
                         f"{start_s}, {end_s}")  # fmt: skip
    ratio = window_s / bucket_s
    if abs(ratio - round(ratio)) > 1e-9 or abs(start_s / bucket_s - round(start_s / bucket_s)) > 1e-9:
        raise ValueError(f"window_s ({window_s}) and start_s ({start_s}) must be multiples of bucket_s ({bucket_s})")
    windows: list[OracleWindow] = []
    t = start_s
    while t < end_s - 1e-9:
        hi = min(t + window_s, end_s)
        a, b = round(t / bucket_s), round(hi / bucket_s)
        counts = {split: sum(s[a:b]) for split, s in series.items()}
        split, done = best_split({k: float(v) for k, v in counts.items()})
        windows.append(OracleWindow(t, hi, split, int(done)))
        t = hi
    return Oracle(tuple(windows), sum(w.finished for w in windows) / (end_s - start_s))


D3_TARGETS = {"ttft_p50": 5.0, "ttft_p95": 15.0, "e2e_p50": 10.0}
"""Appendix D.3: a rate is sustained if P50 / P95 TTFT stay within 5 / 15 s and P50 E2E within 10 s (also: at least
90 % of the arriving agents admitted and under 0.5 % of requests failing; the simulator fails none)."""


def sustains(figures: Mapping[str, float | None], admitted: float | None = None) -> bool:
    """Whether one open-loop run meets D.3's targets (a missing figure fails)."""
    for name, limit in D3_TARGETS.items():
        value = figures.get(name)
        if value is None or value > limit:
            return False
    return admitted is None or admitted >= 0.9


def sustained_rate(runs: Mapping[float, bool]) -> float | None:
    """The highest rate sustained with every lower rate of the sweep sustained too (None: not even the lowest)."""
    best = None
    for rate in sorted(runs):
        if not runs[rate]:
            break
        best = rate
    return best
