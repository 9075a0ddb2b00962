"""`fleet.executors.map_ordered`: results in item order, the first failure raised, `on_wait` called while items
run (process workers; the fleet's executors as a whole are compared in test_fleet_sim.py)."""

from __future__ import annotations

import pytest

from evolving_infra.fleet.executors import ExecutorKind, map_ordered, open_executor


def test_map_ordered_keeps_item_order_and_raises_the_first_failure() -> None:
    with open_executor(ExecutorKind.PROCESSES, 2) as executor:
        assert map_ordered(executor, abs, [-3, 2, -1, 0]) == [3, 2, 1, 0]
        with pytest.raises(TypeError):
            map_ordered(executor, abs, [1, "x"])


def test_map_ordered_calls_on_wait_while_items_run() -> None:
    waits: list[int] = []
    with open_executor(ExecutorKind.PROCESSES, 1) as executor:
        got = map_ordered(executor, _sleep_then, [0.6, 0.0], on_wait=lambda: waits.append(1), wait_s=0.1)
    assert got == [0.6, 0.0] and len(waits) >= 2


def _sleep_then(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds
