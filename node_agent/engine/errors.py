"""Errors the engine core raises: each says what is wrong, where, and what is allowed.

Boundary: exception types only. Refusals (`WrongPhase`, `SwitchInProgress`) are temporary from the
router's point of view (send the work elsewhere); the others are caller bugs or oversized requests.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine core raises."""


class WrongPhase(EngineError):
    """The node does not serve the phase of the submitted work (its mode, or it is draining that phase)."""


class SwitchInProgress(EngineError):
    """A phase switch is draining: work of the new phase is refused until it completes, and so is a second switch."""


class RequestTooLarge(EngineError):
    """The request's pages can never fit in the node's memory tiers, even with everything else evicted."""


class DuplicateRequest(EngineError):
    """A request id that the engine already holds was submitted again."""


class UnknownRequest(EngineError):
    """A request id the engine has never been given."""


class EngineBusy(EngineError):
    """`step` was called before the previous iteration ended."""


class TimeWentBackwards(EngineError):
    """A call passed a time earlier than one passed before."""


class PoolInvariantError(AssertionError):
    """The page accounting of a tier does not add up (a bug, never a user error)."""
