"""Emits the trace records of one agent (format version 1) while a generator walks its branches.

Invariant: records come out in an order the format accepts: the `agent` record first, then every request after
the requests it names in `after` and `base`, and each `branch_end` after its request. Every request keeps
`0 <= keep <= len(context(base))` (or `<= prefix tokens`), `keep + new >= 1` and `output_tokens >= 1`; the
builder checks this itself and raises `ValueError` on a generator bug rather than write a broken trace.

Boundary: builds plain dicts; no randomness, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BranchState:
    """Where a branch stands: its id, its last request and that request's context length (input + output)."""

    id: str
    last: str | None = None
    context: int = 0
    requests: int = 0
    marks: list[tuple[int, int]] = field(default_factory=list)
    """Generator-specific spans `(offset, tokens)` in the context, e.g. where each screenshot sits."""


class AgentBuilder:
    """Collects the records of one agent; `records` holds them in file order."""

    def __init__(self, agent: str, workload: str, start_s: float, prefixes: dict[str, int]) -> None:
        if start_s < 0:
            raise ValueError(f"agent {agent!r}: start_s must be >= 0, got {start_s}")
        self.agent = agent
        self.prefixes = prefixes
        self.records: list[dict[str, object]] = [
            {"kind": "agent", "agent": agent, "workload": workload, "start_s": round(start_s, 3)}
        ]
        self._context: dict[str, int] = {}
        self._branches: dict[str, BranchState] = {}

    def branch(self, name: str) -> BranchState:
        """A new branch `<agent>.<name>`; its first request decides whether it is a root, fork or sub-agent."""
        bid = f"{self.agent}.{name}"
        if bid in self._branches:
            raise ValueError(f"branch {bid!r} already exists")
        state = BranchState(bid)
        self._branches[bid] = state
        return state

    def context_of(self, request_id: str) -> int:
        return self._context[request_id]

    def request(
        self,
        branch: BranchState,
        *,
        after: list[str],
        delay_s: float,
        new: int,
        output: int,
        keep: int = 0,
        base: str | None = None,
        shared: str | None = None,
    ) -> str:
        """Append a request to `branch` and return its id (`<agent>.r<n>` on main, `<branch>.r<n>` elsewhere)."""
        rid = self._request_id(branch)
        if base is not None and shared is not None:
            raise ValueError(f"{rid}: give base or shared, not both")
        limit = self._context[base] if base is not None else self.prefixes[shared] if shared is not None else 0
        if not 0 <= keep <= limit:
            raise ValueError(f"{rid}: keep {keep} outside [0, {limit}]")
        if new < 0 or keep + new < 1 or output < 1 or delay_s < 0:
            raise ValueError(f"{rid}: bad sizes keep={keep} new={new} output={output} delay_s={delay_s}")
        for dep in after:
            if dep not in self._context:
                raise ValueError(f"{rid}: waits for unknown request {dep!r}")
        source: dict[str, object] = {"keep": keep, "new": new}
        if base is not None:
            source = {"base": base, **source}
        elif shared is not None:
            source = {"shared": shared, **source}
        self.records.append(
            {
                "kind": "request",
                "id": rid,
                "agent": self.agent,
                "branch": branch.id,
                "after": list(after),
                "delay_s": round(delay_s, 3),
                "input": source,
                "output_tokens": output,
            }
        )
        context = keep + new + output
        self._context[rid] = context
        branch.last = rid
        branch.context = context
        branch.requests += 1
        return rid

    def end(self, branch: BranchState) -> None:
        """Report that `branch` finished once its last request completes."""
        if branch.last is None:
            raise ValueError(f"branch {branch.id!r} has no request to end after")
        self.records.append({"kind": "branch_end", "branch": branch.id, "after": branch.last})

    def _request_id(self, branch: BranchState) -> str:
        n = branch.requests + 1
        main = branch.id == f"{self.agent}.main"
        return f"{self.agent}.r{n}" if main else f"{branch.id}.r{n}"
