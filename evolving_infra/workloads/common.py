"""Parameters and helpers every per-agent generator shares.

Boundary: declarations only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from evolving_infra.workloads.params import param

Record = dict[str, object]
"""One trace record as a plain dict (format version 1)."""


@dataclass(frozen=True)
class CommonParams:
    """Open-loop arrivals and the context bound that every kind respects."""

    arrival_rate_per_min: float = param(
        1.0,
        "appendix D.3: Poisson agent arrivals, 0.5-1.5 agents/min on CC (1.0 is the highest rate Evolving Infra "
        "sustains); the same default for every kind is an assumption. Ignored by closed-loop replay",
    )
    max_context_tokens: int = param(
        200_000, "assumption: a 200K-token context window; no request's context (prompt + output) exceeds it"
    )

    def __post_init__(self) -> None:
        if not self.arrival_rate_per_min > 0:
            raise ValueError(f"arrival_rate_per_min must be > 0, got {self.arrival_rate_per_min}")
        if self.max_context_tokens < 1_000:
            raise ValueError(f"max_context_tokens must be >= 1000, got {self.max_context_tokens}")


def check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")


def check_nonnegative(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def shared_start(prefix: str, tokens: int) -> dict[str, Any]:
    """Keyword arguments that start a request from `tokens` tokens of `prefix`, or from nothing when 0."""
    return {"shared": prefix, "keep": tokens} if tokens > 0 else {}


def fit(context: int, new: int, output: int, limit: int) -> tuple[int, int] | None:
    """`(new, output)` trimmed so that `context + new + output <= limit` (output first, then fresh input), or
    None when not even one output token fits."""
    room = limit - context
    need = 1 if context == 0 else 0  # a prompt has at least one token
    if room < 1 + need:
        return None
    output = max(1, min(output, room - need))
    new = max(need, min(new, room - output))
    return new, output


def agent_rng(seed: int, stream: str, index: int) -> random.Random:
    """The random stream of agent `index`: independent of how many agents are generated."""
    return random.Random(f"evolving-infra/{seed}/{stream}/{index}")
