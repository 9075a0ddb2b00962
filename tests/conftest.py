"""Shared test settings: hypothesis profiles sized for a 2-core machine, and the `live` mark.

`HYPOTHESIS_PROFILE=thorough` runs many more examples locally; the default keeps the suite fast.

`live`: tests that start real processes or servers (local clusters, the router and node agent services, KV
transfers, the gateway, the peers' side environments) and check what they do in wall-clock time. They are marked
here by file; `scripts/test.sh` runs them in one process at normal priority and the rest on two workers beside them
at the lowest priority (`nice -n 19`), so other tests take only the CPU they leave idle (three of them failed when
other jobs competed at equal priority: a 10 % bound on the replay's TTFT, a switch's re-routing, a relaunch).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


_LIVE = (
    "local/",
    "peers/",
    "router/test_service_",
    "node_agent/test_service_",
    "node_agent/test_transfer_",
    "fleet/test_gateway_processes.py",
)
"""Test files (relative to tests/) marked `live`: by directory, or by the start of their path."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        try:
            rel = item.path.relative_to(here).as_posix()
        except ValueError:
            continue
        if rel.startswith(_LIVE):
            item.add_marker(pytest.mark.live)
