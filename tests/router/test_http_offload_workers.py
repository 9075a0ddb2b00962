"""The router's tokenize workers (router/http/offload.py) end with the router, even when it is killed.

A killed router (SIGKILL, a crash) cannot shut its process pool down; without the parent-death signal the
idle `spawn` workers would stay behind for good (seen after the local cluster's chaos tests).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")

_ROUTER = """
import sys, time
from evolving_infra.router.http.completion import prompt_ids
from evolving_infra.router.http.offload import Offloader
from evolving_infra.router.http.tokenizer import BuiltinTokenizer

offloader = Offloader(BuiltinTokenizer(), prompt_ids, 2)
offloader.warm()
deadline = time.monotonic() + 60
while len(offloader.pool._processes) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
for _ in range(8):  # workers that have started (and run the initializer), not only been spawned
    offloader.pool.submit(time.sleep, 0.05).result(timeout=60)
print(" ".join(str(pid) for pid in offloader.pool._processes), flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_workers_end_when_the_router_is_killed() -> None:
    router = subprocess.Popen([sys.executable, "-c", _ROUTER], stdout=subprocess.PIPE, text=True)
    try:
        assert router.stdout is not None
        workers = [int(pid) for pid in router.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        os.kill(router.pid, signal.SIGKILL)
        router.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in workers if _alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"tokenize workers {left} outlived the killed router"
    finally:
        if router.poll() is None:
            router.kill()
            router.wait()
