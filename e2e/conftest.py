"""End-to-end tests against a real cluster; skipped, with the reason, unless one is given.

Give a cluster with `EVOLVING_E2E_KUBECONFIG=/path/to/kubeconfig` (or `KUBECONFIG` pointing at a cluster
that answers), and the image to run with `EVOLVING_E2E_IMAGE` (built from `images/Dockerfile` and loaded
into the cluster, e.g. `kind load docker-image evolving-infra:e2e`). Run with `pytest e2e/`; the default
`pytest` run (testpaths = tests) never collects this folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _kubeconfig() -> tuple[str | None, str]:
    explicit = os.environ.get("EVOLVING_E2E_KUBECONFIG")
    if explicit:
        return explicit, "EVOLVING_E2E_KUBECONFIG"
    return os.environ.get("KUBECONFIG"), "KUBECONFIG"


def _skip_reason() -> str | None:
    if shutil.which("kubectl") is None:
        return "kubectl is not on PATH"
    path, source = _kubeconfig()
    if not path:
        return "no cluster given: set EVOLVING_E2E_KUBECONFIG (or KUBECONFIG) to a kubeconfig of a reachable cluster"
    if not Path(path).is_file():
        return f"{source}={path} is not a file"
    probe = subprocess.run(
        ["kubectl", "--kubeconfig", path, "version", "--request-timeout=5s", "-o", "json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if probe.returncode != 0 or '"serverVersion"' not in probe.stdout:
        return f"the cluster of {source}={path} does not answer: {probe.stderr.strip()[:300]}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _skip_reason()
    if reason is None:
        return
    for item in items:
        item.add_marker(pytest.mark.skip(reason=reason))


Kubectl = Callable[..., str]


@pytest.fixture(scope="session")
def kubectl() -> Kubectl:
    """`kubectl(*args, input=None, check=True)` against the given cluster; returns stdout."""
    path, _ = _kubeconfig()
    assert path is not None

    def run(*args: str, input: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", path, *args], input=input, capture_output=True, text=True, check=False, cwd=REPO
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    return run


@pytest.fixture(scope="session")
def image() -> str:
    """The image the operator, routers and node agents run (EVOLVING_E2E_IMAGE)."""
    value = os.environ.get("EVOLVING_E2E_IMAGE")
    if not value:
        pytest.skip("set EVOLVING_E2E_IMAGE to an evolving-infra image available to the cluster's nodes")
    return value
