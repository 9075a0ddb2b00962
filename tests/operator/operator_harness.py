"""Running the real operator (kopf and our handlers) against the emulator, in the test's event loop.

`async with operator_running(...) as h:` starts the emulator on 127.0.0.1, points a Kubernetes client
at it, runs kopf with `build_registry` until the block ends, and gives tests helpers to create clusters,
nodes and node agent pods (what the scheduler and the DaemonSet controller would do) and to wait.

Helpers are loaded by path (`load_helper`) because the suite uses importlib import mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib.util
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import kmock

from evolving_infra.operator import kube, meta
from evolving_infra.operator.agents import GrpcNodeAgentClient
from evolving_infra.operator.handlers import kopf_event_sink
from evolving_infra.operator.kube import KubeApi, client_for
from evolving_infra.operator.reconcile import Runtime
from evolving_infra.operator.runner import operator_task
from evolving_infra.operator.settings import OperatorSettings

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CRD = REPO / "crds" / "agentservingclusters.yaml"
NAMESPACE = "serving"


def load_helper(name: str) -> ModuleType:
    """Import tests/operator/<name>.py once, by path."""
    key = f"_evolving_operator_tests_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


emulator_mod = load_helper("kube_emulator")


def cluster_object(name: str, pool: str, prefill: int = 2, decode: int = 1, **spec: Any) -> dict[str, Any]:
    """A small valid AgentServingCluster (emulated engine, L2 small enough for any machine); insecure (its
    node agents run with `--insecure`) unless `security` is given."""
    return {
        "apiVersion": meta.API_VERSION,
        "kind": meta.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"matchLabels": {"evolving-infra.io/pool": pool}},
            "nodeCount": prefill + decode,
            "gpusPerNode": 4,
            "engine": {"backend": "emulated", "profile": "glm-5.2-4xgb300-tp4"},
            "kvCache": {"l2Tokens": 20000},
            "initialSplit": {"prefill": prefill, "decode": decode},
            "planner": {"minPrefill": 1, "minDecode": 1},
            "security": {"insecure": True},
            **spec,
        },
    }


TEST_SETTINGS = OperatorSettings(
    default_image="evolving-infra:test",
    switch_deadline_seconds=10,
    state_deadline_seconds=2,
    switch_attempts=3,
    switch_backoff_seconds=1,
    switch_backoff_max_seconds=4,
    resync_seconds=60,
)


@dataclass
class Harness:
    emulator: Any
    url: str
    api: KubeApi
    rt: Runtime
    events: list[tuple[str, str, str]] = field(default_factory=list)

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return await self.api.create(copy.deepcopy(dict(obj)))

    async def add_node(self, name: str, pool: str) -> None:
        await self.api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"evolving-infra.io/pool": pool}}})

    async def add_agent_pod(self, cluster: str, node: str, host: str, port: int) -> None:
        """The node agent pod the DaemonSet controller and kubelet would make, at host:port."""
        body = await self.cluster(cluster)
        ref = meta.ClusterRef.from_object(body)
        await self.api.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{cluster}-node-agent-{node}",
                    "namespace": NAMESPACE,
                    "labels": meta.labels(ref, meta.Component.NODE_AGENT),
                },
                "spec": {"nodeName": node, "containers": [{"name": "node-agent", "ports": [{"name": "grpc", "containerPort": port}]}]},
                "status": {"podIP": host, "conditions": [{"type": "Ready", "status": "True"}]},
            }
        )

    async def router_available(self, cluster: str) -> None:
        """What the Deployment controller reports once the router pod is up."""
        await self.api._request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{cluster}-router",
            None,
            {"status": {"availableReplicas": 1}},
            "application/merge-patch+json",
        )

    async def cluster(self, name: str) -> dict[str, Any]:
        body = await self.api.get(kube.CLUSTER, NAMESPACE, name)
        assert body is not None, f"cluster {name} does not exist"
        return body

    async def patch_status(self, name: str, status: Mapping[str, Any]) -> None:
        """What the router does: a merge patch of the status subresource."""
        await self.api._request(
            "PATCH",
            f"/apis/{meta.API_VERSION}/namespaces/{NAMESPACE}/{meta.PLURAL}/{name}/status",
            None,
            {"status": dict(status)},
            "application/merge-patch+json",
        )

    async def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 120.0, step: float = 0.2) -> Any:
        """Poll `check` (sync or async) until it returns a truthy value; `timeout` is in loop time."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            if loop.time() > end:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(step)

    def events_of(self, reason: str) -> list[dict[str, Any]]:
        """Kubernetes events with `reason` stored in the emulator (posted by kopf)."""
        out = []
        for key in self.emulator.alive():
            if key[0].plural == "events":
                obj = self.emulator.objects[key].raw
                if obj.get("reason") == reason:
                    out.append(obj)
        return out


@contextlib.asynccontextmanager
async def operator_running(settings: OperatorSettings = TEST_SETTINGS, run: bool = True) -> AsyncIterator[Harness]:
    """The emulator, a client, and (unless `run` is False) the operator running until the block ends."""
    async with emulator_mod.Emulator() as emulator, kmock.Server(emulator) as server:
        emulator.load_crd(CRD)
        url = str(server.url).rstrip("/")
        operator_client = client_for(url)
        test_api = KubeApi(client_for(url), field_manager="test")
        recorded: list[tuple[str, str, str]] = []

        def sink(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
            recorded.append((type, reason, message))
            kopf_event_sink(body, type, reason, message)

        rt = Runtime(
            api=KubeApi(operator_client),
            agents=GrpcNodeAgentClient(settings.switch_deadline_seconds, settings.state_deadline_seconds),
            settings=settings,
            events=sink if run else (lambda body, type, reason, message: recorded.append((type, reason, message))),
        )
        harness = Harness(emulator, url, test_api, rt, recorded)
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(operator_task(rt, operator_client, stop_flag=stop, ready_flag=ready)) if run else None
        try:
            if task is not None:
                await asyncio.wait_for(ready.wait(), 30)
            yield harness
        finally:
            emulator.release()  # answer any request a test stalled, so the server can shut down
            stop.set()
            if task is not None:
                await asyncio.wait_for(task, 60)
            rt.close()
            test_api.close()
