"""Checks the schema cannot express (they need the hardware profiles), and quantity arithmetic."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.operator.quantity import format_bytes, parse_quantity
from evolving_infra.operator.semantics import builtin_profile_table, host_memory_bytes, validate_spec_semantics
from evolving_infra.operator.spec import AgentServingClusterSpec


def _spec(**edits: Any) -> AgentServingClusterSpec:
    data: dict[str, Any] = {
        "nodeSelector": {"matchLabels": {"pool": "a"}},
        "nodeCount": 9,
        "engine": {"profile": "glm-5.2-4xgb300-tp4"},
        "initialSplit": {"prefill": 6, "decode": 3},
    }
    data.update(edits)
    return AgentServingClusterSpec.from_kube(data)


def test_a_sound_spec_has_no_problems() -> None:
    assert validate_spec_semantics(_spec()) == []
    for name in builtin_profile_table():
        assert validate_spec_semantics(_spec(engine={"profile": name})) == []


@pytest.mark.parametrize(
    "edits,expected",
    [
        ({"engine": {"profile": "llama-9-1xa100"}}, "engine.profile 'llama-9-1xa100' is not a known hardware profile; known: deepseek"),
        ({"gpusPerNode": 8}, "gpusPerNode (8) differs from profile glm-5.2-4xgb300-tp4's 4 GPUs per node"),
        ({"kvCache": {"l1Tokens": 50}}, "kvCache.l1Tokens (50) is smaller than one page (64 tokens)"),
        ({"kvCache": {"l2Tokens": 10}}, "kvCache.l2Tokens (10) is smaller than one page (64 tokens)"),
        ({"resources": {"nodeAgent": {"hostMemory": {"size": "1Gi"}}}}, "resources.nodeAgent.hostMemory.size (1Gi) cannot hold L2: 8250000 tokens x 54600 bytes"),
        ({"engine": {"backend": "sglang", "model": "m"}}, "resources.nodeAgent.hostMemory.size is required when engine.profile is unset"),
        ({"resources": {"router": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}}}, "resources.router.requests.cpu (2) exceeds resources.router.limits.cpu (1500m)"),
    ],
)
def test_each_problem_is_named(edits: dict[str, Any], expected: str) -> None:
    problems = validate_spec_semantics(_spec(**edits))
    assert any(p.startswith(expected) for p in problems), problems


def test_unknown_profile_is_checked_against_the_given_table() -> None:
    glm = builtin_profile_table()["glm-5.2-4xgb300-tp4"]
    assert validate_spec_semantics(_spec(), profiles={"other": glm})[0].startswith("engine.profile 'glm-5.2-4xgb300-tp4' is not")


def test_host_memory_defaults_to_l2_tokens_times_kv_bytes() -> None:
    glm = builtin_profile_table()["glm-5.2-4xgb300-tp4"]
    assert host_memory_bytes(_spec(), glm) == glm.l2_tokens * glm.kv_bytes_per_token
    assert host_memory_bytes(_spec(kvCache={"l2Tokens": 1000}), glm) == 1000 * glm.kv_bytes_per_token
    assert host_memory_bytes(_spec(resources={"nodeAgent": {"hostMemory": {"size": "2Gi"}}}), glm) == 2**31
    assert host_memory_bytes(_spec(engine={"backend": "sglang", "model": "m"}), None) is None


@pytest.mark.parametrize(
    "text,value",
    [("4Gi", 4 * 2**30), ("500m", Fraction(1, 2)), ("1.5e3", 1500), ("2", 2), (7, 7), ("1k", 1000), (".5Ki", 512), ("100n", Fraction(1, 10**7))],
)
def test_parse_quantity(text: int | str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["lots", "4GB", "", "1..2", True])
def test_parse_quantity_refuses_non_quantities(text: Any) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


@given(st.integers(0, 2**62))
def test_format_bytes_round_trips(n: int) -> None:
    assert parse_quantity(format_bytes(n)) == n


def test_the_reserved_sglang_backend_is_invalid_with_a_message_saying_why() -> None:
    problems = validate_spec_semantics(_spec(engine={"backend": "sglang", "model": "zai/GLM-5.2", "profile": "glm-5.2-4xgb300-tp4"}))
    assert problems == [
        "engine.backend 'sglang' is reserved: no node agent implements an SGLang engine yet, so nothing is deployed "
        "for this cluster; use engine.backend emulated"
    ]
