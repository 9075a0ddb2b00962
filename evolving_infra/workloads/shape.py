"""The shape of a generated workload, per workload label: what each kind documents about itself.

Counts branches by how they start (sub-agent: from a shared prefix or nothing; fork: from a request of the agent),
compactions and other rewrites (a branch's request that keeps less than its predecessor's context), mean fresh
input, output and prompt per request, the mean pause (`delay_s` of requests that wait for an earlier one), and the
token-level ideal reuse: the share of prompt tokens whose KV an earlier request produced, in total and for the
request after each kind of wait (tool, compaction, sub-agent or fork), as figure 2c of the paper reports them.
Token-level means pages are ignored; page-exact statistics are `evolving_infra.traces`' business.

Boundary: pure computation over records already generated (trusted to be valid).
"""

from __future__ import annotations

import enum
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field


class Wait(enum.Enum):
    """What a branch's later request waited for: its own previous request (a tool, the user), a rewrite of its
    context (compaction, dropped screenshots), or other branches (sub-agents, forks)."""

    TOOL = "tool"
    REWRITE = "rewrite"
    JOIN = "join"


@dataclass
class Shape:
    """Totals for one workload label; the properties give the means."""

    agents: int = 0
    requests: int = 0
    branches: int = 0
    side_requests: int = 0
    """Requests of branches spawned by another (sub-agents and forks), not of an agent's root branch."""
    subagents: int = 0
    forks: int = 0
    rewrites: int = 0
    new_tokens: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    max_context: int = 0
    pauses: int = 0
    pause_s: float = 0.0
    waits: dict[Wait, list[float]] = field(default_factory=dict)
    """Per kind of wait: `[requests, sum of delay_s, sum of reuse fractions]`."""

    @property
    def mean_new(self) -> float:
        return self.new_tokens / self.requests if self.requests else 0.0

    @property
    def mean_output(self) -> float:
        return self.output_tokens / self.requests if self.requests else 0.0

    @property
    def mean_prompt(self) -> float:
        return self.prompt_tokens / self.requests if self.requests else 0.0

    @property
    def mean_ideal_uncached(self) -> float:
        """Prompt tokens per request whose KV no earlier request produced: what even a perfect cache prefills."""
        return (self.prompt_tokens - self.reused_tokens) / self.requests if self.requests else 0.0

    @property
    def side_share(self) -> float:
        return self.side_requests / self.requests if self.requests else 0.0

    @property
    def mean_pause_s(self) -> float:
        return self.pause_s / self.pauses if self.pauses else 0.0

    @property
    def ideal_hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def requests_per_agent(self) -> float:
        return self.requests / self.agents if self.agents else 0.0

    def wait(self, kind: Wait) -> tuple[int, float, float]:
        """`(requests, mean delay_s, mean reuse fraction)` of the requests after a wait of `kind`."""
        n, delay, reuse = self.waits.get(kind, [0, 0.0, 0.0])
        return int(n), (delay / n if n else 0.0), (reuse / n if n else 0.0)


def shapes(records: Iterable[Mapping[str, object]], only: Container[str] | None = None) -> dict[str, Shape]:
    """Shape per workload label, in order of first appearance; with `only`, of the requests whose ids it holds
    (every request still updates the contexts that later ones reuse; agents count once they have one)."""
    out: dict[str, Shape] = {}
    counted_agents: set[str] = set()
    side: set[str] = set()
    label_of: dict[str, str] = {}
    prefix_seen: dict[str, int] = {}
    context: dict[str, int] = {}
    branch_of: dict[str, str] = {}
    last_in_branch: dict[str, str] = {}
    for rec in records:
        kind = rec.get("kind")
        if kind == "agent":
            label = str(rec["workload"])
            label_of[str(rec["agent"])] = label
            out.setdefault(label, Shape()).agents += 0 if only is not None else 1
        elif kind == "request":
            s = out[label_of[str(rec["agent"])]]
            rid, branch = str(rec["id"]), str(rec["branch"])
            spec = rec["input"]
            assert isinstance(spec, Mapping)
            keep = int(spec.get("keep", 0))
            new, output = int(spec["new"]), int(rec["output_tokens"])  # type: ignore[call-overload]  # record values are typed object
            base, shared = spec.get("base"), spec.get("shared")
            prompt = keep + new
            if base is not None:
                reused = min(keep, context[str(base)] - 1)  # the last output token is never fed back
            elif shared is not None:
                reused = min(keep, prefix_seen.get(str(shared), 0))
                prefix_seen[str(shared)] = max(prefix_seen.get(str(shared), 0), keep)
            else:
                reused = 0
            after = [str(a) for a in rec.get("after") or []]  # type: ignore[attr-defined]  # record values are typed object
            previous = last_in_branch.get(branch)
            if previous is None and after:
                side.add(branch)
            counted = only is None or rid in only
            if counted:
                _count(s, rec, branch, previous, after, base, keep, prompt, reused, new, output, context, branch_of,
                       side)  # fmt: skip
                agent = str(rec["agent"])
                if only is not None and agent not in counted_agents:
                    counted_agents.add(agent)
                    s.agents += 1
            context[rid] = prompt + output
            branch_of[rid] = branch
            last_in_branch[branch] = rid
    return out


def _count(s: Shape, rec: Mapping[str, object], branch: str, previous: str | None, after: list[str],
           base: object, keep: int, prompt: int, reused: int, new: int, output: int, context: Mapping[str, int],
           branch_of: Mapping[str, str], side: Container[str]) -> None:  # fmt: skip
    """Add one request to the totals of `s`."""
    delay = float(rec.get("delay_s") or 0.0)  # type: ignore[arg-type]  # record values are typed object
    if previous is None:
        s.branches += 1
        if base is not None:
            s.forks += 1
        elif after:
            s.subagents += 1
    else:
        if base != previous or keep != context[previous]:
            s.rewrites += 1
            wait = Wait.REWRITE
        elif any(branch_of[a] != branch for a in after):
            wait = Wait.JOIN
        else:
            wait = Wait.TOOL
        w = s.waits.setdefault(wait, [0, 0.0, 0.0])
        w[0] += 1
        w[1] += delay
        w[2] += reused / prompt
    if after:
        s.pauses += 1
        s.pause_s += delay
    s.requests += 1
    s.side_requests += branch in side
    s.new_tokens += new
    s.output_tokens += output
    s.prompt_tokens += prompt
    s.reused_tokens += reused
    s.max_context = max(s.max_context, prompt + output)


def format_shape(label: str, s: Shape) -> str:
    """One paragraph describing a shape, for the CLI and the docs."""
    lines = [
        f"{label}: {s.agents} agents, {s.requests} requests ({s.requests_per_agent:.1f}/agent), {s.branches} "
        f"branches ({s.subagents} sub-agents, {s.forks} forks), {s.rewrites} rewrites (compactions/truncations)",
        f"  per request: new input {s.mean_new:,.0f}, output {s.mean_output:,.0f}, prompt {s.mean_prompt:,.0f} "
        f"tokens; max context {s.max_context:,}; mean pause {s.mean_pause_s:.1f} s; "
        f"ideal token reuse {100 * s.ideal_hit_rate:.1f} % ({s.mean_ideal_uncached:,.0f} uncached tokens per "
        f"request with a perfect cache); {100 * s.side_share:.1f} % of requests in sub-agent/fork branches",
    ]
    parts = []
    for kind in Wait:
        n, delay, reuse = s.wait(kind)
        if n:
            parts.append(f"after {kind.value}: {n} requests, wait {delay:.1f} s, reuse {100 * reuse:.1f} %")
    if parts:
        lines.append("  " + "; ".join(parts))
    return "\n".join(lines)
