"""Where independent simulation runs execute: in this process, in worker processes, or on a Ray cluster.

`open_executor(kind, workers, ray_address)` is a context manager that yields a `concurrent.futures.Executor`;
`map_ordered(executor, fn, items)` submits `fn(item)` for every item and returns the results **in the order of
the items**, whatever order they finish in. Each task is a pure function of its argument (a simulation is a pure
function of its config and trace), so the results, and everything built from them, are identical for every
executor and every number of workers.

- `inline`: one after the other in this process (tests, debugging; no pickling).
- `processes` (default): a `ProcessPoolExecutor` of `workers` processes on this machine.
- `ray`: Ray tasks (`pip install 'evolving-infra[ray]'`). With `ray_address` the tasks go to that cluster
  (`ray.init(address=...)`; `auto` finds a running local one) and the driver only disconnects at the end. Without
  it a private local instance is started, bound to loopback (node address 127.0.0.1, no dashboard, `workers` CPUs)
  and shut down at the end. Ray's own futures (`ObjectRef.future()`) are `concurrent.futures.Future`s, so callers
  use Ray and processes the same way (`as_completed`, `result()`). The cluster's workers must be able to import
  `evolving_infra` (same install or a `runtime_env`); nothing is scheduled here beyond one task per item.

Boundary: execution only; what runs is the caller's.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

LOOPBACK = "127.0.0.1"


class ExecutorKind(enum.Enum):
    INLINE = "inline"
    PROCESSES = "processes"
    RAY = "ray"


class ExecutorUnavailable(RuntimeError):
    """The executor cannot be used here (Ray not installed, or its cluster unreachable): permanent for this run."""


def ray_unavailable() -> str | None:
    """Why Ray cannot be imported here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        return f"ray is not installed ({exc}); pip install 'evolving-infra[ray]'"
    return None


class InlineExecutor(Executor):
    """Runs each submitted call at once, in this process; its futures are already done."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        future: Future[R] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # the future carries it, as a pool's would
            future.set_exception(exc)
        return future


class RayExecutor(Executor):
    """Submits each call as one Ray task (1 CPU); `shutdown` stops a private instance or disconnects."""

    def __init__(self, workers: int, address: str | None = None) -> None:
        why = ray_unavailable()
        if why is not None:
            raise ExecutorUnavailable(why)
        import ray

        self._ray = ray
        self._remote: dict[Callable[..., Any], Any] = {}
        if ray.is_initialized():
            raise ExecutorUnavailable("Ray is already initialized in this process; one RayExecutor at a time")
        try:
            if address is None:
                ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address=LOOPBACK,
                         log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ExecutorUnavailable(f"cannot start or reach Ray ({address or 'local'}): {exc}") from exc

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(num_cpus=1, max_retries=0)(fn)
        future: Future[R] = remote.remote(*args, **kwargs).future()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._ray.is_initialized():
            self._ray.shutdown()


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


@contextmanager
def open_executor(kind: ExecutorKind | str = ExecutorKind.PROCESSES, workers: int | None = None,
                  ray_address: str | None = None) -> Iterator[Executor]:
    """An executor of `kind` with `workers` workers (default: this machine's CPUs), shut down on exit."""
    kind = ExecutorKind(kind)
    n = default_workers() if workers is None else workers
    if n < 1:
        raise ValueError(f"workers must be >= 1, got {n}")
    if ray_address is not None and kind is not ExecutorKind.RAY:
        raise ValueError("a Ray address needs the ray executor")
    executor: Executor
    if kind is ExecutorKind.INLINE:
        executor = InlineExecutor()
    elif kind is ExecutorKind.PROCESSES:
        executor = ProcessPoolExecutor(max_workers=n)
    else:
        executor = RayExecutor(n, ray_address)
    try:
        yield executor
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def map_ordered(executor: Executor, fn: Callable[[T], R], items: Iterable[T],
                on_done: Callable[[int, R], None] | None = None, on_wait: Callable[[], None] | None = None,
                wait_s: float = 60.0) -> list[R]:
    """`fn(item)` for every item on `executor`; results in item order. `on_done(index, result)` is called as each
    finishes (in completion order, for progress and for keeping results). On the first failure the items not yet
    started are cancelled; those already running still finish and reach `on_done` (their work is not thrown away:
    a stopped fleet run resumes from what was kept), then the first failure is raised. `on_wait()` is called
    whenever `wait_s` seconds pass with nothing finishing (progress while long items run)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    futures: Sequence[Future[R]] = [executor.submit(fn, item) for item in items]
    index = {f: i for i, f in enumerate(futures)}
    pending = set(futures)
    failure: BaseException | None = None
    while pending:
        done, pending = wait(pending, timeout=None if on_wait is None else wait_s, return_when=FIRST_COMPLETED)
        if not done and on_wait is not None:
            on_wait()
        for future in sorted(done, key=index.__getitem__):
            if future.cancelled():
                continue
            error = future.exception()
            if error is not None:
                if failure is None:
                    failure = error
                    pending = {other for other in pending if not other.cancel()}
                continue
            if on_done is not None:
                on_done(index[future], future.result())
    if failure is not None:
        raise failure
    return [f.result() for f in futures]
