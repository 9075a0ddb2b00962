"""Phase-split planners: ours (eq. 5/6 with the appendix E.3 outer loop) and the baselines it is compared
with (Dynamo-style load planner that relaunches, Arrow-style TTFT/TPOT planner that strands KV, static split),
all behind one `Planner` protocol.

Boundary: pure decisions. A driver (router or simulator) records window slices with `SliceRecorder`, builds
a `PlannerObservation` every `planner.interval_s` seconds and applies the returned `PlannerDecision`.
The planner's view of a node is the `NodeModel` protocol (`CoefficientNodeModel` adapts coefficients).
"""

from evolving_infra.router.planner.arrow import ArrowPlanner, ArrowSettings, full_prompt_time
from evolving_infra.router.planner.base import (
    CheckingPlanner,
    NodeLoad,
    NodeStatus,
    Outcome,
    Planner,
    PlannerDecision,
    PlannerName,
    PlannerObservation,
    SwitchMode,
)
from evolving_infra.router.planner.diagnostics import (
    ArrowDiagnostics,
    CandidateDiagnostics,
    CandidateVerdict,
    Diagnostics,
    DynamoDiagnostics,
    OursDiagnostics,
    SliceDiagnostics,
    SliceUse,
    StaticDiagnostics,
    Want,
)
from evolving_infra.router.planner.dynamo import DynamoPlanner, DynamoSettings
from evolving_infra.router.planner.ours import OursPlanner, OursSettings
from evolving_infra.router.planner.registry import allowed_settings, make_planner, planner_name
from evolving_infra.router.planner.split import (
    changed_nodes,
    fewest_changes_split,
    format_split,
    nodes_to_move,
    parse_split,
    split_counts,
)
from evolving_infra.router.planner.static import StaticPlanner, StaticSettings
from evolving_infra.router.planner.throughput import (
    CoefficientNodeModel,
    NodeModel,
    SplitThroughput,
    batch_limit,
    decode_rate,
    prefill_rate,
    split_throughput,
)
from evolving_infra.router.planner.window import MeanWork, SliceRecorder, SliceStats, WindowConfig, merge_slices

__all__ = [
    "ArrowDiagnostics",
    "ArrowPlanner",
    "ArrowSettings",
    "CandidateDiagnostics",
    "CandidateVerdict",
    "CheckingPlanner",
    "CoefficientNodeModel",
    "Diagnostics",
    "DynamoDiagnostics",
    "DynamoPlanner",
    "DynamoSettings",
    "MeanWork",
    "NodeLoad",
    "NodeModel",
    "NodeStatus",
    "Outcome",
    "OursDiagnostics",
    "OursPlanner",
    "OursSettings",
    "Planner",
    "PlannerDecision",
    "PlannerName",
    "PlannerObservation",
    "SliceDiagnostics",
    "SliceRecorder",
    "SliceStats",
    "SliceUse",
    "SplitThroughput",
    "StaticDiagnostics",
    "StaticPlanner",
    "StaticSettings",
    "SwitchMode",
    "Want",
    "WindowConfig",
    "allowed_settings",
    "batch_limit",
    "changed_nodes",
    "decode_rate",
    "fewest_changes_split",
    "format_split",
    "full_prompt_time",
    "make_planner",
    "merge_slices",
    "nodes_to_move",
    "parse_split",
    "planner_name",
    "prefill_rate",
    "split_counts",
    "split_throughput",
]
