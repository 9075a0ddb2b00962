"""The symmetric engine core (emulated): one pure scheduling loop for prefill, decode or both, over a
node's L1/L2 KV pool. Iteration times come from a hardware profile; time is passed in; no I/O.

Public contract: `EngineCore` and the request, effect and output types re-exported here; see
docs/engine.md for the step contract, request states, data planes, the switch state machine and the
invariants.
"""

from evolving_infra.node_agent.engine.engine import EngineCore, PrefillQueue, RunningChunk
from evolving_infra.node_agent.engine.errors import (
    DuplicateRequest,
    EngineBusy,
    EngineError,
    PoolInvariantError,
    RequestTooLarge,
    SwitchInProgress,
    TimeWentBackwards,
    UnknownRequest,
    WrongPhase,
)
from evolving_infra.node_agent.engine.kvpool import KvPool, PoolGauges
from evolving_infra.node_agent.engine.outputs import (
    DataPlane,
    DecodeFinished,
    Effects,
    EngineGauges,
    FetchStarted,
    IterationKind,
    PrefillFinished,
    PrefillStarted,
    StepOutput,
    SwitchBegun,
    SwitchReport,
    SwitchState,
)
from evolving_infra.core.fetch import FetchRun
from evolving_infra.node_agent.engine.requests import DecodeRequest, PrefillRequest
from evolving_infra.node_agent.engine.tier import TierGauges

__all__ = [
    "DataPlane",
    "DecodeFinished",
    "DecodeRequest",
    "DuplicateRequest",
    "Effects",
    "EngineBusy",
    "EngineCore",
    "EngineError",
    "EngineGauges",
    "FetchRun",
    "FetchStarted",
    "IterationKind",
    "KvPool",
    "PoolGauges",
    "PoolInvariantError",
    "PrefillFinished",
    "PrefillQueue",
    "PrefillRequest",
    "PrefillStarted",
    "RequestTooLarge",
    "RunningChunk",
    "StepOutput",
    "SwitchBegun",
    "SwitchInProgress",
    "SwitchReport",
    "SwitchState",
    "TierGauges",
    "TimeWentBackwards",
    "UnknownRequest",
    "WrongPhase",
]
