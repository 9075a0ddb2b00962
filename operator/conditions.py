"""Conditions in the standard shape, updated without churn.

Invariant: `lastTransitionTime` changes only when a condition's status changes; setting a condition to
what it already says (same status, reason, message, generation) returns the very same list, so a
reconcile that finds nothing new writes nothing.

Boundary: pure functions on `Condition` lists; time is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from evolving_infra.operator.status import Condition, ConditionStatus, ConditionType

ORDER = tuple(ConditionType)


@dataclass(frozen=True, slots=True)
class Want:
    """A condition as the operator wants it now (without its transition time)."""

    type: ConditionType
    status: ConditionStatus
    reason: str
    message: str = ""

    @classmethod
    def true(cls, type: ConditionType, reason: str, message: str = "") -> Want:
        return cls(type, ConditionStatus.TRUE, reason, message)

    @classmethod
    def false(cls, type: ConditionType, reason: str, message: str = "") -> Want:
        return cls(type, ConditionStatus.FALSE, reason, message)


def find(conditions: Sequence[Condition] | None, type: ConditionType) -> Condition | None:
    return next((c for c in conditions or () if c.type is type), None)


def is_true(conditions: Sequence[Condition] | None, type: ConditionType) -> bool:
    cond = find(conditions, type)
    return cond is not None and cond.status is ConditionStatus.TRUE


def merge(
    current: Sequence[Condition] | None, wanted: Iterable[Want], now: datetime, generation: int | None
) -> list[Condition]:
    """`current` with each wanted condition set; others kept; ordered by `ConditionType`."""
    out = {c.type: c for c in current or ()}
    for want in wanted:
        old = out.get(want.type)
        transition = old.last_transition_time if old is not None and old.status is want.status else now
        new = Condition(
            type=want.type,
            status=want.status,
            reason=want.reason,
            message=want.message[:32768],
            last_transition_time=transition,
            observed_generation=generation,
        )
        out[want.type] = old if old == new else new
    return [out[t] for t in ORDER if t in out]
