"""The gateway's Prometheus series, per partition, on a private registry.

| series | type | labels | meaning |
| --- | --- | --- | --- |
| `evolving_gateway_requests_total` | counter | partition, endpoint, status | requests answered (status `499`: client went away) |
| `evolving_gateway_request_duration_seconds` | histogram | partition, endpoint | arrival to the last byte forwarded |
| `evolving_gateway_time_to_first_byte_seconds` | histogram | partition, endpoint | arrival to the partition router's response head |
| `evolving_gateway_inflight_requests` | gauge | partition | requests being forwarded |
| `evolving_gateway_bindings_total` | counter | partition, reason | routing decisions by `BindReason` |
| `evolving_gateway_bound_users` | gauge | partition | users bound now |
| `evolving_gateway_active_branches` | gauge | partition | branches pinned now |
| `evolving_gateway_partition_up` | gauge | partition | 1 while the partition router answers its readiness probe |
| `evolving_gateway_user_moves_total` | counter | partition | users moved onto the partition when the partition set changed |
| `evolving_gateway_unavailable_total` | counter | partition | requests answered 503 because their partition was down |
| `evolving_gateway_partitions` | gauge | | partitions known |
| `evolving_gateway_partition_refresh_failures_total` | counter | | partition set re-reads that failed (the last good set is kept) |

`partition` is `namespace/name` of an AgentServingCluster (bounded: the fleet's size); `endpoint` one of
a fixed set; never a user, key, branch or request id (cardinality). Requests refused before binding
(400/401) carry `partition="-"`.

Boundary: metric objects; the server updates them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

TTFB_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
NO_PARTITION = "-"


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "evolving_gateway_requests_total", "Requests answered, by partition.", ["partition", "endpoint", "status"], registry=r
        )
        self.duration = Histogram(
            "evolving_gateway_request_duration_seconds",
            "Arrival to the last byte forwarded.",
            ["partition", "endpoint"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttfb = Histogram(
            "evolving_gateway_time_to_first_byte_seconds",
            "Arrival to the partition router's response head.",
            ["partition", "endpoint"],
            buckets=TTFB_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge("evolving_gateway_inflight_requests", "Requests being forwarded.", ["partition"], registry=r)
        self.bindings = Counter(
            "evolving_gateway_bindings_total", "Routing decisions by reason.", ["partition", "reason"], registry=r
        )
        self.users = Gauge("evolving_gateway_bound_users", "Users bound now.", ["partition"], registry=r)
        self.branches = Gauge("evolving_gateway_active_branches", "Branches pinned now.", ["partition"], registry=r)
        self.up = Gauge("evolving_gateway_partition_up", "1 while the partition router is ready.", ["partition"], registry=r)
        self.moves = Counter(
            "evolving_gateway_user_moves_total", "Users moved onto the partition by a membership change.", ["partition"], registry=r
        )
        self.unavailable = Counter(
            "evolving_gateway_unavailable_total", "Requests answered 503 because their partition was down.", ["partition"], registry=r
        )
        self.partitions = Gauge("evolving_gateway_partitions", "Partitions known.", registry=r)
        self.refresh_failures = Counter(
            "evolving_gateway_partition_refresh_failures_total", "Partition set re-reads that failed.", registry=r
        )

    def forget(self, partition: str) -> None:
        """Drop the gauges of a partition that left the fleet (counters stay until restart)."""
        for gauge in (self.inflight, self.users, self.branches, self.up):
            try:
                gauge.remove(partition)
            except KeyError:
                pass

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
