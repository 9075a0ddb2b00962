"""mypy over the installed package, with the `[tool.mypy]` settings of pyproject.toml (strict for the pure cores).

mypy cannot follow the editable install's folder mapping (`router/` -> `evolving_infra.router`, ...), so, as in
`test_layout.py`, a plain (non-editable) install is built into a temporary folder and checked there. The whole
package must type-check without errors; the strict per-module flags must reach the pure cores and only them.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STRICT = ("evolving_infra.core", "evolving_infra.router.core", "evolving_infra.node_agent.engine")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e '.[test]')"
)


@pytest.fixture(scope="module")
def plain_install(tmp_path_factory: pytest.TempPathFactory, install_plain: Callable[[Path], None]) -> Path:
    """A plain install of the package (the approach of `test_layout.py`); its parent holds mypy's cache."""
    target = tmp_path_factory.mktemp("typed")
    install_plain(target)
    return target / "site"


def _mypy(site: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
        "--cache-dir", str(site.parent / "mypy-cache"), *targets,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=site)
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2: mypy itself failed (config, crash)
    return result


def test_the_package_type_checks(plain_install: Path) -> None:
    result = _mypy(plain_install, "-p", "evolving_infra")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found"), result.stdout


def test_strict_flags_reach_the_pure_cores_only(plain_install: Path) -> None:
    """An unannotated function is an error in each strict package and allowed elsewhere (the overrides of
    pyproject.toml neither miss a strict package nor leak to the rest)."""
    probes = {f"{package}._typing_probe": True for package in STRICT}
    probes |= {"evolving_infra.sim._typing_probe": False, "evolving_infra.cli._typing_probe": False}
    for module in probes:
        path = plain_install / (module.replace(".", "/") + ".py")
        path.write_text("def untyped(x):\n    return x\n\n\ndef typed(x: int) -> int:\n    return untyped(x)\n")
    targets = [arg for module in probes for arg in ("-m", module)]
    result = _mypy(plain_install, *targets)
    for module, strict in probes.items():
        path = module.replace(".", "/") + ".py"
        flagged = f"{path}:1: error: Function is missing a type annotation  [no-untyped-def]" in result.stdout
        assert flagged is strict, (module, result.stdout)
        assert (f"{path}:6: error: Returning Any" in result.stdout) is strict, (module, result.stdout)
