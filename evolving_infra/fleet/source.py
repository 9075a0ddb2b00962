"""Where a fleet's partitions come from, and their routers' load: the I/O around `partitions` and `status`.

- `FileSource(paths)`: AgentServingCluster YAML files or directories (re-read on every `load`, so a
  gateway picks up edits);
- `KubeSource(api, labels, namespace)`: the AgentServingCluster objects carrying all of `labels` (in
  `namespace`, or every namespace), listed through the operator's `KubeApi` (read-only: list only);
- `fetch_router_loads(partitions, session)`: each partition router's Prometheus text, summed
  (`status.parse_router_metrics`); a router that does not answer gives None.

Boundary: reading only; the checks are `partitions`', the view is `status`'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiohttp

from evolving_infra.fleet.partitions import FleetPartition, load_partitions, partitions_from_objects
from evolving_infra.fleet.status import RouterLoad, parse_router_metrics
from evolving_infra.operator.kube import CLUSTER, KubeApi, selector_string

MAX_METRICS_BYTES = 8 * 1024 * 1024


class PartitionSource(Protocol):
    """Anything that lists the fleet's partitions now (raises `FleetFileError` on a bad set)."""

    def describe(self) -> str: ...

    async def load(self) -> list[FleetPartition]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class FileSource:
    paths: tuple[Path, ...]

    def describe(self) -> str:
        return ", ".join(str(p) for p in self.paths)

    async def load(self) -> list[FleetPartition]:
        return await asyncio.to_thread(load_partitions, self.paths)

    def close(self) -> None:
        pass


@dataclass
class KubeSource:
    api: KubeApi
    labels: Mapping[str, str]
    namespace: str | None = None

    def describe(self) -> str:
        where = f"namespace {self.namespace}" if self.namespace else "all namespaces"
        return f"AgentServingClusters with labels {selector_string(self.labels)} in {where}"

    async def load(self) -> list[FleetPartition]:
        objects = await self.api.list(CLUSTER, self.namespace, self.labels)
        named = []
        for obj in objects:
            md = obj.get("metadata") or {}
            named.append((f"{md.get('namespace', '?')}/{md.get('name', '?')}", obj))
        named.sort(key=lambda pair: pair[0])
        return partitions_from_objects(named, default_namespace=self.namespace or "default")

    def close(self) -> None:
        self.api.close()


async def fetch_router_load(session: aiohttp.ClientSession, url: str, timeout_s: float) -> RouterLoad | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status != 200:
                return None
            raw = await response.content.read(MAX_METRICS_BYTES)
        return parse_router_metrics(raw.decode("utf-8", "replace"))
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


async def fetch_router_loads(
    partitions: Sequence[FleetPartition], session: aiohttp.ClientSession, timeout_s: float = 5.0
) -> dict[str, RouterLoad | None]:
    """Each partition's router load by partition key, fetched concurrently."""
    loads = await asyncio.gather(*(fetch_router_load(session, p.metrics_url, timeout_s) for p in partitions))
    return {p.key: load for p, load in zip(partitions, loads)}
