"""`RecordingBackend` behind the real HTTP front end: chat turns of an agent with a sub-agent, sent through
`/v1/chat/completions` with branch headers, come out as a valid trace whose turns are appends."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from evolving_infra.router.http import FakeBackend, RouterHttpSettings, create_app
from evolving_infra.router.http.recording import RecordingBackend
from evolving_infra.router.recording import TraceRecorder
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Relation


def test_chat_turns_through_http_are_recorded_as_a_valid_trace() -> None:
    times = iter(float(t) for t in range(1000))
    recorder = TraceRecorder(4)
    backend = RecordingBackend(FakeBackend(), recorder, clock=lambda: next(times))

    async def main() -> None:
        app = create_app(RouterHttpSettings(), backend, clock=lambda: 1_700_000_000.0)
        async with TestClient(TestServer(app)) as client:
            messages: list[dict[str, Any]] = [{"role": "system", "content": "you are a careful coding agent " * 4},
                                              {"role": "user", "content": "fix the bug"}]  # fmt: skip
            for turn in range(3):
                response = await client.post(
                    "/v1/chat/completions", headers={"x-evolving-branch-id": "main"},
                    json={"messages": messages, "max_tokens": 5},
                )  # fmt: skip
                assert response.status == 200
                answer = (await response.json())["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"result {turn}"}]
                if turn == 0:
                    sub = await client.post(
                        "/v1/chat/completions",
                        headers={"x-evolving-branch-id": "sub", "x-evolving-parent-branch-id": "main",
                                 "x-evolving-branch-finished": "true"},
                        json={"messages": messages[:1] + [{"role": "user", "content": "look around"}], "max_tokens": 3},
                    )  # fmt: skip
                    assert sub.status == 200

    asyncio.run(main())
    trace = trace_from_records(recorder.records())
    assert len(trace.requests) == 4 and len(trace.agents) == 1 and len(trace.branches) == 2
    main_requests = [r for r in trace.requests if r.branch == "b0"]
    assert main_requests[0].relation is Relation.ROOT
    # The emulated tokenizer renders an answer sent back exactly as generated, so later turns are appends.
    assert [r.relation for r in main_requests[1:]] == [Relation.APPEND, Relation.APPEND]
    sub = next(r for r in trace.requests if r.branch == "b1")
    assert sub.relation is Relation.FORK and sub.keep > 0  # shares the system prompt's pages with main
    assert [e.branch for e in trace.branch_ends] == ["b1"]
    assert main_requests[1].after[-1] == sub.id, "the parent's next turn waits for the finished sub-agent"


def test_times_are_the_front_ends_arrival_and_the_first_token_handed_to_it() -> None:
    """A request is recorded from when the front end received it (`RequestContext.arrived_at`, before its body
    was parsed), and its first token once the front end took it and asked for more (it had written it)."""
    from evolving_infra.core.types import RequestId
    from evolving_infra.router.http.backend import BranchRef, CompletionRequest
    from evolving_infra.router.http.state import CURRENT, RequestContext

    recorder = TraceRecorder(4)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        backend = RecordingBackend(FakeBackend(), recorder, clock=loop.time)
        CURRENT.set(RequestContext(RequestId("q1"), loop.time() - 0.2))  # the front end got it 0.2 s ago
        request = CompletionRequest(RequestId("q1"), "m", tuple(range(10)), BranchRef(None, "main"), max_tokens=3)
        stream = backend.complete(request)
        async for chunk in stream:
            if chunk.token_ids:
                await asyncio.sleep(0.1)  # the front end writing the first token

    asyncio.run(main())
    (row,) = [r for r in recorder.records() if r["kind"] == "request"]
    assert row["recorded_ttft_s"] >= 0.3 and row["recorded_e2e_s"] >= row["recorded_ttft_s"]
