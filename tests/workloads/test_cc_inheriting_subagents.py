"""CC's spawned branches (issue #13 step 7): a sub-agent call starts several branches at once from the calling
request; each inherits the caller's whole context (a fork in the paper's terms, `subagent_inherit_prob`) or
starts a new context from the sub-agent prefix, and the caller's next request waits for all of them. The
structure holds for any seed and share, and the share never changes the main branch (own random streams)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from evolving_infra.workloads import generate
from evolving_infra.workloads.cc import SUB_PREFIX, CCParams

DEFAULTS = CCParams()


def _requests(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "request"]


def _main(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in _requests(records) if str(r["branch"]).endswith(".main")]


def _spawned_firsts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for r in _requests(records):
        if ".sub" in str(r["branch"]) and r["branch"] not in seen:
            seen.add(r["branch"])
            out.append(r)
    return out


def _context(records: list[dict[str, Any]]) -> dict[str, int]:
    return {r["id"]: r["input"]["keep"] + r["input"]["new"] + r["output_tokens"] for r in _requests(records)}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), share=st.floats(0.0, 1.0))
def test_spawned_branches_start_from_the_caller_or_the_sub_agent_prefix(seed: int, share: float) -> None:
    records = generate("cc", 2, seed, subagent_inherit_prob=share)
    by_id = {r["id"]: r for r in _requests(records)}
    context = _context(records)
    for first in _spawned_firsts(records):
        (caller,) = first["after"]
        assert by_id[caller]["branch"].endswith(".main"), "spawned by a main-branch request"
        source = first["input"]
        if "base" in source:
            assert source["base"] == caller and source["keep"] == context[caller], "the caller's whole context"
        else:
            assert source == {"shared": SUB_PREFIX, "keep": DEFAULTS.subagent_prefix_tokens, "new": source["new"]}
        assert source["keep"] + source["new"] + first["output_tokens"] <= DEFAULTS.max_context_tokens


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), share=st.floats(0.0, 1.0))
def test_the_caller_resumes_after_every_branch_it_spawned_on_its_whole_context(seed: int, share: float) -> None:
    records = generate("cc", 2, seed, subagent_inherit_prob=share)
    context = _context(records)
    last: dict[str, str] = {}
    caller_of: dict[str, str] = {}
    for r in _requests(records):
        if ".sub" in str(r["branch"]):
            caller_of.setdefault(r["branch"], r["after"][0])
            last[r["branch"]] = r["id"]
    spawned: dict[str, list[str]] = defaultdict(list)
    for branch, caller in caller_of.items():
        spawned[caller].append(last[branch])
    ends = {e["branch"]: e["after"] for e in records if e.get("kind") == "branch_end"}
    assert all(ends[b] == last[b] for b in caller_of), "every spawned branch ends after its last request"
    joins = {r["input"]["base"]: r for r in _main(records) if set(r["after"]) & {x for v in spawned.values() for x in v}}
    assert set(joins) == set(spawned)
    for caller, join in joins.items():
        assert join["after"] == spawned[caller], "waits for all the branches of the call, in spawn order"
        assert join["input"]["keep"] == context[caller], "resumes on the caller's whole context"


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), share=st.floats(0.0, 1.0))
def test_the_share_never_changes_the_main_branch(seed: int, share: float) -> None:
    def main_branch(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Main-branch requests, each waited-for request named by its branch (a spawned branch's length varies)."""
        branch = {r["id"]: r["branch"] for r in _requests(records)}
        return [{**r, "after": [branch[a] for a in r["after"]]} for r in _main(records)]

    assert main_branch(generate("cc", 2, seed, subagent_inherit_prob=share)) == main_branch(generate("cc", 2, seed))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31))
@example(seed=107469745)  # the task fits but not with its output: a new context
def test_all_or_none_inherit(seed: int) -> None:
    none = _spawned_firsts(generate("cc", 2, seed, subagent_inherit_prob=0.0))
    assert all(r["input"].get("shared") == SUB_PREFIX for r in none)
    records = generate("cc", 2, seed, subagent_inherit_prob=1.0)
    context = _context(records)
    for r in _spawned_firsts(records):
        if "base" not in r["input"]:  # only when the caller's context leaves no room for the task and its output
            # (the fallback's output is the sampled one: under the sub-agent prefix nothing is trimmed)
            assert context[r["after"][0]] + r["input"]["new"] + r["output_tokens"] > DEFAULTS.max_context_tokens


def test_inheriting_lengthens_prompts_without_touching_the_main_branch() -> None:
    from evolving_infra.workloads import shapes

    fresh, inherit = (shapes(generate("cc", 20, 4, subagent_inherit_prob=p))["cc"] for p in (0.0, 1.0))
    assert fresh.subagents > 0 and inherit.subagents == 0 and inherit.forks > fresh.forks
    assert inherit.mean_prompt > fresh.mean_prompt + 10_000
