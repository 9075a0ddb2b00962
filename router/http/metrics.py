"""Prometheus metrics of the router's HTTP layer, named `evolving_*` and shaped like Dynamo's frontend set.

Every label has a small fixed value set: `endpoint` (an `Endpoint` value), `status` (an HTTP status
code, `499` when the client went away), `outcome`/`trigger` of branch finishes and `source` of branch
resolution. Never a branch id, request id, tenant or model name supplied by a client (cardinality).
KV hits are counters (`evolving_cached_tokens_total` over `evolving_input_tokens_total` gives the hit
rate in a query); latencies are histograms.

Boundary: one `RouterMetrics` per application, on its own `CollectorRegistry` (never the global one),
so several servers in one process (tests) do not collide.
"""

from __future__ import annotations

import enum

from evolving_infra.router.http.api import Endpoint
from evolving_infra.router.http.backend import FinishOutcome
from evolving_infra.router.http.branch import BranchSource
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CLIENT_CLOSED = 499
"""Status label of a request whose client disconnected before the answer was complete."""

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class FinishTrigger(enum.Enum):
    """What finished a branch: the explicit call, the finished flag on a request, or an ephemeral branch
    ending with its only request."""

    CALL = "call"
    FLAG = "flag"
    EPHEMERAL = "ephemeral"


class RouterMetrics:
    """The HTTP layer's series on a private registry."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "evolving_time_to_first_token_seconds",
            "Time from request arrival to the first output token sent.",
            ["endpoint"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "evolving_inter_token_latency_seconds",
            "Time between consecutive output tokens (a chunk's gap divided over its tokens).",
            ["endpoint"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "evolving_request_duration_seconds",
            "Time from request arrival to the end of its answer.",
            ["endpoint"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "evolving_requests",
            "Answered requests by endpoint and HTTP status (499: client went away).",
            ["endpoint", "status"],
            registry=r,
        )
        self.inflight = Gauge(
            "evolving_inflight_requests", "Requests being answered now.", ["endpoint"], registry=r
        )
        self.input_tokens = Counter(
            "evolving_input_tokens", "Prompt tokens of admitted requests.", ["endpoint"], registry=r
        )
        self.cached_tokens = Counter(
            "evolving_cached_tokens",
            "Prompt tokens served from KV cache, as reported by the backend.",
            ["endpoint"],
            registry=r,
        )
        self.output_tokens = Counter(
            "evolving_output_tokens", "Generated tokens sent to clients.", ["endpoint"], registry=r
        )
        self.branch_resolutions = Counter(
            "evolving_branch_resolutions",
            "Requests by where their branch id came from (our header or body, an alias, or generated).",
            ["source"],
            registry=r,
        )
        self.branch_finishes = Counter(
            "evolving_branch_finishes",
            "Branch finish calls to the backend by trigger and outcome.",
            ["trigger", "outcome"],
            registry=r,
        )
        for e in (Endpoint.CHAT_COMPLETIONS, Endpoint.COMPLETIONS):
            for metric in (self.input_tokens, self.cached_tokens, self.output_tokens, self.inflight):
                metric.labels(endpoint=e.value)

    def request_done(self, endpoint: Endpoint, status: int, duration_s: float) -> None:
        self.requests.labels(endpoint=endpoint.value, status=str(status)).inc()
        if endpoint in (Endpoint.CHAT_COMPLETIONS, Endpoint.COMPLETIONS):
            self.duration.labels(endpoint=endpoint.value).observe(duration_s)

    def first_token(self, endpoint: Endpoint, ttft_s: float) -> None:
        self.ttft.labels(endpoint=endpoint.value).observe(ttft_s)

    def tokens(self, endpoint: Endpoint, count: int, gap_s: float | None) -> None:
        """`count` tokens arrived `gap_s` after the previous ones (None for the first chunk)."""
        self.output_tokens.labels(endpoint=endpoint.value).inc(count)
        if gap_s is not None and count > 0:
            per_token = gap_s / count
            child = self.itl.labels(endpoint=endpoint.value)
            for _ in range(count):
                child.observe(per_token)

    def prompt(self, endpoint: Endpoint, prompt_tokens: int, cached_tokens: int) -> None:
        self.input_tokens.labels(endpoint=endpoint.value).inc(prompt_tokens)
        self.cached_tokens.labels(endpoint=endpoint.value).inc(cached_tokens)

    def branch_resolved(self, source: BranchSource) -> None:
        self.branch_resolutions.labels(source=source.value).inc()

    def branch_finished(self, trigger: FinishTrigger, outcome: FinishOutcome) -> None:
        self.branch_finishes.labels(trigger=trigger.value, outcome=outcome.value).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
