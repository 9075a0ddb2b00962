"""Brute-force reference for the content model: explicit token identities, page by page.

A token is `(origin kind, origin name, index)`; a request's context is spelled out token by token. Page
identity is interned per (identity of the previous page prefix, tokens of this page), so two pages get the
same id exactly when their whole prefixes are equal token for token.
"""

from __future__ import annotations

from evolving_infra.traces.records import Trace

Token = tuple[str, str, int]


def contexts(trace: Trace) -> dict[str, list[Token]]:
    out: dict[str, list[Token]] = {}
    for r in trace.requests:
        if r.base is not None:
            head = out[r.base][: r.keep]
        elif r.shared is not None:
            head = [("P", r.shared, k) for k in range(r.keep)]
        else:
            head = []
        out[r.id] = head + [("N", r.id, k) for k in range(r.new)] + [("O", r.id, k) for k in range(r.output_tokens)]
    return out


class PageIds:
    """Interned ids of page prefixes."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, tuple[Token, ...]], int] = {}

    def pages(self, tokens: list[Token], size: int) -> list[int]:
        out: list[int] = []
        parent = -1
        for i in range(len(tokens) // size):
            key = (parent, tuple(tokens[i * size : (i + 1) * size]))
            parent = self.ids.setdefault(key, len(self.ids))
            out.append(parent)
        return out


def ideal_hits(trace: Trace, size: int) -> list[int]:
    """Per request: prompt tokens in full pages produced by an earlier request (unlimited cache)."""
    ids = PageIds()
    ctx = contexts(trace)
    produced: set[int] = set()
    hits: list[int] = []
    for r in trace.requests:
        prompt = ids.pages(ctx[r.id][: r.prompt_tokens], size)
        hits.append(size * sum(1 for p in prompt if p in produced))
        produced.update(ids.pages(ctx[r.id][: r.context_tokens - 1], size))
    return hits
