"""CC sub-agents that inherit their parent's whole context (`subagent_inherit_prob`, issue #13 step 7): their
first request continues the calling request's context; with the share at 0 the trace is the earlier one."""

from __future__ import annotations

from typing import Any

from evolving_infra.workloads import generate


def _first_of_subagents(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for r in records:
        if r.get("kind") == "request" and ".sub" in str(r.get("branch")) and r["branch"] not in seen:
            seen.add(r["branch"])
            out.append(r)
    return out


def test_inheriting_subagents_start_from_the_callers_context() -> None:
    records = generate("cc", 6, 3, subagent_inherit_prob=1.0)
    by_id = {r["id"]: r for r in records if r.get("kind") == "request"}
    firsts = _first_of_subagents(records)
    assert firsts, "the agents called sub-agents"
    for r in firsts:
        caller = by_id[r["input"]["base"]]
        assert ".sub" not in caller["branch"] and r["after"] == [caller["id"]]
        assert r["input"]["keep"] > 20_000  # the caller's context, not the sub-agent prefix


def test_no_inheritance_keeps_the_sub_agent_prefix_and_the_same_trace() -> None:
    default = generate("cc", 4, 5)
    assert default == generate("cc", 4, 5, subagent_inherit_prob=0.0)
    assert all(r["input"].get("shared") == "cc:subagent" for r in _first_of_subagents(default))
