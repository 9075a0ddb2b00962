"""OSWorld: a computer-use agent (Anthropic's computer-use agent on OSWorld 2.0) that is prefill-heavy.

Shape (paper sections 2.1 and 6.1, figure 2a, table C.3): every step appends a new screenshot (thousands of image
tokens) and a little action text, and generates a short action; the pause for executing the action is ~1 s; tasks
run many steps. The workload is multi-agent: now and then a step hands work to a sub-agent (a new branch from the
shared system prompt that takes its own screenshots) and waits for it. A context that would pass the bound drops its
oldest screenshots in one chunk, as computer-use harnesses do: the prompt keeps the prefix up to the first dropped
screenshot and carries the rest (whose positions moved) as fresh tokens.

Boundary: pure; randomness only from the `random.Random` passed in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evolving_infra.workloads.builder import AgentBuilder, BranchState
from evolving_infra.workloads.common import (
    CommonParams,
    Record,
    check_nonnegative,
    check_probability,
    fit,
    shared_start,
)
from evolving_infra.workloads.dist import LogNormal
from evolving_infra.workloads.params import param

PREFIX = "osworld:system"


@dataclass(frozen=True)
class OSWorldParams(CommonParams):
    """Sizes, pauses and sub-agent rates of an OSWorld agent; every default names its source."""

    system_prefix_tokens: int = param(
        4_000, "assumption: the computer-use system prompt and tool schema, shared by every task"
    )
    task_tokens: LogNormal = param(LogNormal(300, 0.5, lo=20, hi=4_000), "assumption: the task instruction")
    screenshot_tokens: LogNormal = param(
        LogNormal(2_700, 0.0, lo=1),
        "section 2.1: each step appends a screenshot; assumption: a 1920x1080 screen at one token per 28x28 "
        "pixels (14-pixel patches merged 2x2) is ~2.7K tokens; consistent with table C.1 (h* ~94 %) and D.1's "
        "91 % decode reservation, which together allow ~3K uncached tokens per request",
    )
    action_text_tokens: LogNormal = param(
        LogNormal(80, 0.6, lo=5, hi=2_000), "assumption: the text of an action's result beside the screenshot"
    )
    output_tokens: LogNormal = param(
        LogNormal(150, 0.7, lo=10, hi=8_000),
        "calibrated against table D.1 best static under SGLang (OSWorld 128, 6P3D: E2E minus TTFT is 0.5 s, i.e. "
        "~100-150 tokens at a few ms per token); short outputs next to the new input (figure 2a); was 350, an "
        "assumption",
    )
    steps: LogNormal = param(
        LogNormal(22, 0.6, lo=2, hi=100),
        "figure 2a: many steps per task; hi=100 is OSWorld's usual step budget; the mean sets the mean prompt "
        "(~48K tokens) between two paper figures: table C.1's ideal hit rate (~94 %; 22 steps give 93.6-93.8 %) "
        "and D.1's SGLang decode reservations at 91 % of three Kimi decode nodes (~45K-token prompts; 22 steps "
        "fill 96-98 %); was 50 (a first calibration that sought D.1's TTFT in longer contexts before the Kimi "
        "prefill profile was calibrated), and 25 before that, an assumption",
    )
    pause_s: LogNormal = param(
        LogNormal(1.2, 0.4, lo=0.1, hi=30.0), "table C.3: mean pause between OSWorld requests 1.0-1.4 s"
    )
    subagent_prob: float = param(
        0.01, "section 6.1: OSWorld is multi-agent; the share of steps that call a sub-agent is an assumption"
    )
    subagent_steps: LogNormal = param(LogNormal(6, 0.5, lo=1, hi=30), "assumption: requests of a sub-agent")
    subagent_task_tokens: LogNormal = param(
        LogNormal(200, 0.5, lo=10, hi=2_000), "assumption: the task a sub-agent receives"
    )
    subagent_result_tokens: LogNormal = param(
        LogNormal(300, 0.6, lo=10, hi=4_000), "assumption: what a sub-agent returns to its parent"
    )
    screenshot_drop_chunk: int = param(
        10,
        "assumption: at the context bound the harness drops this many of the oldest screenshots at once (as "
        "computer-use harnesses do, in chunks, to keep prefixes cacheable)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_nonnegative("system_prefix_tokens", self.system_prefix_tokens)
        check_probability("subagent_prob", self.subagent_prob)
        if self.screenshot_drop_chunk < 1:
            raise ValueError(f"screenshot_drop_chunk must be >= 1, got {self.screenshot_drop_chunk}")
        if self.system_prefix_tokens >= self.max_context_tokens // 2:
            raise ValueError("system_prefix_tokens must be below half of max_context_tokens")


def prefixes(p: OSWorldParams) -> dict[str, int]:
    return {PREFIX: p.system_prefix_tokens} if p.system_prefix_tokens > 0 else {}


class _OSWorldAgent:
    def __init__(self, p: OSWorldParams, rng: random.Random, b: AgentBuilder) -> None:
        self.p, self.rng, self.b = p, rng, b
        self.subs = 0

    def begin(self, br: BranchState, text: int, after: list[str], delay_s: float) -> None:
        """The branch's first request: shared prompt, task text and the first screenshot."""
        p = self.p
        start = shared_start(PREFIX, p.system_prefix_tokens)
        keep = int(start.get("keep", 0))
        shot = p.screenshot_tokens.sample_int(self.rng)
        sizes = fit(keep, text + shot, p.output_tokens.sample_int(self.rng), p.max_context_tokens)
        assert sizes is not None, "the system prompt is below half of the context bound"
        new, out = sizes
        shot = min(shot, new)
        self.b.request(br, after=after, delay_s=delay_s, new=new, output=out, **start)
        br.marks.append((keep + new - shot, shot))

    def step(self, br: BranchState, text: int, pause: float, after: list[str] | None = None) -> bool:
        """Append action text and a screenshot; drop the oldest screenshots first if the bound requires it."""
        p, rng = self.p, self.rng
        assert br.last is not None
        shot = p.screenshot_tokens.sample_int(rng)
        out = p.output_tokens.sample_int(rng)
        length = keep = br.context
        marks = list(br.marks)
        while length + text + shot + out > p.max_context_tokens:
            if len(marks) <= 1:
                return False
            dropped = marks[: min(p.screenshot_drop_chunk, len(marks) - 1)]
            gone = sum(t for _, t in dropped)
            # the kept prefix ends at the first dropped screenshot; what followed it (minus the dropped images)
            # now sits at new positions, so its KV is fresh
            keep = min(keep, dropped[0][0])
            length -= gone
            marks = [(o - gone, t) for o, t in marks[len(dropped) :]]
        carried = length - keep
        br.marks = marks
        offset = keep + carried + text
        self.b.request(br, after=after or [br.last], delay_s=pause, base=br.last, keep=keep,
                       new=carried + text + shot, output=out)  # fmt: skip
        br.marks.append((offset, shot))
        return True

    def run(self) -> None:
        p, rng, b = self.p, self.rng, self.b
        main = b.branch("main")
        self.begin(main, p.task_tokens.sample_int(rng), [], 0.0)
        for _ in range(max(1, p.steps.sample_int(rng)) - 1):
            if rng.random() < p.subagent_prob:
                ok = self.call_subagent(main)
            else:
                ok = self.step(main, p.action_text_tokens.sample_int(rng), p.pause_s.sample(rng))
            if not ok:
                break

    def call_subagent(self, main: BranchState) -> bool:
        p, rng, b = self.p, self.rng, self.b
        assert main.last is not None
        caller = main.last
        self.subs += 1
        sub = b.branch(f"sub{self.subs}")
        self.begin(sub, p.subagent_task_tokens.sample_int(rng), [caller], p.pause_s.sample(rng))
        for _ in range(max(1, p.subagent_steps.sample_int(rng)) - 1):
            if not self.step(sub, p.action_text_tokens.sample_int(rng), p.pause_s.sample(rng)):
                break
        b.end(sub)
        assert sub.last is not None
        return self.step(main, p.subagent_result_tokens.sample_int(rng), p.pause_s.sample(rng), after=[sub.last])


def osworld_agent(
    p: OSWorldParams, rng: random.Random, agent_id: str, start_s: float, workload: str = "osworld"
) -> list[Record]:
    """The records of one OSWorld agent."""
    b = AgentBuilder(agent_id, workload, start_s, prefixes(p))
    _OSWorldAgent(p, rng, b).run()
    return b.records
