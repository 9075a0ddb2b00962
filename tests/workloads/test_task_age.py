"""A task met part-way through (`cc.cc_agent`'s `age`): fewer steps issued, the earlier ones in its first prompt."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.workloads import cc
from evolving_infra.workloads.fleet import FleetParams


def main_requests(records: list[dict]) -> list[dict]:
    return [r for r in records if r["kind"] == "request" and r["branch"].endswith(".main")]


def prompt(record: dict) -> int:
    source = record["input"]
    return int(source.get("keep", 0)) + int(source["new"])


@settings(max_examples=40, deadline=None)
@given(index=st.integers(0, 10_000), age=st.floats(0.05, 0.95), codex=st.booleans())
def test_an_aged_task_issues_fewer_steps_and_starts_from_a_longer_uncached_prompt(index: int, age: float,
                                                                                 codex: bool) -> None:
    params = FleetParams().codex if codex else FleetParams().cc
    fresh = cc.cc_agent(params, random.Random(index), "a", 0.0, "w")
    aged = cc.cc_agent(params, random.Random(index), "a", 0.0, "w", age)
    assert cc.cc_agent(params, random.Random(index), "a", 0.0, "w", 0.0) == fresh  # age 0 is the task as it was
    first_fresh, first_aged = main_requests(fresh)[0], main_requests(aged)[0]
    assert first_aged["input"].get("keep") == first_fresh["input"].get("keep")  # only the shared system prompt
    bound = params.compact_at_tokens - 1 - first_aged["output_tokens"]  # an aged context stops at the compaction bound
    assert prompt(first_aged) >= min(prompt(first_fresh), bound)
    assert prompt(first_aged) + first_aged["output_tokens"] < params.compact_at_tokens
    assert len(main_requests(aged)) >= 1


def test_aged_tasks_are_length_biased_and_their_first_prompt_carries_the_steps_before() -> None:
    params = FleetParams().codex  # ~30 main steps (log-normal, sigma 0.7) of ~3K tokens on an 8K first prompt

    def mean_of(age: float) -> tuple[float, float]:
        tasks = [main_requests(cc.cc_agent(params, random.Random(i), "a", 0.0, "w", age)) for i in range(200)]
        return sum(len(t) for t in tasks) / len(tasks), sum(t[0]["input"]["new"] for t in tasks) / len(tasks)

    fresh_steps, fresh_first = mean_of(0.0)
    half_steps, half_first = mean_of(0.5)
    late_steps, _ = mean_of(0.9)
    # A task in progress is longer than a fresh one (x exp(0.49) = 1.63 for the log-normal): half-way through it
    # still has ~0.8 of a fresh task's steps to go, not 0.5.
    assert 0.65 * fresh_steps < half_steps < 0.95 * fresh_steps
    assert late_steps < 0.3 * fresh_steps
    assert half_first > 5 * fresh_first  # ~20 steps of ~3K tokens on top of the 8K first prompt (new tokens)


@pytest.mark.parametrize("age", [-0.1, 1.0, 2.0])
def test_an_age_outside_zero_to_one_is_refused(age: float) -> None:
    with pytest.raises(ValueError, match="age"):
        cc.cc_agent(FleetParams().cc, random.Random(0), "a", 0.0, "w", age)
