"""Running the operator: credentials, the runtime, kopf's settings and registry, and kopf itself.

`run_operator(...)` is what `evolving-infra operator run` calls; tests call `operator_task(...)` with
their own API client (pointing at an emulator) and node agent client.

Boundary: process wiring; no decisions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import kopf
from kubernetes import client as kclient

from evolving_infra.operator import images
from evolving_infra.operator.agents import GrpcNodeAgentClient, NodeAgentClient
from evolving_infra.operator.handlers import build_registry, kopf_event_sink, kopf_settings
from evolving_infra.operator.kube import ApiLimits, KubeApi, load_client
from evolving_infra.operator.reconcile import Runtime
from evolving_infra.operator.settings import OperatorSettings

log = logging.getLogger(__name__)


def make_runtime(api_client: kclient.ApiClient, settings: OperatorSettings, agents: NodeAgentClient | None = None) -> Runtime:
    """A runtime whose events go through kopf and whose agents are reached over gRPC unless given."""
    client = agents or GrpcNodeAgentClient(settings.switch_deadline_seconds, settings.state_deadline_seconds)
    api = KubeApi(api_client, limits=api_limits(settings))
    rt = Runtime(api=api, agents=client, settings=settings, events=kopf_event_sink)
    api.on_failure = rt.metrics.api_failures.inc
    return rt


def api_limits(settings: OperatorSettings) -> ApiLimits:
    return ApiLimits(
        connect_timeout=settings.api_connect_timeout_seconds, read_timeout=settings.api_read_timeout_seconds, retries=settings.api_retries
    )


async def operator_task(
    rt: Runtime,
    api_client: kclient.ApiClient,
    *,
    namespaces: Sequence[str] = (),
    liveness: str | None = None,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Run kopf with our handlers until `stop_flag` is set (or forever); cluster-wide without namespaces.

    First the children's default image is settled: the settings' own, else the operator pod's (see `images`)."""
    image, source = await images.resolve_default_image(rt.api, rt.settings.default_image, rt.settings.namespace, rt.settings.pod_name)
    rt.settings = rt.settings.model_copy(update={"default_image": image})
    log.info("routers and node agents default to image %s (from %s)", image, source)
    await kopf.operator(
        registry=build_registry(rt, api_client.configuration),
        settings=kopf_settings(api=rt.settings),
        standalone=True,
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run_operator(
    settings: OperatorSettings,
    *,
    namespaces: Sequence[str] = (),
    liveness: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> None:
    """Find credentials (raises `kube.NoCredentials` with what to do), then run until interrupted."""
    api_client = load_client(kubeconfig, context)
    rt = make_runtime(api_client, settings)
    if settings.metrics_port:
        rt.metrics.serve(settings.metrics_port)
        log.info("operator metrics on :%d/metrics", settings.metrics_port)
    try:
        asyncio.run(operator_task(rt, api_client, namespaces=namespaces, liveness=liveness))
    finally:
        rt.close()
