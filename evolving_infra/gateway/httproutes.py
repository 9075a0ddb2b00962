"""The Gateway API alternative to forwarding: one HTTPRoute per partition, matching the partition header.

With `gateway serve --upstream URL` the gateway still binds every request and sets
`x-evolving-partition: <namespace>/<name>`, but sends it to one upstream (a Gateway API implementation's
listener) instead of the partition router; these routes then send each request to its partition's router
Service (`<name>-router`, the port of `spec.router.port`). docs/gateway.md shows the whole setup.

Boundary: a pure builder (partitions in, objects out); `evolving-infra gateway httproutes` prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolving_infra.fleet.partitions import FleetPartition
from evolving_infra.gateway.proxy import PARTITION_HEADER

HTTPROUTE_API_VERSION = "gateway.networking.k8s.io/v1"


def build_httproute(partition: FleetPartition, gateway_name: str, gateway_namespace: str | None = None) -> dict[str, Any]:
    parent: dict[str, Any] = {"name": gateway_name}
    if gateway_namespace is not None:
        parent["namespace"] = gateway_namespace
    return {
        "apiVersion": HTTPROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": {
            "name": f"{partition.name}-partition",
            "namespace": partition.namespace,
            "labels": {"app.kubernetes.io/name": "evolving-infra", "app.kubernetes.io/component": "gateway-route"},
        },
        "spec": {
            "parentRefs": [parent],
            "rules": [
                {
                    "matches": [
                        {
                            "path": {"type": "PathPrefix", "value": "/v1/"},
                            "headers": [{"type": "Exact", "name": PARTITION_HEADER, "value": partition.key}],
                        }
                    ],
                    "backendRefs": [{"name": f"{partition.name}-router", "port": partition.spec.router.port}],
                }
            ],
        },
    }


def build_httproutes(
    partitions: Sequence[FleetPartition], gateway_name: str, gateway_namespace: str | None = None
) -> list[dict[str, Any]]:
    return [build_httproute(p, gateway_name, gateway_namespace) for p in partitions]
