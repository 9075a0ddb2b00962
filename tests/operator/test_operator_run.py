"""`evolving-infra operator run`: clear errors without credentials; the real process against the emulator."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from evolving_infra.cli.main import main


def _harness() -> Any:
    key = "_evolving_operator_tests_operator_harness"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("operator_harness.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


H = _harness()


def test_run_without_credentials_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["operator", "run", "--all-namespaces"]) == 1
    err = capsys.readouterr().err
    assert "no Kubernetes credentials" in err and "point KUBECONFIG at a cluster" in err


def test_run_rejects_a_bad_liveness_url_and_bad_settings(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "run", "--liveness", "localhost:8080"]) == 2
    assert "--liveness must be an http(s) URL" in capsys.readouterr().err
    monkeypatch.setenv("EVOLVING_OPERATOR_SWITCH_ATTEMPTS", "0")
    assert main(["operator", "run"]) == 2
    assert "switch_attempts" in capsys.readouterr().err


@pytest.mark.asyncio
async def test_the_operator_process_reconciles_a_cluster(tmp_path: Path) -> None:
    """The console script, logged in through a kubeconfig, creates a cluster's children in the emulator."""
    async with H.operator_running(run=False) as h:
        config = tmp_path / "kubeconfig"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "e", "cluster": {"server": h.url}}],
                    "users": [{"name": "u", "user": {"token": "t0ken"}}],
                    "contexts": [{"name": "e", "context": {"cluster": "e", "user": "u"}}],
                    "current-context": "e",
                }
            )
        )
        env = {**os.environ, "KUBECONFIG": str(config), "EVOLVING_OPERATOR_DEFAULT_IMAGE": "registry.example/evolving:1"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = (tmp_path / "operator.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            # Cluster-wide: with --namespace kopf lists /api/v1/namespaces, a path KMock 0.8 cannot parse.
            sys.executable, "-P", "-m", "evolving_infra.cli.main", "operator", "run", "--all-namespaces",
            env=env, stdout=log, stderr=log,
        )  # fmt: skip
        try:
            await h.create(H.cluster_object("proc", "p"))
            for _ in range(1200):  # wall clock (up to a minute): the operator is another process
                deployment = h.emulator.live("apps/v1/deployments", H.NAMESPACE, "proc-router")
                if deployment is not None or proc.returncode is not None:
                    break
                await asyncio.sleep(0.05)
            assert deployment is not None, (tmp_path / "operator.log").read_text(errors="replace")[-3000:]
            image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
            assert image == "registry.example/evolving:1"
            auth = {r.headers.get("Authorization") for r in h.emulator if "kopf" in r.headers.get("User-Agent", "")}
            assert auth == {"Bearer t0ken"}
        finally:
            if proc.returncode is None:
                proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)
            log.close()
        output = (tmp_path / "operator.log").read_text(errors="replace")
        assert "Traceback" not in output, output[-3000:]
