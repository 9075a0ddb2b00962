"""The content model: which KV pages each request's prompt and context are made of.

A trace has no token ids, so token identity is structural: a token is `(origin, index)`, where the origin is a
prefix, a request's `new` tokens, or a request's output. A request's context is the first `keep` tokens of its
source (the base's context, or the prefix), then its `new` tokens, then its output. A page's content is the list
of origin spans covering its tokens, each encoded as `(kind u8, origin u32, lo u32, hi u32)` little-endian;
pages are chained with `core.pages.hash_page` from the root `namespace`.

Invariant: two pages at the same position have equal hashes exactly when the token identities of the whole
prefixes up to the ends of those pages are equal (up to 64-bit hash collisions). Hence page j < keep // P of a
request's context *is* page j of its source's context, and every page from keep // P on holds a fresh token
of the request (its output has at least one token), so it is shared only with requests that keep it through
a chain of bases.

Cost: each request hashes only its own pages (from keep // P up to its last full context page); inherited
pages are copied from the source, never rehashed. Memory is one uint64 per own page plus a bounded LRU of
materialized contexts.

Boundary: pure computation over a validated `Trace`; no I/O.
"""

from __future__ import annotations

import enum
import struct
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import xxhash

from evolving_infra.core.pages import DEFAULT_PAGE_TOKENS, ROOT_PARENT, PageHash, hash_page, validate_page_tokens
from evolving_infra.traces.records import Relation, Trace

PageArray = npt.NDArray[np.uint64]
ProgressFn = Callable[[int, int], None]
"""Called as `progress(done, total)` while a long computation runs."""

_SPAN = struct.Struct("<BIII")
_PAGE = struct.Struct("<QBIII")  # a page of one span as `hash_page` hashes it: parent (u64) then the span


class Origin(enum.IntEnum):
    """Where a token comes from (the first byte of an encoded span)."""

    PREFIX = 0
    NEW = 1
    OUTPUT = 2


Span = tuple[Origin, int, int, int]
"""`(origin kind, origin id, lo, hi)`: tokens lo..hi-1 of that origin (prefix index or request index)."""


class ContentModel:
    """Page hashes of every request of `trace` for pages of `page_tokens` tokens.

    `namespace` is the parent hash of every first page: give two traces replayed together different
    namespaces so their fresh content never collides (prefixes then differ too).
    """

    def __init__(
        self,
        trace: Trace,
        page_tokens: int = DEFAULT_PAGE_TOKENS,
        *,
        namespace: int = ROOT_PARENT,
        cache_size: int = 256,
        progress: ProgressFn | None = None,
    ) -> None:
        validate_page_tokens(page_tokens)
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.trace = trace
        self.page_tokens = page_tokens
        self.namespace = namespace
        self._cache_size = cache_size
        self._cache: OrderedDict[int, PageArray] = OrderedDict()
        reqs = trace.requests
        index = {r.id: r.index for r in reqs}
        self._base = np.array([index[r.base] if r.base is not None else -1 for r in reqs], dtype=np.int64)
        self._kept = np.array([r.keep // page_tokens for r in reqs], dtype=np.int64)
        self._prefix_pages: dict[str, PageArray] = {
            p.name: self._hash_spans(namespace, [(Origin.PREFIX, p.index, 0, p.tokens)], p.tokens // page_tokens)
            for p in trace.prefixes.values()
        }
        self._own: list[PageArray] = []
        total = len(reqs)
        step = max(1, total // 100)
        for i in range(total):
            self._own.append(self._own_pages(i))
            if progress is not None and (i + 1 == total or (i + 1) % step == 0):
                progress(i + 1, total)

    # -- public ------------------------------------------------------------------------------------------
    def relation(self, rid: str) -> Relation:
        return self.trace.request(rid).relation

    def context_pages(self, rid: str) -> PageArray:
        """Hashes of the full pages of the request's context (prompt then output), read-only."""
        return self._context(self.trace.request(rid).index)

    def prompt_pages(self, rid: str) -> PageArray:
        """Hashes of the full pages of the request's prompt."""
        r = self.trace.request(rid)
        return self._context(r.index)[: r.prompt_tokens // self.page_tokens]

    def produced_pages(self, rid: str) -> PageArray:
        """Hashes of the full pages whose KV the request produces: prompt and output but the last output token."""
        r = self.trace.request(rid)
        return self._context(r.index)[: (r.context_tokens - 1) // self.page_tokens]

    def prompt_page_hashes(self, rid: str) -> list[PageHash]:
        """`prompt_pages` as a list of `PageHash` ints (for the KV directory and the router)."""
        return [PageHash(int(h)) for h in self.prompt_pages(rid)]

    def prefix_pages(self, name: str) -> PageArray:
        """Hashes of the full pages of prefix `name`."""
        return self._prefix_pages[name]

    def own_pages(self, rid: str) -> PageArray:
        """The pages this request hashed itself: from keep // page_tokens to its last full context page."""
        return self._own[self.trace.request(rid).index]

    def context_spans(self, rid: str, start: int, end: int) -> list[Span]:
        """Origin spans of tokens start..end-1 of the request's context (for tests and debugging)."""
        r = self.trace.request(rid)
        if not 0 <= start <= end <= r.context_tokens:
            raise ValueError(f"token range {start}..{end} is outside the context of {rid!r} ({r.context_tokens})")
        return self._spans(r.index, start, end)

    def memory_bytes(self) -> int:
        """Bytes held in page arrays (own pages, prefix pages and the context cache)."""
        arrays = [*self._own, *self._prefix_pages.values(), *self._cache.values()]
        return int(sum(a.nbytes for a in arrays)) + self._base.nbytes + self._kept.nbytes

    # -- construction ------------------------------------------------------------------------------------
    def _own_pages(self, i: int) -> PageArray:
        r = self.trace.requests[i]
        size = self.page_tokens
        kept = int(self._kept[i])
        full = r.context_tokens // size
        parent = self._page_at(i, kept - 1) if kept > 0 else self.namespace
        spans: list[Span] = []
        if r.keep > kept * size:
            spans.extend(self._source_spans(i, kept * size, r.keep))
        spans.append((Origin.NEW, i, 0, r.new))
        spans.append((Origin.OUTPUT, i, 0, r.output_tokens))
        return self._hash_spans(parent, spans, full - kept)

    def _hash_spans(self, parent: int, spans: list[Span], pages: int) -> PageArray:
        """Chain-hash the first `pages` full pages of the token run `spans` (which starts at a page boundary)."""
        size = self.page_tokens
        out: list[int] = []
        pieces: list[bytes] = []
        fill = 0
        pack_page, digest = _PAGE.pack, xxhash.xxh3_64_intdigest
        for kind, oid, lo, hi in spans:
            while lo < hi and len(out) < pages:
                if fill == 0 and hi - lo >= size:
                    # Whole pages of one span: hash_page(parent, _SPAN.pack(...)) inlined (one pack, one call).
                    for lo in range(lo, lo + min((hi - lo) // size, pages - len(out)) * size, size):
                        parent = digest(pack_page(parent, kind, oid, lo, lo + size))
                        out.append(parent)
                    lo += size
                    continue
                take = min(hi - lo, size - fill)
                pieces.append(_SPAN.pack(kind, oid, lo, lo + take))
                fill += take
                lo += take
                if fill == size:
                    parent = hash_page(parent, b"".join(pieces))
                    out.append(parent)
                    pieces, fill = [], 0
        arr = np.array(out, dtype=np.uint64)
        arr.setflags(write=False)
        return arr

    def _page_at(self, i: int, j: int) -> int:
        """Hash of page j of the *source* of request i (its base's context or its prefix)."""
        while True:
            r = self.trace.requests[i]
            if r.base is None:
                assert r.shared is not None
                return int(self._prefix_pages[r.shared][j])
            i = int(self._base[i])
            kept = int(self._kept[i])
            if j >= kept:
                return int(self._own[i][j - kept])

    def _source_spans(self, i: int, start: int, end: int) -> list[Span]:
        r = self.trace.requests[i]
        if r.base is None:
            assert r.shared is not None
            return [(Origin.PREFIX, self.trace.prefixes[r.shared].index, start, end)]
        return self._spans(int(self._base[i]), start, end)

    def _spans(self, i: int, start: int, end: int) -> list[Span]:
        """Origin spans of tokens start..end-1 of the context of request i, walking down its bases."""
        out: list[Span] = []
        while start < end:
            r = self.trace.requests[i]
            fresh = r.keep + r.new
            if end > fresh:
                out.append((Origin.OUTPUT, i, max(start, fresh) - fresh, end - fresh))
            lo, hi = max(start, r.keep), min(end, fresh)
            if lo < hi:
                out.append((Origin.NEW, i, lo - r.keep, hi - r.keep))
            end = min(end, r.keep)
            if start >= end:
                break
            if r.base is None:
                assert r.shared is not None
                out.append((Origin.PREFIX, self.trace.prefixes[r.shared].index, start, end))
                break
            i = int(self._base[i])
        out.reverse()
        return out

    # -- materialized contexts ---------------------------------------------------------------------------
    def _context(self, i: int) -> PageArray:
        cached = self._cache.get(i)
        if cached is not None:
            self._cache.move_to_end(i)
            return cached
        segments: list[PageArray] = []
        limit = self.trace.requests[i].context_tokens // self.page_tokens
        cur = i
        while limit > 0:
            hit = self._cache.get(cur) if cur != i else None
            if hit is not None:
                segments.append(hit[:limit])
                break
            kept = min(int(self._kept[cur]), limit)
            if limit > kept:
                segments.append(self._own[cur][: limit - kept])
            limit = kept
            if limit == 0:
                break
            r = self.trace.requests[cur]
            if r.base is None:
                assert r.shared is not None
                segments.append(self._prefix_pages[r.shared][:limit])
                break
            cur = int(self._base[cur])
        segments.reverse()
        arr = np.concatenate(segments) if segments else np.empty(0, dtype=np.uint64)
        arr.setflags(write=False)
        if self._cache_size:
            self._cache[i] = arr
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return arr
