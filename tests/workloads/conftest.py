"""Generated traces shared by the workload tests: each kind once per session, a few hundred agents."""

from __future__ import annotations

import pytest

from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.stats import TraceStats, trace_stats
from evolving_infra.workloads import generate

SIZES = {"putnam": 300, "cc": 300, "osworld": 300, "mixed": 300, "shift": 600, "fleet": 300}


@pytest.fixture(scope="session")
def generated() -> dict[str, list[dict[str, object]]]:
    return {kind: generate(kind, n, seed=7) for kind, n in SIZES.items()}


@pytest.fixture(scope="session")
def stats(generated: dict[str, list[dict[str, object]]]) -> dict[str, TraceStats]:
    """`trace_stats` (64-token pages) of each generated trace, validated by the trace loader first."""
    return {kind: trace_stats(trace_from_records(records, source=kind)) for kind, records in generated.items()}
