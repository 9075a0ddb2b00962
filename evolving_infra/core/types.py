"""Core value types: ids, phases, memory tiers and a request's work `w = (t_uc, t_c, t_out, t_acc)`.

Boundary: plain immutable values with validation; no behaviour beyond what the paper's notation defines
(Table 1 of the paper).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

NodeId = NewType("NodeId", str)
BranchId = NewType("BranchId", str)
RequestId = NewType("RequestId", str)
AgentId = NewType("AgentId", str)


class Phase(enum.Enum):
    """The phase a node serves. A node serves exactly one phase outside warmup."""

    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def other(self) -> Phase:
        return Phase.DECODE if self is Phase.PREFILL else Phase.PREFILL

    @property
    def letter(self) -> str:
        """`P` or `D`, as in a split written `4P5D`."""
        return "P" if self is Phase.PREFILL else "D"


class NodeMode(enum.Enum):
    """What a node's scheduling loop serves: one phase, or both (collocated, used during warmup)."""

    PREFILL = "prefill"
    DECODE = "decode"
    COLLOCATED = "collocated"

    @classmethod
    def of(cls, phase: Phase) -> NodeMode:
        return cls(phase.value)


class SwitchMode(enum.Enum):
    """How a decided phase switch is applied to each moving node.

    IN_PLACE: the node drains its running requests and serves the new phase without a restart; its host KV
    stays readable by every node. IN_PLACE_STRAND_KV: as IN_PLACE, but the node's KV is no longer reachable
    for prefill afterwards (each engine indexes its KV locally). RELAUNCH: the node's worker is terminated
    (in-flight requests are not waited for) and relaunched in the other role; it serves nothing until ready
    and its KV starts empty.
    """

    IN_PLACE = "in_place"
    IN_PLACE_STRAND_KV = "in_place_strand_kv"
    RELAUNCH = "relaunch"


class Tier(enum.Enum):
    """KV memory tiers of a node: L1 is GPU memory, L2 is host memory (the shared pool)."""

    GPU = "gpu"
    HOST = "host"


@dataclass(frozen=True, slots=True)
class Work:
    """The work of one request (paper Table 1).

    t_uc: uncached prefill tokens; t_c: cached prefill tokens (the reused prefix);
    t_out: output tokens; t_acc: mean accepted tokens per decode iteration (>= 1 with speculation).
    """

    t_uc: int
    t_c: int
    t_out: int
    t_acc: float = 1.0

    def __post_init__(self) -> None:
        if self.t_uc < 0 or self.t_c < 0:
            raise ValueError(f"token counts must be >= 0, got t_uc={self.t_uc}, t_c={self.t_c}")
        if self.t_out < 0:
            raise ValueError(f"t_out must be >= 0, got {self.t_out}")
        if not self.t_acc > 0:
            raise ValueError(f"t_acc must be > 0, got {self.t_acc}")

    @property
    def t_in(self) -> int:
        """Prompt length: cached plus uncached tokens."""
        return self.t_uc + self.t_c

    @property
    def query_key_pairs(self) -> int:
        """A = t_uc * t_c + t_uc (t_uc + 1) / 2: causal attention pairs of the uncached tokens (eq. 1)."""
        return self.t_uc * self.t_c + self.t_uc * (self.t_uc + 1) // 2
