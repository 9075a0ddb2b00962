"""Built-in workloads of the local cluster, sized for a small machine (2 cores, a minute or two of wall time).

Each preset is a generated trace (a workload kind with scaled-down sizes) plus how to replay it and the cluster
to run it on: nodes and initial split, the speed-up of emulated time, and the planner window, slices and cooldown
(in emulated seconds, so that windows fit in the run).

- `shift` (the default): 4 nodes at 2P2D. A decode-heavy period (Putnam-like agents: short new inputs, long
  outputs, long pauses) and then a prefill-heavy one (OSWorld-like agents: large fresh screenshots, short outputs,
  short pauses), replayed open loop at the agents' start times. The planner, with windows of 40 emulated
  seconds, moves a node to decode during the first period and back to prefill once one prefill node no longer
  keeps up with the screenshots.
- `tiny`: 4 Putnam-like agents with a few short requests on 3 nodes (1P2D); seconds (the test suite runs it).
- `putnam`, `osworld`, `cc`: one scaled-down kind each, closed loop.

Why the shift re-splits: the planner's decode throughput estimate follows the arrival rate and rises with more
decode nodes (smaller batches iterate faster), so with prefill to spare it moves nodes to decode; once the
prefill demand of the screenshots exceeds what the prefill nodes can do, a split with more prefill nodes
predicts more throughput and it moves one back.

Boundary: pure data and trace generation; no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Trace
from evolving_infra.workloads.compose import Period, ShiftParams
from evolving_infra.workloads.generate import default_params, generate_with
from evolving_infra.workloads.params import with_overrides


class PresetName(enum.Enum):
    TINY = "tiny"
    SHIFT = "shift"
    CC = "cc"
    PUTNAM = "putnam"
    OSWORLD = "osworld"


_PUTNAM_SMALL: dict[str, Any] = {
    "system_prefix_tokens": 1000, "problem_tokens": 400, "steps": 4, "output_tokens": 300,
    "observation_tokens": 200, "pause_s": 10.0, "max_context_tokens": 16000,
}  # fmt: skip
_OSWORLD_SMALL: dict[str, Any] = {
    "system_prefix_tokens": 1000, "task_tokens": 200, "screenshot_tokens": 12000, "action_text_tokens": 60,
    "output_tokens": 24, "steps": 3, "pause_s": 1.0, "max_context_tokens": 40000, "subagent_prob": 0.0,
}  # fmt: skip
_CC_SMALL: dict[str, Any] = {
    "system_prefix_tokens": 4000, "subagent_prefix_tokens": 2000, "first_prompt_tokens": 800, "main_steps": 12,
    "tool_result_tokens": 300, "output_tokens": 120, "tool_pause_s": 4.0, "user_turn_prob": 0.0,
    "subagent_call_prob": 0.05, "subagent_steps": 4, "subagent_task_tokens": 200, "subagent_result_tokens": 300,
    "fork_prob": 0.05, "fork_steps": 2, "compact_at_tokens": 14000, "max_context_tokens": 16000,
    "compaction_summary_tokens": 600, "compaction_restore_tokens": 3000, "compaction_instruction_tokens": 100,
}  # fmt: skip


@dataclass(frozen=True)
class Preset:
    """A built-in workload and the cluster it runs on (times in emulated seconds unless named wall)."""

    name: PresetName
    summary: str
    kind: str
    overrides: Mapping[str, Any]
    agents: int
    """Closed loop: agents kept active; open loop (shift): the shift's concurrency scale."""
    closed_loop: bool
    nodes: int = 4
    prefill: int = 2
    speed_up: float = 4.0
    window_s: float = 40.0
    slices: int = 4
    cooldown_s: float = 20.0
    duration_s: float | None = None
    """Wall seconds of replay (None: until the trace ends)."""
    trace_agents: int | None = None
    """Agents in the generated trace (None: 2 x agents for closed loop)."""
    period_s: tuple[float, float] = (200.0, 200.0)
    extra: Mapping[str, Any] = field(default_factory=dict)
    warmup_s: float = 0.0
    """Collocated warmup (algorithm E.3) before the initial split, emulated seconds."""

    def trace(self, seed: int, agents: int | None = None) -> Trace:
        """The preset's trace for `seed` (and, if given, `agents` instead of its own agent count)."""
        n = self.agents if agents is None else agents
        if self.kind == "shift":
            params = shift_params(n, self.period_s)
            records = generate_with("shift", params.closed_loop_agents(), seed, params)
        else:
            params = with_overrides(default_params(self.kind), dict(self.overrides))
            total = self.trace_agents if self.trace_agents is not None and agents is None else 2 * n
            records = generate_with(self.kind, total, seed, params)
        return trace_from_records(records, source=f"preset {self.name.value}")


def shift_params(scale: int, period_s: tuple[float, float]) -> ShiftParams:
    """Putnam-like agents, then OSWorld-like ones: `scale` concurrent agents of each in turn (each period
    `period_s` emulated seconds)."""
    base = with_overrides(
        default_params("shift"),
        {**{f"putnam.{k}": v for k, v in _PUTNAM_SMALL.items()}, **{f"osworld.{k}": v for k, v in _OSWORLD_SMALL.items()}},
    )
    periods = (
        Period("decode-heavy", period_s[0], {"putnam": scale}),
        Period("prefill-heavy", period_s[1], {"osworld": scale}),
    )
    return dataclasses.replace(base, periods=periods, e2e_estimate_s={"putnam": 1.5, "osworld": 0.7})


PRESETS: dict[PresetName, Preset] = {
    p.name: p
    for p in (
        Preset(PresetName.SHIFT, "decode-heavy then prefill-heavy agents on 4 nodes; the planner re-splits",
               "shift", {}, agents=4, closed_loop=False, speed_up=4.0, duration_s=95.0, warmup_s=20.0),
        Preset(PresetName.TINY, "4 small Putnam-like agents on 3 nodes (1P2D), a few seconds",
               "putnam", {**_PUTNAM_SMALL, "system_prefix_tokens": 256, "problem_tokens": 128, "steps": 3,
                          "output_tokens": 64, "observation_tokens": 64, "pause_s": 2.0},
               agents=4, closed_loop=True, nodes=3, prefill=1, speed_up=10.0, trace_agents=4),
        Preset(PresetName.PUTNAM, "decode-heavy math agents (scaled down), closed loop",
               "putnam", _PUTNAM_SMALL, agents=8, closed_loop=True, duration_s=60.0),
        Preset(PresetName.OSWORLD, "prefill-heavy computer-use agents (scaled down), closed loop",
               "osworld", _OSWORLD_SMALL, agents=8, closed_loop=True, duration_s=60.0),
        Preset(PresetName.CC, "coding agents with sub-agents, forks and compaction (scaled down), closed loop",
               "cc", _CC_SMALL, agents=6, closed_loop=True, duration_s=60.0),
    )  # fmt: skip
}


def preset(name: PresetName | str) -> Preset:
    try:
        return PRESETS[PresetName(name)]
    except ValueError:
        allowed = ", ".join(p.value for p in PresetName)
        raise ValueError(f"unknown preset {name!r}; allowed: {allowed}") from None
