"""Checks of a spec that the CRD schema cannot express, because they need the hardware profiles.

`validate_spec_semantics(spec)` returns one message per problem (empty when the spec can be applied); the
operator sets the `Invalid` condition from them and creates nothing. A reserved engine backend (`sglang`,
which no node agent implements yet) is one such problem. `effective_kv` and
`host_memory_bytes` resolve the profile's values against the spec's overrides, for the builders.

Boundary: pure functions; profiles are passed in (or the built-in ones are read once from package data).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.node_agent.profiles import builtin_profiles, load_profile
from evolving_infra.operator.quantity import format_bytes, parse_quantity
from evolving_infra.operator.spec import AgentServingClusterSpec, EngineBackend, Quantity

RESERVED_BACKENDS = frozenset({EngineBackend.SGLANG})
"""Backends the CRD accepts (their fields are settled) but no node agent implements yet: such a cluster is
Invalid and nothing is deployed for it."""


@functools.cache
def builtin_profile_table() -> Mapping[str, HardwareProfile]:
    """The built-in hardware profiles by name (read once)."""
    return {name: load_profile(name) for name in builtin_profiles()}


@dataclass(frozen=True, slots=True)
class EffectiveKv:
    """KV geometry after applying the spec's overrides to the profile; None where neither gives a value."""

    page_tokens: int
    l1_tokens: int | None
    l2_tokens: int | None
    kv_bytes_per_token: int | None


def resolve_profile(spec: AgentServingClusterSpec, profiles: Mapping[str, HardwareProfile]) -> HardwareProfile | None:
    return profiles.get(spec.engine.profile) if spec.engine.profile is not None else None


def effective_kv(spec: AgentServingClusterSpec, profile: HardwareProfile | None) -> EffectiveKv:
    kv = spec.kv_cache
    return EffectiveKv(
        page_tokens=kv.page_tokens or (profile.page_tokens if profile else 64),
        l1_tokens=kv.l1_tokens or (profile.l1_tokens if profile else None),
        l2_tokens=kv.l2_tokens or (profile.l2_tokens if profile else None),
        kv_bytes_per_token=profile.kv_bytes_per_token if profile else None,
    )


def host_memory_bytes(spec: AgentServingClusterSpec, profile: HardwareProfile | None) -> Fraction | None:
    """Host memory of the L2 pool: the spec's size, else L2 tokens times KV bytes per token."""
    size = spec.resources.node_agent.host_memory.size
    if size is not None:
        return parse_quantity(size)
    kv = effective_kv(spec, profile)
    if kv.l2_tokens is None or kv.kv_bytes_per_token is None:
        return None
    return Fraction(kv.l2_tokens * kv.kv_bytes_per_token)


def validate_spec_semantics(
    spec: AgentServingClusterSpec, profiles: Mapping[str, HardwareProfile] | None = None
) -> list[str]:
    """Problems that make `spec` impossible to apply, each naming the field, the value and what is allowed."""
    table = builtin_profile_table() if profiles is None else profiles
    problems: list[str] = []
    if spec.engine.backend in RESERVED_BACKENDS:
        problems.append(
            f"engine.backend {spec.engine.backend.value!r} is reserved: no node agent implements an SGLang engine yet, "
            f"so nothing is deployed for this cluster; use engine.backend emulated"
        )
    name = spec.engine.profile
    profile = resolve_profile(spec, table)
    if name is not None and profile is None:
        problems.append(f"engine.profile {name!r} is not a known hardware profile; known: {', '.join(sorted(table))}")
    if profile is not None and profile.gpus_per_node != spec.gpus_per_node:
        problems.append(
            f"gpusPerNode ({spec.gpus_per_node}) differs from profile {name}'s {profile.gpus_per_node} GPUs per node"
        )
    kv = effective_kv(spec, profile)
    for field, tokens in (("l1Tokens", kv.l1_tokens), ("l2Tokens", kv.l2_tokens)):
        if tokens is not None and tokens < kv.page_tokens:
            problems.append(f"kvCache.{field} ({tokens}) is smaller than one page ({kv.page_tokens} tokens)")
    problems.extend(_host_memory_problems(spec, profile, kv))
    resources = spec.resources
    for part, requests, limits in (
        ("router", resources.router.requests, resources.router.limits),
        ("nodeAgent", resources.node_agent.requests, resources.node_agent.limits),
    ):
        problems.extend(_request_limit_problems(part, requests, limits or {}))
    problems.extend(_policy_settings_problems(spec))
    return problems


def _policy_settings_problems(spec: AgentServingClusterSpec) -> list[str]:
    """The chosen policies' settings (the typed fields plus `planner.settings`, `routing.prefillSettings`,
    `routing.decodeSettings`) checked against their declarations, as the router will check them at start."""
    from evolving_infra.core.plugins import PolicyError
    from evolving_infra.operator.rendered import chosen_policies  # rendered builds on this module

    problems: list[str] = []
    for policy in chosen_policies(spec):
        try:
            policy.validate()
        except PolicyError as error:
            problems.append(str(error))
    return problems


def _host_memory_problems(spec: AgentServingClusterSpec, profile: HardwareProfile | None, kv: EffectiveKv) -> list[str]:
    size = spec.resources.node_agent.host_memory.size
    if size is None:
        if profile is None and spec.engine.profile is None:
            return ["resources.nodeAgent.hostMemory.size is required when engine.profile is unset "
                    "(the KV bytes per token that size L2 come from the profile)"]  # fmt: skip
        return []
    try:
        given = parse_quantity(size)
    except ValueError as exc:
        return [f"resources.nodeAgent.hostMemory.size: {exc}"]
    if kv.l2_tokens is None or kv.kv_bytes_per_token is None:
        return []
    needed = kv.l2_tokens * kv.kv_bytes_per_token
    if given < needed:
        return [
            f"resources.nodeAgent.hostMemory.size ({size}) cannot hold L2: {kv.l2_tokens} tokens x "
            f"{kv.kv_bytes_per_token} bytes = {format_bytes(needed)}; raise the size or lower kvCache.l2Tokens"
        ]
    return []


def _request_limit_problems(part: str, requests: Mapping[str, Quantity], limits: Mapping[str, Quantity]) -> list[str]:
    problems = []
    for key in sorted(set(requests) & set(limits)):
        try:
            above = parse_quantity(requests[key]) > parse_quantity(limits[key])
        except ValueError as exc:
            problems.append(f"resources.{part}.{key}: {exc}")
            continue
        if above:
            problems.append(
                f"resources.{part}.requests.{key} ({requests[key]}) exceeds resources.{part}.limits.{key} ({limits[key]})"
            )
    return problems
