"""`RecordingBackend`: a `RouterBackend` that passes every call to another backend and feeds a
`TraceRecorder` (router/recording.py) with what it served: the prompt's token ids when a request is handed
over, the output's token ids, the first token's time and the prefill's queue wait (the backend's `ServingNodes`)
when it ends (however it ends), and finished branches.

Branches are keyed by `BranchRef.scoped_id()` (tenants kept apart); the recorder writes its own ids, never the
client's. The clock is injected (the router's).

Times are the HTTP front end's, as near the client as the router sees: a request arrives when the front end
received it (`RequestContext.arrived_at`: before its body was read, parsed and checked; the handover time outside
a front end), and its first token counts once the front end has written it to the client's stream (the
generator resumes after the front end wrote the chunk), not when the backend produced it.

`write_recording` writes the trace and the fitted node models at shutdown.

Boundary: async glue between the HTTP front end's backend protocol and the pure recorder, and the two files.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from evolving_infra.core.types import NodeId
from evolving_infra.router.http.backend import (
    BranchRef,
    CompletionRequest,
    FinishOutcome,
    ModelCard,
    Readiness,
    RouterBackend,
    TokenChunk,
)
from evolving_infra.router.fitting import FittedNodeModel
from evolving_infra.router.http.state import CURRENT
from evolving_infra.router.recording import TraceRecorder, models_document
from evolving_infra.traces.writer import write_records

log = logging.getLogger(__name__)


class RecordingBackend:
    """Serves through `inner` and records into `recorder` (module docstring)."""

    def __init__(self, inner: RouterBackend, recorder: TraceRecorder, clock: Callable[[], float]) -> None:
        self.inner = inner
        self.recorder = recorder
        self.clock = clock

    async def complete(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        rid = str(request.request_id)
        parent = request.parent.scoped_id() if request.parent is not None else None
        arrived = self.clock() - _since_arrival()
        self.recorder.begin(rid, request.branch.scoped_id(), parent, request.prompt_token_ids, arrived)
        output: list[int] = []
        first: float | None = None
        cached: int | None = None
        queue: float | None = None
        stream = self.inner.complete(request)
        try:
            async for chunk in stream:
                output.extend(chunk.token_ids)
                if chunk.cached_tokens is not None:
                    cached = chunk.cached_tokens
                if chunk.serving is not None and chunk.serving.queue_s is not None:
                    queue = chunk.serving.queue_s
                yield chunk
                if chunk.token_ids and first is None:
                    first = self.clock()  # the front end wrote it and asks for more
        finally:
            end = self.clock()
            first = first if first is not None or not output else end  # the stream ended at its first tokens
            self.recorder.end(rid, output, end, first_token_s=first, cached_tokens=cached, queue_s=queue)
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()

    async def finish_branch(self, branch: BranchRef) -> FinishOutcome:
        outcome = await self.inner.finish_branch(branch)
        self.recorder.finish_branch(branch.scoped_id())
        return outcome

    def models(self) -> Sequence[ModelCard]:
        return self.inner.models()

    def readiness(self) -> Readiness:
        return self.inner.readiness()


def _since_arrival() -> float:
    """Seconds since the HTTP front end received the current request (0 outside a front end's request)."""
    context = CURRENT.get(None)
    if context is None:
        return 0.0
    return max(0.0, asyncio.get_running_loop().time() - context.arrived_at)


def write_recording(
    trace_path: Path | None, recorder: TraceRecorder | None, models_path: Path | None,
    fitted: Mapping[NodeId, FittedNodeModel], profile: str,
) -> None:  # fmt: skip
    """Write the recorded trace and the fitted models where asked (a failure is logged, never raised: this
    runs during shutdown)."""
    try:
        if trace_path is not None and recorder is not None:
            write_records(recorder.records(), trace_path)
            log.info("recorded %d requests to %s (%s)", recorder.report.requests, trace_path, recorder.report.to_dict())
        if models_path is not None:
            models_path.write_text(json.dumps(models_document(fitted, profile=profile), indent=1) + "\n")
    except OSError:
        log.exception("writing the recording failed")
