"""kopf handlers of the AgentServingCluster: thin wrappers that call `reconcile` and `switch_run`.

- create, resume, spec update, and every `resync_seconds` (timer): `reconcile` (children, status, and
  placing collocated node agents: a failed placement raises `kopf.TemporaryError` with the protocol's
  delay from create/resume/update; the timer just tries again at its next tick);
- a change of `status.targetSplit` (written by the router), and resume: `run_switch`; a failed attempt
  raises `kopf.TemporaryError` with the protocol's delay, a rolled-back switch `kopf.PermanentError`.

kopf keeps its progress and last-handled state in annotations under our own prefix, posts events at
WARNING and above (plus the switch events the protocol posts itself), and its finalizer — required by
the resync timer — is ours too. There is no deletion handler: children carry owner references and the
cluster's garbage collector deletes them with the cluster.

Boundary: kopf wiring only; `build_registry(rt)` and `kopf_settings()` are used by `runner` and tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client import Configuration

from evolving_infra.operator import meta
from evolving_infra.operator.reconcile import Runtime, reconcile
from evolving_infra.operator.settings import OperatorSettings
from evolving_infra.operator.switch_run import Result, run_switch

RESOURCE = (meta.GROUP, meta.VERSION, meta.PLURAL)
TARGET_FIELD = "status.targetSplit"
FINALIZER = f"{meta.ANNOTATION_PREFIX}/finalizer"
ERROR_BACKOFF_SECONDS = 10.0


WATCH_SERVER_TIMEOUT_SECONDS = 300
"""The API server ends each of kopf's watch requests after this long; kopf then lists and watches again."""


def kopf_settings(settings: kopf.OperatorSettings | None = None, api: OperatorSettings | None = None) -> kopf.OperatorSettings:
    """kopf's settings for this operator: our annotation prefix, our finalizer, events at WARNING and above, and
    timeouts on all of kopf's API calls (from `api`, the operator's settings), watches included: a dead
    connection is noticed and re-opened instead of waiting forever."""
    out = settings if settings is not None else kopf.OperatorSettings()
    limits = api if api is not None else OperatorSettings()
    out.networking.connect_timeout = limits.api_connect_timeout_seconds
    out.networking.request_timeout = limits.api_read_timeout_seconds
    out.watching.connect_timeout = limits.api_connect_timeout_seconds
    out.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    out.watching.client_timeout = WATCH_SERVER_TIMEOUT_SECONDS + limits.api_read_timeout_seconds
    out.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=meta.ANNOTATION_PREFIX)
    out.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=meta.ANNOTATION_PREFIX)
    out.persistence.finalizer = FINALIZER
    out.posting.level = logging.WARNING
    out.posting.loggers = True
    return out


def connection_info(configuration: Configuration) -> kopf.ConnectionInfo:
    """kopf's connection from the same client configuration the operator's own calls use."""
    token = None
    for key in ("BearerToken", "authorization"):
        if key in (configuration.api_key or {}):
            # Through the client's own accessor, which refreshes rotating (e.g. in-cluster) tokens first.
            raw = str(configuration.get_api_key_with_prefix(key) or "").strip()
            token = raw.split(" ", 1)[1].strip() if raw.lower().startswith("bearer ") else raw
            break
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        scheme="Bearer" if token else None,
        token=token,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
        username=configuration.username or None,
        password=configuration.password or None,
    )


def kopf_event_sink(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    kopf.event(dict(body), type=type, reason=reason, message=message)  # type: ignore[arg-type]  # kopf reads the metadata of any mapping


def build_registry(rt: Runtime, configuration: Configuration) -> kopf.OperatorRegistry:
    """A registry with every handler bound to `rt`; kopf logs in with `configuration`'s credentials."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(configuration)

    @kopf.on.create(*RESOURCE, id="reconcile", registry=registry, backoff=ERROR_BACKOFF_SECONDS)
    @kopf.on.update(*RESOURCE, id="reconcile", registry=registry, backoff=ERROR_BACKOFF_SECONDS)
    @kopf.on.resume(*RESOURCE, id="reconcile", registry=registry, backoff=ERROR_BACKOFF_SECONDS)  # type: ignore[arg-type]  # namespaced: kopf passes a str namespace
    async def reconcile_cluster(namespace: str, name: str, retry: int, logger: logging.Logger, **_: Any) -> None:
        outcome = await reconcile(rt, namespace, name, attempt=retry)
        if outcome is not None:
            logger.info("reconciled: %s", outcome)
            if outcome.retry_delay is not None:
                message = "placing node agents into their phases failed; see the Adapting condition"
                raise kopf.TemporaryError(message, delay=outcome.retry_delay)

    @kopf.on.update(*RESOURCE, id="switch", field=TARGET_FIELD, registry=registry, backoff=ERROR_BACKOFF_SECONDS)
    @kopf.on.resume(*RESOURCE, id="switch", registry=registry, backoff=ERROR_BACKOFF_SECONDS)  # type: ignore[arg-type]  # namespaced: kopf passes a str namespace
    async def apply_target_split(namespace: str, name: str, retry: int, logger: logging.Logger, **_: Any) -> None:
        started = time.perf_counter()
        outcome = await run_switch(rt, namespace, name, retry)
        rt.metrics.switches.labels(result=outcome.result.value).inc()
        if outcome.result is Result.CONVERGED:
            rt.metrics.switch_seconds.observe(time.perf_counter() - started)
        elif outcome.result is Result.ROLLED_BACK:
            rt.metrics.rollbacks.labels(cluster_namespace=namespace, cluster=name).inc()
        if outcome.result is Result.RETRY:
            raise kopf.TemporaryError(outcome.message, delay=outcome.delay)
        if outcome.result is Result.ROLLED_BACK:
            raise kopf.PermanentError(outcome.message)
        logger.info("target split: %s (%s)", outcome.result.value, outcome.message)

    @kopf.timer(*RESOURCE, id="resync", interval=rt.settings.resync_seconds, registry=registry, backoff=ERROR_BACKOFF_SECONDS)  # type: ignore[arg-type]  # namespaced: kopf passes a str namespace
    async def resync(namespace: str, name: str, **_: Any) -> None:
        await reconcile(rt, namespace, name)

    return registry
