"""The emulated engine's true iteration time: eq. 1 and 2 with the profile's coefficients plus the effects the
models leave out (`HardwareProfile.truth`, docs/hardware-profiles.md "Ground truth").

- prefill: `f_n * (eq. 1 + prefill_chunk_s * chunks)`, a fixed cost per request chunk in the batch;
- decode: `f_n * (d0 + d1 phi(B) + d2 pad(B) + decode_context_s * context)`, `pad(B)` the next captured batch
  size (`decode_graph_sizes`; B itself past the last one) and `context` the tokens the running batch attends to;
- `f_n` in `[1, 1 + node_slowdown]`, fixed by the node id (a stable hash), so a node keeps its speed across
  restarts and runs of any driver.

With `exact=True` (the `--exact-models` debugging switch) the true time is eq. 1 and 2 exactly. Noise is the
engine core's (a log-normal factor applied on top).

Boundary: pure arithmetic on the profile, the node id and an iteration's shape; no state but a per-batch cache.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence

from evolving_infra.core.itermodel import PrefillItem, phi, prefill_iteration_time
from evolving_infra.node_agent.profile import HardwareProfile


def node_speed_factor(node: str, slowdown: float) -> float:
    """The node's slowdown factor in `[1, 1 + slowdown]`, a pure function of its id."""
    if slowdown <= 0:
        return 1.0
    digest = hashlib.blake2b(node.encode("utf-8"), digest_size=8).digest()
    return 1.0 + slowdown * int.from_bytes(digest, "big") / 2**64


def padded_batch(batch: int, sizes: Sequence[int]) -> int:
    """The smallest captured size >= `batch` (the batch itself when there is none)."""
    at = bisect.bisect_left(sizes, batch)
    return sizes[at] if at < len(sizes) else batch


class IterationTimes:
    """True iteration times of one node (see the module docstring)."""

    def __init__(self, node: str, profile: HardwareProfile, exact: bool = False) -> None:
        truth = profile.truth
        self.exact = exact or truth.exact
        self.factor = 1.0 if exact else node_speed_factor(node, truth.node_slowdown)
        self._prefill_coef = profile.prefill.coefficients()
        self._decode = profile.decode
        self._chunk_s = 0.0 if exact else truth.prefill_chunk_s
        self._context_s = 0.0 if exact else truth.decode_context_s
        self._sizes = () if exact else truth.decode_graph_sizes
        self._base: dict[int, float] = {}

    def prefill(self, items: Sequence[PrefillItem]) -> float:
        """One prefill iteration over `items` (one chunk per request)."""
        seconds = prefill_iteration_time(self._prefill_coef, items) + self._chunk_s * len(items)
        return seconds * self.factor

    def decode(self, batch: int, context_tokens: float = 0.0) -> float:
        """One decode iteration of `batch` running requests attending to `context_tokens` in all."""
        if batch <= 0:
            return 0.0
        base = self._base.get(batch)
        if base is None:
            d = self._decode
            base = d.d0 + d.d1 * phi(batch, d.k, d.experts, d.t_fwd) + d.d2 * padded_batch(batch, self._sizes)
            base = self._base[batch] = base
        return (base + self._context_s * max(0.0, context_tokens)) * self.factor
