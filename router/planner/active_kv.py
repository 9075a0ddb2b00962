"""When a move towards decode leaves prefill nodes that cannot hold the active branches' contexts.

w̄_i is measured with the current split's prefill nodes holding the active branches' prefixes. A candidate with
fewer prefill nodes whose KV memory (GPU and host together) is smaller than the active contexts keeps the reuse
eq. 3 prices only while its prefill queues stay short: a prefill node pins a queued request's prefix when it admits
the request, so prefixes of requests waiting behind a queue are evicted to make room for the admitted ones and are
recomputed, which lengthens the queue that loses them. Such a split has a good steady state (short queues, the reuse
of today's w̄) and a collapsed one (long queues, prefixes recomputed), and eq. 5 on today's w̄ sees only the first.
In a closed loop the queue forms on the side that is the bottleneck, and a burst pushes it there sooner the busier
that side is.

`ActiveKv.REFUSE` (the default): such a move never qualifies. It never let a partition collapse in the runs of
docs/evaluation.md, but it also refuses moves that hold (a steady D.2 partition's 4P8D, +13.7 %).
`ActiveKv.HEADROOM`: such a move qualifies only while eq. 5 predicts its prefill side at most `limit` busy
(Θ(candidate) / Σµ_P(candidate), mean over the slices its gains come from; default 0.5: its prefill nodes serve
twice the rate the candidate is predicted to serve, so a burst of that size does not queue there). It judges the
move on today's mix: on a partition whose mix then shifts towards prefill-heavy work the move it allowed collapsed
before the next decision could undo it (docs/evaluation.md, "The KV rule with prefill headroom"), so with HEADROOM
the planner also checks the premise at the end of every slice and leaves such a split once eq. 5 predicts its
prefill side significantly busier than `limit` (`OursPlanner.check`).
`ActiveKv.OFF`: the paper's rule. Moves towards prefill are never refused (more prefill memory only helps reuse).

Boundary: the rule's arithmetic on page counts and predicted rates; the planner gathers them.
"""

from __future__ import annotations

import enum
import math

from evolving_infra.router.planner.throughput import SplitThroughput


class ActiveKv(str, enum.Enum):
    """How our planner treats a move towards decode whose prefill nodes cannot hold the active contexts."""

    HEADROOM = "headroom"  # it qualifies only with its prefill side predicted at most `limit` busy
    REFUSE = "refuse"  # it never qualifies
    OFF = "off"  # the paper's rule


def cannot_hold(prefill_kv_pages: int | None, active_kv_pages: int | None) -> bool:
    """Whether prefill nodes with `prefill_kv_pages` of KV (GPU and host) cannot hold the active contexts' pages
    (False when either is unknown)."""
    return prefill_kv_pages is not None and active_kv_pages is not None and prefill_kv_pages < active_kv_pages


def prefill_utilization(throughput: SplitThroughput) -> float:
    """Θ / Σµ_P of a split on one slice: how busy eq. 5 predicts its prefill side (0 without prefill work)."""
    if math.isinf(throughput.prefill):
        return 0.0
    return 1.0 if throughput.prefill <= 0 else min(1.0, throughput.theta / throughput.prefill)


def refused(rule: ActiveKv, short: bool, utilization: float | None, limit: float) -> bool:
    """Whether a move towards decode is refused: `short`, its prefill nodes cannot hold the active contexts;
    `utilization`, its predicted prefill utilization (None: no usable slice)."""
    if not short or rule is ActiveKv.OFF:
        return False
    if rule is ActiveKv.REFUSE:
        return True
    return utilization is None or utilization > limit
