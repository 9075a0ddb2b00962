"""The distribution installs as one `evolving_infra` namespace, editable and plain, and keeps its layers.

A plain (non-editable) install is built into a temporary folder; import-linter then checks the layering
contracts of pyproject.toml against that tree, where every component folder sits under `evolving_infra/`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import evolving_infra

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("router", "node_agent", "operator", "sim", "proto", "core", "traces", "workloads", "cli")


def test_editable_install_maps_component_folders() -> None:
    import importlib

    for name in COMPONENTS:
        module = importlib.import_module(f"evolving_infra.{name}")
        assert module.__doc__, f"evolving_infra.{name} needs a docstring stating its boundary"
    import evolving_infra.operator as ours
    import operator as stdlib

    assert ours is not stdlib
    assert hasattr(stdlib, "itemgetter")


@pytest.fixture(scope="module")
def plain_install(tmp_path_factory: pytest.TempPathFactory, install_plain: Callable[[Path], None]) -> Path:
    target = tmp_path_factory.mktemp("plain")
    install_plain(target)
    return target / "site"


def _clean_env(path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(path)
    return env


def test_plain_install_imports_every_component(plain_install: Path) -> None:
    code = (
        "import importlib, evolving_infra; "
        f"[importlib.import_module('evolving_infra.' + n) for n in {COMPONENTS!r}]; "
        "print(evolving_infra.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(plain_install)!r}); {code}"],
        check=True,
        capture_output=True,
        text=True,
        cwd=plain_install,
    ).stdout
    assert out.strip().startswith(str(plain_install))


def test_layering_contracts_hold(plain_install: Path) -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        capture_output=True,
        text=True,
        env=_clean_env(plain_install),
        cwd=plain_install,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_console_script_runs() -> None:
    exe = Path(sys.executable).with_name("evolving-infra")
    result = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert evolving_infra.__version__ in result.stdout


def test_child_process_form_works_from_the_repository_root(plain_install: Path) -> None:
    """The local cluster starts its children with `python -P -m evolving_infra` (`evolving_infra.local.processes`).
    From the repository root, a plain `-m` would put the working directory first on sys.path, and the
    repository's `operator/` folder would shadow the standard library's `operator` before anything runs."""
    from evolving_infra.local.processes import python_command

    env = _clean_env(plain_install)
    ok = subprocess.run([*python_command("--version")], capture_output=True, text=True, env=env, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    assert evolving_infra.__version__ in ok.stdout
