"""Prompt token ids for a trace's requests, built from the trace's content model.

A trace has no token ids; its content model says which tokens are the same: a token is `(origin, index)`, the
origin being a prefix, a request's new tokens or a request's output. Every such token gets one deterministic
31-bit id, `(seed(origin) + index * ODD) mod 2**31`, `seed` an xxhash of the origin. Within one origin the map is
a bijection (an odd multiplier is invertible mod 2**31), so a request's prompt ids equal another's on exactly the
tokens the trace says they share, and the router's page hashes of the ids see the trace's sharing (two different
origins could only share a whole 64-token page by a chance collision of 64 ids).

Boundary: pure; ids for requests on demand, nothing cached beyond the content model's own cache.
"""

from __future__ import annotations

import numpy as np
import xxhash

from evolving_infra.traces.content import ContentModel, Origin
from evolving_infra.traces.records import Relation, Trace

_MASK = 0x7FFFFFFF
_ODD = 0x9E3779B1 & _MASK  # 2654435761 mod 2**31, odd


def origin_seed(kind: Origin, origin: int, namespace: int = 0) -> int:
    """The id of token 0 of an origin."""
    return xxhash.xxh3_64_intdigest(f"{namespace}:{int(kind)}:{origin}".encode()) & _MASK


class PromptBuilder:
    """Token ids of each request's prompt (see the module docstring)."""

    def __init__(self, trace: Trace, *, namespace: int = 0) -> None:
        self.trace = trace
        self.namespace = namespace
        self.model = ContentModel(trace, cache_size=64)

    def token_ids(self, request_id: str) -> list[int]:
        """The prompt of `request_id` as token ids (length = the trace's prompt tokens)."""
        r = self.trace.request(request_id)
        parts = []
        for kind, origin, lo, hi in self.model.context_spans(request_id, 0, r.prompt_tokens):
            idx = np.arange(lo, hi, dtype=np.int64)
            parts.append((origin_seed(Origin(kind), origin, self.namespace) + idx * _ODD) & _MASK)
        if not parts:
            return []
        return np.concatenate(parts).tolist()

    def parent_branch(self, branch: str) -> str | None:
        """The branch `branch` was started from, judged by its first request (fork: its base's branch;
        sub-agent: the branch it waits on, else the agent's first branch); None for an agent's first branch."""
        first = self.trace.branches[branch].requests[0]  # type: ignore[index]  # str branch id into the BranchId-keyed map
        r = self.trace.request(first)
        if r.relation not in (Relation.FORK, Relation.SUB_AGENT):
            return None
        if r.base is not None:
            parent = self.trace.request(r.base).branch
        elif r.after:
            parent = self.trace.request(r.after[-1]).branch
        else:
            parent = next(b.id for b in self.trace.branches.values() if b.agent == r.agent)
        return None if parent == branch else str(parent)
