"""A simulation runs with its collection thresholds (`gcspacing`) and leaves the process's as they were; the
results do not depend on them."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from evolving_infra.sim.gcspacing import THRESHOLDS, spaced_collections
from evolving_infra.sim.kernel import Progress
from evolving_infra.sim.run import simulate, workload_trace
from evolving_infra.sim.systems import build_config


@pytest.fixture
def default_thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield (700, 10, 10)
    gc.set_threshold(*before)


def test_a_simulation_collects_with_its_thresholds_and_restores_the_process_ones(
    default_thresholds: tuple[int, int, int],
) -> None:
    seen: list[tuple[int, int, int]] = []
    cfg = build_config("evolving", agents=4, nodes=4, split="2P2D", seed=1, warmup_s=0, duration_s=30,
                       models="profile")  # fmt: skip

    def progress(_: Progress) -> None:
        seen.append(gc.get_threshold())

    spaced = simulate(cfg, workload_trace("putnam", 8, 1), progress=progress, progress_every=200)
    assert seen and set(seen) == {THRESHOLDS}
    assert gc.get_threshold() == default_thresholds
    with spaced_collections((700, 10, 10)):  # the same run with the default thresholds: the same results
        plain = simulate.__wrapped__(cfg, workload_trace("putnam", 8, 1))  # type: ignore[attr-defined]
    assert spaced.records == plain.records and spaced.metrics.to_dict() == plain.metrics.to_dict()


def test_nested_uses_restore_the_outer_thresholds(default_thresholds: tuple[int, int, int]) -> None:
    with spaced_collections((1000, 5, 5)):
        with spaced_collections():
            assert gc.get_threshold() == THRESHOLDS
        assert gc.get_threshold() == (1000, 5, 5)
    assert gc.get_threshold() == default_thresholds
    with pytest.raises(RuntimeError), spaced_collections():
        raise RuntimeError("a failed run")
    assert gc.get_threshold() == default_thresholds
