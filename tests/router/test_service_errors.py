"""How the live router maps a node agent's gRPC answers to HTTP errors: only answers that blame the request
are 400; the cluster's own failures (INTERNAL, UNKNOWN, UNAUTHENTICATED...) are 5xx with a retry hint, and
transient ones are retried."""

from __future__ import annotations

import grpc
import pytest

from evolving_infra.cli.router import shape_from_profile
from evolving_infra.core.types import NodeId
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.router.http.errors import InvalidRequest, NodeUnavailable
from evolving_infra.router.service import LiveRouter, NodeEndpoint, RouterSettings


def _error(code: grpc.StatusCode, trailing: tuple[tuple[str, str], ...] = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details="why")


@pytest.fixture(scope="module")
def router() -> LiveRouter:
    settings = RouterSettings(nodes={"n0": "127.0.0.1:1"}, insecure=True)
    return LiveRouter(settings, shape_from_profile(load_profile(settings.profile)), [NodeEndpoint(NodeId("n0"), "127.0.0.1:1")])


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS,
                                  grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                                  grpc.StatusCode.UNIMPLEMENTED])  # fmt: skip
def test_the_clusters_own_failures_are_5xx_with_a_retry_hint(router: LiveRouter, code: grpc.StatusCode) -> None:
    out = router._classify(_error(code), NodeId("n0"))  # noqa: SLF001 - the mapping is the unit under test
    assert isinstance(out, NodeUnavailable) and out.retry_after_s == 1.0 and code.name in str(out)


def test_only_answers_blaming_the_request_are_400(router: LiveRouter) -> None:
    assert isinstance(router._classify(_error(grpc.StatusCode.INVALID_ARGUMENT), NodeId("n0")), InvalidRequest)  # noqa: SLF001
    too_large = _error(grpc.StatusCode.RESOURCE_EXHAUSTED, (("evolving-reject-reason", "REJECT_REASON_TOO_LARGE"),))
    assert isinstance(router._classify(too_large, NodeId("n0")), InvalidRequest)  # noqa: SLF001
    retried = router._classify(_error(grpc.StatusCode.UNAVAILABLE), NodeId("n0"))  # noqa: SLF001
    assert not isinstance(retried, (InvalidRequest, NodeUnavailable))  # routed again by the caller
