"""A node agent behind SGLang's worker API (`sglang_http`) in PD mode, so that the SGLang gateway can drive
our prefill and decode nodes.

SGLang's PD protocol, as the gateway speaks it: one request goes at once to a prefill worker and to a decode
worker, both carrying the prefill worker's `bootstrap_host` and `disaggregation_bootstrap_port` and a shared
`bootstrap_room`; the prefill worker computes the prompt's KV and the decode worker receives it through the
bootstrap handshake, then generates. Our stand-in for the handshake: a prefill node reports its gRPC port as
its bootstrap port, so (bootstrap_host, bootstrap_port) is the prefill node's gRPC address, and the decode node
pulls the prompt's pages from there exactly as a decode submitted by our router does (`NodeAgent.decode` with
one fetch run). The room is not needed: pages are named by their hashes. A bootstrap address must be one of the
node's configured peers (`settings.peers`), so a request cannot make a node read from anywhere else.

Prompts are page-hashed from their token ids (`core.pages.token_page_hashes`, the real-token page identity).

Boundary: translation between the API's jobs and the node's prefill and decode calls; no HTTP here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from evolving_infra.core.pages import token_page_hashes
from evolving_infra.core.types import BranchId, NodeMode, RequestId
from evolving_infra.node_agent.engine.requests import DecodeRequest, PrefillRequest
from evolving_infra.node_agent.service.decodes import Finished, Tokens
from evolving_infra.node_agent.service.node import NodeAgent
from evolving_infra.node_agent.service.sglang_http import (
    GenerateJob,
    LoadSnapshot,
    RequestError,
    ServerIdentity,
    SglangRole,
    Step,
)

_ROLE = {NodeMode.PREFILL: SglangRole.PREFILL, NodeMode.DECODE: SglangRole.DECODE}


class NodeAgentSglang:
    """`SglangBackend` over an in-process `NodeAgent` in prefill or decode mode."""

    def __init__(self, node: NodeAgent, *, t_acc: float = 1.0) -> None:
        self.node = node
        self.t_acc = t_acc
        self._running = 0

    @property
    def role(self) -> SglangRole:
        return _ROLE.get(self.node.engine.mode, SglangRole.NULL)

    @property
    def page_tokens(self) -> int:
        return self.node.memory.profile.page_tokens

    def identity(self, model: str = "evolving-infra/emulated") -> ServerIdentity:
        """What the node reports in `/server_info`: its gRPC port as the PD bootstrap port."""
        host, _, port = self.node.address.rpartition(":")
        return ServerIdentity(model=model, page_size=self.page_tokens, bootstrap_port=int(port), host=host or "127.0.0.1")

    def load(self) -> LoadSnapshot:
        capacity = self.node.memory.l1_pages * self.page_tokens
        return LoadSnapshot(running=self._running, waiting=0, used_tokens=0, max_total_tokens=capacity)

    async def run(self, job: GenerateJob) -> AsyncIterator[Step]:
        role = self.role
        if role is SglangRole.NULL:
            raise RequestError("this node is not in prefill or decode mode; SGLang's PD API needs one of them")
        pages = tuple(token_page_hashes(list(job.input_ids), self.page_tokens))
        self._running += 1
        try:
            if role is SglangRole.PREFILL:
                yield await self._prefill(job, pages)
            else:
                async for step in self._decode(job, pages):
                    yield step
        finally:
            self._running -= 1

    async def _prefill(self, job: GenerateJob, pages: tuple[int, ...]) -> Step:
        rid = RequestId(job.rid)
        sub = self.node.hub.subscribe(f"sglang:{job.rid}")
        try:
            req = PrefillRequest(rid, BranchId(job.rid), pages, len(job.input_ids), t_acc=self.t_acc)  # type: ignore[arg-type]  # SGLang page ids serve as page hashes
            self.node.submit_prefill(req, {})
            async for event in sub:
                if event.HasField("prefill_finished") and event.prefill_finished.request_id == job.rid:
                    return Step(0, event.prefill_finished.cached_tokens, finished=True)
        finally:
            self.node.hub.unsubscribe(sub)
        raise RequestError(f"the node's event stream ended before the prefill of {job.rid!r} finished")

    async def _decode(self, job: GenerateJob, pages: tuple[int, ...]) -> AsyncIterator[Step]:
        if job.bootstrap is None:
            raise RequestError("a decode worker needs bootstrap_host, bootstrap_port and bootstrap_room")
        address = f"{job.bootstrap.host}:{job.bootstrap.port}"
        if address not in self.node.settings.peers.values():
            raise RequestError(f"bootstrap address {address} is not one of this node's configured peers")
        req = DecodeRequest(RequestId(job.rid), BranchId(job.rid), pages, len(job.input_ids),  # type: ignore[arg-type]  # SGLang page ids serve as page hashes
                            job.max_new_tokens, self.t_acc)  # fmt: skip
        async for item in self.node.decode(req, [(address, pages)]):  # type: ignore[list-item]  # SGLang page ids serve as page hashes
            if isinstance(item, Tokens) and job.stream:
                yield Step(item.total)
            elif isinstance(item, Finished):
                yield Step(item.output_tokens, finished=True)
