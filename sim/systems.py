"""Presets of the systems the paper compares, each citing where its settings come from.

`build_config(system, **overrides)` starts from a preset and lets explicit settings override it; the result is
a validated `SimConfig`.

| system | planner | prefill routing | decode | eviction | data plane | pool | decode KV | models |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
| evolving | ours | ttft | fewest-requests | branch-count | async-fetch | shared | at prefill start | fitted |
| dynamo | dynamo (relaunch) | cache-aware | round-robin | lru | hicache-loadback | private | at routing | profile |
| best-static | static | cache-aware | round-robin | lru | hicache-loadback | private | at routing | profile |
| arrow | arrow (strands KV) | least-loaded | fewest-requests | lru | hicache-loadback | private | at prefill start | profile |
| cache-aware | static | cache-aware | round-robin | branch-count | async-fetch | shared | at prefill start | profile |
| thunderagent | static | cache-aware + pause | round-robin | lru | hicache-loadback | private | at routing | profile |

Boundary: data only.
"""

from __future__ import annotations

from typing import Any

from evolving_infra.sim.config import SimConfig, SystemName

_SGLANG_BASELINE: dict[str, Any] = {
    # paper 6.1 "Baselines": SGLang Model Gateway, cache-aware prefill routing with command-line defaults and
    # round-robin decode routing; HiCache with LRU on every node, host memory deduplicated but private.
    "prefill_routing": "cache-aware",
    "decode_routing": "round-robin",
    "eviction": "lru",
    "data_plane": "hicache-loadback",
    "shared_pool": False,
    # paper D.1: SGLang's decode engines reserve KV for a request from its queueing at a prefill node until
    # the transfer.
    "decode_reservation": "at-routing",
    "models": "profile",
    "collocated_warmup": False,
}

PRESETS: dict[SystemName, dict[str, Any]] = {
    # Ours (paper 4-5, E.3): planner eq. 5/6, TTFT routing eq. 7, decode bound at prefill start to the node with
    # KV room and the fewest requests, branch-count eviction (E.2), async fetches from the shared pool (4.2),
    # node models fitted during a collocated warmup (5.1).
    SystemName.EVOLVING: {
        "planner": "ours",
        "prefill_routing": "ttft",
        "decode_routing": "fewest-requests",
        "eviction": "branch-count",
        "data_plane": "async-fetch",
        "shared_pool": True,
        "decode_reservation": "at-prefill-start",
        "models": "fitted",
        "collocated_warmup": True,
    },
    # Dynamo v1.5.1 as configured in the paper (3, 6.1, C.1; baselines.md "Dynamo planner"): load planner that
    # relaunches a worker (node out of service, KV empty) on SGLang workers behind the gateway.
    SystemName.DYNAMO: {**_SGLANG_BASELINE, "planner": "dynamo"},
    # Best static split (6.1, D.1; baselines.md): SGLang PD disaggregation at a fixed split.
    SystemName.BEST_STATIC: {**_SGLANG_BASELINE, "planner": "static"},
    # Arrow-style (baselines.md "Arrow-style planner"): TTFT/TPOT planner, in-place switches that strand the
    # node's KV, each node keeps its KV in its own cache (no pool), and the scheduler ignores where KV is
    # cached (least-loaded prefill routing). Decode: the least-loaded node (fewest requests).
    SystemName.ARROW: {
        **_SGLANG_BASELINE,
        "planner": "arrow",
        "prefill_routing": "least-loaded",
        "decode_routing": "fewest-requests",
        "decode_reservation": "at-prefill-start",
    },
    # Ours engine and pool with SGLang's cache-aware routing at a static split (paper D.5, D.6 ablations).
    SystemName.CACHE_AWARE: {
        "planner": "static",
        "prefill_routing": "cache-aware",
        "decode_routing": "round-robin",
        "eviction": "branch-count",
        "data_plane": "async-fetch",
        "shared_pool": True,
        "decode_reservation": "at-prefill-start",
        "models": "profile",
        "collocated_warmup": False,
    },
    # ThunderAgent (paper D.5; baselines.md "Agent-aware schedulers"): cache-aware routing plus its program pause
    # rule, host memory counted in a node's capacity, on the SGLang baseline engines at a static split.
    SystemName.THUNDERAGENT: {**_SGLANG_BASELINE, "planner": "static", "pause_rule": "thunderagent"},
}


def preset(system: SystemName | str) -> dict[str, Any]:
    """The settings of a preset (a copy)."""
    return dict(PRESETS[_system(system)])


def build_config(system: SystemName | str | None = None, **overrides: Any) -> SimConfig:
    """A validated config: the preset of `system` (if any) with `overrides` (None values are ignored)."""
    data: dict[str, Any] = {}
    if system is not None:
        name = _system(system)
        data.update(PRESETS[name])
        data["system"] = name
    data.update({k: v for k, v in overrides.items() if v is not None})
    return SimConfig.model_validate(data)


def _system(system: SystemName | str) -> SystemName:
    if isinstance(system, SystemName):
        return system
    try:
        return SystemName(system)
    except ValueError:
        allowed = ", ".join(s.value for s in SystemName)
        raise ValueError(f"unknown system {system!r}; allowed: {allowed}") from None
