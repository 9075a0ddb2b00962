"""Which partitions are up: each partition router's `/readyz`, probed every `interval_s`, and failures
seen while forwarding.

A partition is down from a failed probe or a failed connection until a probe answers 200 again. A
partition never probed yet counts as up (the first request tries it).

Boundary: the probing loop and the up/down set; decisions about users are the table's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import aiohttp

log = logging.getLogger(__name__)


class Health:
    def __init__(self, on_change: Callable[[str, bool], None] | None = None) -> None:
        self._down: dict[str, str] = {}
        self._on_change = on_change

    def down(self) -> frozenset[str]:
        return frozenset(self._down)

    def why(self, partition: str) -> str | None:
        return self._down.get(partition)

    def mark(self, partition: str, up: bool, why: str = "") -> None:
        was_up = partition not in self._down
        if up:
            self._down.pop(partition, None)
        else:
            self._down[partition] = why or "not ready"
        if was_up != up:
            log.warning("partition %s is %s%s", partition, "up" if up else "down", "" if up else f" ({why})")
        if self._on_change is not None:
            self._on_change(partition, up)

    def forget(self, partition: str) -> None:
        self._down.pop(partition, None)

    async def probe(self, session: aiohttp.ClientSession, partition: str, base_url: str, timeout_s: float) -> None:
        try:
            async with session.get(f"{base_url}/readyz", timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                await response.read()
                self.mark(partition, response.status == 200, f"readyz answered {response.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.mark(partition, False, f"readyz: {type(exc).__name__}")

    async def probe_all(self, session: aiohttp.ClientSession, urls: Mapping[str, str], timeout_s: float) -> None:
        await asyncio.gather(*(self.probe(session, name, url, timeout_s) for name, url in urls.items()))
