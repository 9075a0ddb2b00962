"""Fitting one phase of a node's iteration-time model: the samples, the held-out split and the weighted
non-negative least-squares fit (used by `evolving_infra.router.fitting`, whose module docstring states the
method).

Invariants:
- A coefficient is FITTED only if its design column raises the rank of the scaled design and is non-zero
  in at least two samples; otherwise it is 0 and listed as UNIDENTIFIED, and its phase is PARTIAL.
- The held-out split is a pure function of (sample count, seed); held-out samples never enter the fit, and
  the returned coefficients are exactly those the held-out error was measured on.
- `PhaseSamples.arrays` holds exactly the samples added, in order: rows are kept as Python tuples while they
  arrive, and each call converts only those added since the last one.

Boundary: pure numpy/scipy on samples passed in; no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from evolving_infra.core.itermodel import mean_relative_error

RANK_RTOL = 1e-6
"""A column is unidentifiable if the smallest singular value of the scaled design with it falls below this
fraction of the largest."""


class CoefficientStatus(enum.Enum):
    FITTED = "fitted"
    UNIDENTIFIED = "unidentified"  # its column adds nothing the others do not explain; value 0


class PhaseStatus(enum.Enum):
    FITTED = "fitted"  # every coefficient identified
    PARTIAL = "partial"  # fitted on the identifiable subset; the rest are 0 and UNIDENTIFIED
    TOO_FEW_SAMPLES = "too_few_samples"
    NO_SAMPLES = "no_samples"


@dataclass(frozen=True, slots=True)
class PhaseFit:
    """The fit of one phase: status, each coefficient's status, its values and held-out diagnostics."""

    status: PhaseStatus
    coefficient_status: tuple[tuple[str, CoefficientStatus], ...]
    values: tuple[float, ...] | None
    train_samples: int
    held_out_samples: int
    held_out_error: float | None
    message: str

    @property
    def unidentified(self) -> tuple[str, ...]:
        return tuple(name for name, s in self.coefficient_status if s is CoefficientStatus.UNIDENTIFIED)


class PhaseSamples:
    """One phase's regressor rows and measured times, in arrival order."""

    def __init__(self, width: int) -> None:
        self._rows: list[tuple[float, ...]] = []
        self._times: list[float] = []
        self._x, self._y = np.empty((0, width)), np.empty(0)

    def __len__(self) -> int:
        return len(self._y) + len(self._times)

    def add(self, row: tuple[float, ...], time: float) -> None:
        self._rows.append(row)
        self._times.append(time)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, times) of every sample so far as float arrays (do not change them)."""
        if self._times:
            self._x = np.concatenate([self._x, np.asarray(self._rows, dtype=float)])
            self._y = np.concatenate([self._y, np.asarray(self._times, dtype=float)])
            self._rows, self._times = [], []
        return self._x, self._y


def holdout_split(n: int, fraction: float, seed: Sequence[int], min_train: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) indices: a seeded permutation, holding out `fraction` but keeping >= min_train."""
    order = np.random.default_rng(list(seed)).permutation(n)
    held = max(0, min(int(n * fraction), n - min_train))
    return np.sort(order[held:]), np.sort(order[:held])


def fit_phase(
    phase: str, x: np.ndarray, y: np.ndarray, names: tuple[str, ...],
    preference: tuple[int, ...], min_train: int, holdout_fraction: float, seed: tuple[int, int],
) -> PhaseFit:  # fmt: skip
    """Fit one phase on `x` (regressor rows) and `y` (measured times); see the module invariants."""
    n = len(y)
    if n == 0:
        return PhaseFit(PhaseStatus.NO_SAMPLES, (), None, 0, 0, None, f"no {phase} iterations observed")
    if n < min_train:
        message = f"{n} {phase} iterations observed, need at least {min_train} ({len(names)} coefficients)"
        return PhaseFit(PhaseStatus.TOO_FEW_SAMPLES, (), None, n, 0, None, message)
    train, held = holdout_split(n, holdout_fraction, seed, min_train)
    weighted = x[train] / y[train, None]  # relative least squares
    norms = np.linalg.norm(weighted, axis=0)
    support = np.count_nonzero(x[train], axis=0)
    chosen: list[int] = []
    for col in preference:
        if support[col] < 2 or norms[col] == 0:
            continue
        candidate = weighted[:, [*chosen, col]] / norms[[*chosen, col]]
        sv = np.linalg.svd(candidate, compute_uv=False)
        if sv[-1] > RANK_RTOL * sv[0]:
            chosen.append(col)
    solution, _ = nnls(weighted[:, chosen] / norms[chosen], np.ones(len(train)))
    values = np.zeros(len(names))
    values[chosen] = solution / norms[chosen]
    statuses = tuple(
        (name, CoefficientStatus.FITTED if i in chosen else CoefficientStatus.UNIDENTIFIED)
        for i, name in enumerate(names)
    )
    missing = [name for name, s in statuses if s is CoefficientStatus.UNIDENTIFIED]
    error = mean_relative_error(list(x[held] @ values), list(y[held])) if len(held) else None
    parts = [f"fitted on {len(train)} iterations"]
    parts.append(f"held-out error {error:.1%} on {len(held)}" if error is not None else "no held-out iterations")
    if missing:
        parts.append(f"{', '.join(missing)} unidentifiable from these iterations (set to 0)")
    status = PhaseStatus.PARTIAL if missing else PhaseStatus.FITTED
    return PhaseFit(status, statuses, tuple(float(v) for v in values), len(train), len(held), error, ", ".join(parts))
