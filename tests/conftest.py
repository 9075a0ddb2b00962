"""Shared test settings: hypothesis profiles sized for a 2-core machine, the `live` mark, and `install_plain`
(a plain, non-editable install of the package built outside the repository).

`HYPOTHESIS_PROFILE=thorough` runs many more examples locally; the default keeps the suite fast.

`live`: tests that start real processes or servers (local clusters, the router and node agent services, KV
transfers, the gateway, the peers' side environments) and check what they do in wall-clock time. They are marked
here by file; `scripts/test.sh` runs them in one process at normal priority and the rest on two workers beside them
at the lowest priority (`nice -n 19`), so other tests take only the CPU they leave idle (three of them failed when
other jobs competed at equal priority: a 10 % bound on the replay's TTFT, a switch's re-routing, a relaunch).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


_LIVE = (
    "local/",
    "peers/",
    "router/test_service_",
    "node_agent/test_service_",
    "node_agent/test_transfer_",
    "fleet/test_gateway_processes.py",
)
"""Test files (relative to tests/) marked `live`: by directory, or by the start of their path."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        try:
            rel = item.path.relative_to(here).as_posix()
        except ValueError:
            continue
        if rel.startswith(_LIVE):
            item.add_marker(pytest.mark.live)


REPO = Path(__file__).resolve().parents[1]


def _install_plain(target: Path) -> None:
    """`pip install --no-deps --target target/site REPO`, built under `target` rather than in the repository's
    `build/`: two such installs at once (pytest-xdist workers) would race on that shared folder ("File exists"),
    and a stale one there would bring back modules deleted since."""
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target / "site")]
    if importlib.util.find_spec("setuptools") is not None:
        install.append("--no-build-isolation")  # faster, and needs no index when setuptools is at hand
    extra = target / "setup-extra.cfg"
    extra.write_text(f"[build]\nbuild_base = {target / 'build'}\n")
    env = {**os.environ, "DIST_EXTRA_CONFIG": str(extra)}
    subprocess.run([*install, str(REPO)], check=True, cwd=target, env=env)


@pytest.fixture(scope="session")
def install_plain() -> Callable[[Path], None]:
    """Installs the package plainly into `TARGET/site` (see `_install_plain`)."""
    return _install_plain
