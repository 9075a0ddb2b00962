"""`kubectl get asc` against the emulator shows the printer columns the operator fills."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from evolving_infra.core.types import Phase
from evolving_infra.operator.reconcile import reconcile

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


def _harness() -> Any:
    key = "_evolving_operator_tests_operator_harness"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("operator_harness.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


H = _harness()
agents_mod = H.load_helper("fake_node_agent")


def kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": url}}],
                "users": [{"name": "tester", "user": {"token": "unused"}}],
                "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester", "namespace": H.NAMESPACE}}],
                "current-context": "emulator",
            }
        )
    )
    return path


async def kubectl(config: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--kubeconfig", str(config), "--cache-dir", str(config.parent / "cache"), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_kubectl_get_asc_prints_the_split_and_readiness(tmp_path: Path) -> None:
    async with H.operator_running() as h:
        handles = agents_mod.start_agents({f"kc-n{i}": Phase.PREFILL if i < 2 else Phase.DECODE for i in range(3)})
        try:
            for handle in handles:
                await h.add_node(handle.node, "kc")
            await h.create(H.cluster_object("kc", "kc"))
            for handle in handles:
                await h.add_agent_pod("kc", handle.node, handle.host, handle.port)
            await h.wait_for("router deployment", lambda: h.emulator.live("apps/v1/deployments", H.NAMESPACE, "kc-router"))
            await h.router_available("kc")
            await reconcile(h.rt, H.NAMESPACE, "kc")
            config = kubeconfig(tmp_path / "kubeconfig", h.url)
            lines = (await kubectl(config, "get", "asc")).splitlines()
            assert lines[0].split() == ["NAME", "READY", "SPLIT", "PREFILL", "DECODE", "NODES", "ADAPTING", "AGE"]
            assert lines[1].split()[:7] == ["kc", "True", "2P1D", "2", "1", "3", "false"]
            wide = (await kubectl(config, "get", "agentservingclusters", "-o", "wide")).splitlines()
            assert wide[0].split()[-2:] == ["REASON", "AGE"]
            assert wide[1].split()[-2] == "Serving"
            split = await kubectl(config, "get", "asc", "kc", "-o", "jsonpath={.status.split}")
            assert split == "2P1D"
        finally:
            for handle in handles:
                handle.stop()
