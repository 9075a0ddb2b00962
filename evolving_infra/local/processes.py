"""Supervision of the local cluster's child processes (node agents and the router).

Each child runs `sys.executable -P -m evolving_infra ...` in its own session (so a Ctrl-C in the terminal reaches
only the driver, which then stops the children in order), with stdout and stderr written to files in the run's
work folder. A child is ready once it has printed its one JSON line (its addresses) on stdout; a child that
exits first, or prints nothing by the deadline, raises `StartError` naming it with the last lines of its stderr.

No orphans: every child is killed by the kernel if the driver dies (Linux `PR_SET_PDEATHSIG`; the kernel ties it to
the *thread* that started the child, so start children from a thread that outlives them, e.g. the main one), every live child
is killed at interpreter exit (`atexit`), and `stop_all` sends SIGTERM, waits up to a grace period, then SIGKILL.

Boundary: OS processes and files only; what the children are configured to do is the caller's.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


class StartError(RuntimeError):
    """A child process did not come up: `name` says which, the message carries its last stderr lines."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        super().__init__(message)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _kill_leftovers() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass


atexit.register(_kill_leftovers)


def tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a text file ('' if it is missing)."""
    try:
        data = path.read_bytes()[-16384:]
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@dataclass(eq=False)
class Child:
    """One supervised child process and its log files."""

    name: str
    argv: tuple[str, ...]
    workdir: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def stdout_path(self) -> Path:
        return self.workdir / f"{self.name}.stdout"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / f"{self.name}.stderr"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> None:
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                list(self.argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                start_new_session=True, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )  # fmt: skip
        with _LIVE_LOCK:
            _LIVE.add(self.proc)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def last_stderr(self, lines: int = 15) -> str:
        return tail(self.stderr_path, lines)

    def failure(self, what: str) -> StartError:
        text = self.last_stderr()
        detail = f"\n--- last lines of {self.stderr_path} ---\n{text}" if text else f" (no output on {self.stderr_path})"
        return StartError(self.name, f"{self.name}: {what}{detail}")

    def wait_ready(self, deadline: float) -> dict[str, Any]:
        """Wait for the child's JSON line (monotonic `deadline`); returns it parsed."""
        assert self.proc is not None, "start() first"
        while True:
            try:
                text = self.stdout_path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            line, newline, _ = text.partition("\n")
            if newline:
                try:
                    info = json.loads(line)
                except json.JSONDecodeError:
                    raise self.failure(f"printed {line[:200]!r} instead of its JSON address line") from None
                if not isinstance(info, dict):
                    raise self.failure(f"printed {line[:200]!r} instead of a JSON object")
                self.info = info
                return info
            code = self.proc.poll()
            if code is not None:
                raise self.failure(f"exited with status {code} before it was ready")
            if time.monotonic() >= deadline:
                raise self.failure("did not report ready before the deadline")
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            try:
                self.proc.send_signal(sig)
            except OSError:
                pass

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def forget(self) -> None:
        with _LIVE_LOCK:
            if self.proc is not None:
                _LIVE.discard(self.proc)


def python_command(*args: str) -> tuple[str, ...]:
    """`python -P -m evolving_infra ARGS` with the running interpreter (`-P`: never put the working directory on
    sys.path, where the repository's `operator/` folder would shadow the standard library)."""
    return (sys.executable, "-P", "-m", "evolving_infra", *args)


def stop_all(children: Sequence[Child], grace_s: float) -> dict[str, int | None]:
    """SIGTERM every live child, wait up to `grace_s` for all, SIGKILL the rest; returns exit statuses."""
    for child in children:
        child.signal(signal.SIGTERM)
    end = time.monotonic() + grace_s
    codes: dict[str, int | None] = {}
    for child in children:
        codes[child.name] = child.wait(end - time.monotonic())
    for child in children:
        if child.alive():
            assert child.proc is not None
            try:
                child.proc.kill()
            except OSError:
                pass
            codes[child.name] = child.wait(5.0)
        child.forget()
    return codes
