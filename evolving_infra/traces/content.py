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

Lazy (`lazy=True`, what the simulator uses): a request's own pages are hashed when first asked for (its own or a
descendant's context), then kept until `release` drops them; a released request is hashed again if asked for
later. Own pages are a pure function of the trace's structure, so the hashes are the same whatever is asked
for first, and the same as the eager model's (which hashes every request in file order when built). The
trace may grow while the model is in use (`traces.growing.GrowingTrace` appends agents in file order).

Labels (`PageLabels`): by default a page is named by its chained content hash (as a real engine names it). With
`PageLabels.DENSE` (what the simulator uses) a page is named by its place in the trace instead: prefix pages,
then each request's own pages in file order, numbered consecutively from 1 (plus a tag of the namespace in the
top 20 bits). Own pages are exactly the pages that no other request or prefix makes for itself (above), so two
pages have equal labels exactly when they have equal content hashes (without the hashes' 64-bit collisions):
every consumer that only compares pages sees the same cache hits, evictions by key, runs and chains. What
differs is the numbers: where an order falls back on the page hash (the engine's tie-break of equal eviction
keys) it follows the labels, and a prompt's pages are runs of consecutive small integers, which Python's dicts
and sets keyed by page probe at neighbouring slots (a page table at 10^5-10^6 entries costs ~60 ns per probe
instead of ~290 ns for random 64-bit keys: docs/benchmarks.md). Labels are a pure function of the trace's
structure (file order and the requests' lengths), so they are the same however the pages are asked for.

Boundary: pure computation over a validated `Trace` (or a `GrowingTrace`); no I/O.
"""

from __future__ import annotations

import enum
import struct
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import xxhash

from evolving_infra.core.pages import DEFAULT_PAGE_TOKENS, ROOT_PARENT, PageHash, hash_page, validate_page_tokens
from evolving_infra.traces.records import Prefix, Relation, Request

PageArray = npt.NDArray[np.uint64]
ProgressFn = Callable[[int, int], None]
"""Called as `progress(done, total)` while a long computation runs."""

_SPAN = struct.Struct("<BIII")
_PAGE = struct.Struct("<QBIII")  # a page of one span as `hash_page` hashes it: parent (u64) then the span


_TAG_SHIFT = 44
"""Dense labels: the namespace's tag sits above this bit, the page's number below (2^44 pages per model)."""


class PageLabels(enum.Enum):
    """How a content model names pages (module docstring, "Labels")."""

    CONTENT_HASH = "content-hash"
    """The chained xxh3 hash of the page's token identities (the default; what exports and live replays use)."""
    DENSE = "dense"
    """The page's number in the trace (prefixes, then requests' own pages in file order): the simulator's."""


def _namespace_tag(namespace: int) -> int:
    """The top 20 bits of every dense label of a model with `namespace` (0 for the root namespace)."""
    if namespace == ROOT_PARENT:
        return 0
    return (xxhash.xxh3_64_intdigest(namespace.to_bytes(8, "little")) % ((1 << 20) - 1) + 1) << _TAG_SHIFT


class Origin(enum.IntEnum):
    """Where a token comes from (the first byte of an encoded span)."""

    PREFIX = 0
    NEW = 1
    OUTPUT = 2


Span = tuple[Origin, int, int, int]
"""`(origin kind, origin id, lo, hi)`: tokens lo..hi-1 of that origin (prefix index or request index)."""


class TraceSource(Protocol):
    """What the model reads of a trace: a `Trace`, or a `GrowingTrace` whose requests grow in file order."""

    @property
    def prefixes(self) -> Mapping[str, Prefix]: ...
    @property
    def requests(self) -> Sequence[Request]: ...
    def request(self, rid: str) -> Request: ...


class ContentModel:
    """Page hashes of every request of `trace` for pages of `page_tokens` tokens.

    `namespace` is the parent hash of every first page: give two traces replayed together different
    namespaces so their fresh content never collides (prefixes then differ too). `labels`: content hashes, or
    dense labels (module docstring; with them two namespaces' labels differ in their top 20 bits, equal for a
    pair of namespaces with probability 2^-20).
    """

    def __init__(
        self,
        trace: TraceSource,
        page_tokens: int = DEFAULT_PAGE_TOKENS,
        *,
        namespace: int = ROOT_PARENT,
        cache_size: int = 256,
        progress: ProgressFn | None = None,
        lazy: bool = False,
        labels: PageLabels = PageLabels.CONTENT_HASH,
    ) -> None:
        validate_page_tokens(page_tokens)
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.trace = trace
        self.page_tokens = page_tokens
        self.namespace = namespace
        self._cache_size = cache_size
        self._cache: OrderedDict[int, PageArray] = OrderedDict()
        self._base = array("q")
        """Per request (file order): the index of its base, or -1."""
        self._kept = array("q")
        """Per request: keep // page_tokens (its pages shared with its source)."""
        self._own: list[PageArray | None] = []
        """Per request: its own pages once hashed (None before, and after `release`)."""
        self.hashed_requests = 0
        """How many times a request's own pages were hashed (a released one hashed again counts again)."""
        self.labels = labels
        self._first = array("Q")
        """Per request (dense labels): the label of its first own page."""
        self._next_label = _namespace_tag(namespace) + 1
        self._prefix_pages: dict[str, PageArray] = {}
        for p in trace.prefixes.values():
            n = p.tokens // page_tokens
            if labels is PageLabels.DENSE:
                self._prefix_pages[p.name] = self._numbered(self._next_label, n)
                self._next_label += n
            else:
                self._prefix_pages[p.name] = self._hash_spans(namespace, [(Origin.PREFIX, p.index, 0, p.tokens)], n)
        self._sync()
        if not lazy:
            self.hash_all(progress)

    def hash_all(self, progress: ProgressFn | None = None) -> None:
        """Hash every request of the trace now (in file order) that is not hashed yet."""
        self._sync()
        total = len(self._own)
        step = max(1, total // 100)
        for i in range(total):
            self._own_of(i)
            if progress is not None and (i + 1 == total or (i + 1) % step == 0):
                progress(i + 1, total)

    def release(self, indices: Iterable[int]) -> None:
        """Drop the own pages (and cached contexts) of the requests at `indices`; asked for again, they are hashed
        again. The caller releases what it will not ask for soon (the simulator: a finished agent's requests)."""
        for i in indices:
            if i < len(self._own):
                self._own[i] = None
                self._cache.pop(i, None)

    def _sync(self) -> None:
        """Extend the per-request tables to the trace's current length (it may have grown)."""
        reqs = self.trace.requests
        size = self.page_tokens
        for i in range(len(self._own), len(reqs)):
            r = reqs[i]
            self._base.append(self.trace.request(r.base).index if r.base is not None else -1)
            self._kept.append(r.keep // size)
            self._own.append(None)
            self._first.append(self._next_label)
            self._next_label += max(0, r.context_tokens // size - r.keep // size)  # (its own pages' count)

    def _index(self, rid: str) -> Request:
        r = self.trace.request(rid)
        if r.index >= len(self._own):
            self._sync()
        return r

    # -- public ------------------------------------------------------------------------------------------
    def relation(self, rid: str) -> Relation:
        return self.trace.request(rid).relation

    def context_pages(self, rid: str) -> PageArray:
        """Hashes of the full pages of the request's context (prompt then output), read-only."""
        return self._context(self._index(rid).index)

    def prompt_pages(self, rid: str) -> PageArray:
        """Hashes of the full pages of the request's prompt."""
        r = self._index(rid)
        return self._context(r.index)[: r.prompt_tokens // self.page_tokens]

    def produced_pages(self, rid: str) -> PageArray:
        """Hashes of the full pages whose KV the request produces: prompt and output but the last output token."""
        r = self._index(rid)
        return self._context(r.index)[: (r.context_tokens - 1) // self.page_tokens]

    def prompt_page_hashes(self, rid: str) -> list[PageHash]:
        """`prompt_pages` as a list of `PageHash` ints (for the KV directory and the router)."""
        return [PageHash(int(h)) for h in self.prompt_pages(rid)]

    def prefix_pages(self, name: str) -> PageArray:
        """Hashes of the full pages of prefix `name`."""
        return self._prefix_pages[name]

    def own_pages(self, rid: str) -> PageArray:
        """The pages this request hashed itself: from keep // page_tokens to its last full context page."""
        return self._own_of(self._index(rid).index)

    def context_spans(self, rid: str, start: int, end: int) -> list[Span]:
        """Origin spans of tokens start..end-1 of the request's context (for tests and debugging)."""
        r = self._index(rid)
        if not 0 <= start <= end <= r.context_tokens:
            raise ValueError(f"token range {start}..{end} is outside the context of {rid!r} ({r.context_tokens})")
        return self._spans(r.index, start, end)

    def memory_bytes(self) -> int:
        """Bytes held in page arrays (own pages, prefix pages and the context cache) and per-request tables."""
        arrays = [*(a for a in self._own if a is not None), *self._prefix_pages.values(), *self._cache.values()]
        tables = (len(self._base) + len(self._kept) + len(self._first)) * self._base.itemsize
        return int(sum(a.nbytes for a in arrays)) + tables

    def held_requests(self) -> int:
        """Requests whose own pages are held now."""
        return sum(a is not None for a in self._own)

    # -- construction ------------------------------------------------------------------------------------
    def _own_of(self, i: int) -> PageArray:
        """Request i's own pages, hashing them (and, first, those of the ancestor they chain from) if needed."""
        if i >= len(self._own):
            self._sync()
        own = self._own[i]
        if own is not None:
            return own
        stack = [i]
        while stack:
            k = stack[-1]
            if self._own[k] is not None:
                stack.pop()
                continue
            dep = self._parent_owner(k)
            if dep >= 0 and self._own[dep] is None:
                stack.append(dep)
                continue
            self._own[k] = self._own_pages(k)
            self.hashed_requests += 1
            stack.pop()
        own = self._own[i]
        assert own is not None
        return own

    def _parent_owner(self, i: int) -> int:
        """The request whose own pages hold the page before request i's first own page (-1: a prefix or none)."""
        j = self._kept[i] - 1
        if j < 0:
            return -1
        cur = i
        while True:
            cur = self._base[cur]
            if cur < 0:
                return -1
            if j >= self._kept[cur]:
                return cur

    @staticmethod
    def _numbered(first: int, n: int) -> PageArray:
        arr = np.arange(first, first + n, dtype=np.uint64)
        arr.setflags(write=False)
        return arr

    def _own_pages(self, i: int) -> PageArray:
        r = self.trace.requests[i]
        size = self.page_tokens
        kept = self._kept[i]
        full = r.context_tokens // size
        if self.labels is PageLabels.DENSE:
            return self._numbered(self._first[i], max(0, full - kept))
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
            i = self._base[i]
            kept = self._kept[i]
            if j >= kept:
                own = self._own[i]
                assert own is not None  # hashed first by `_own_of`
                return int(own[j - kept])

    def _source_spans(self, i: int, start: int, end: int) -> list[Span]:
        r = self.trace.requests[i]
        if r.base is None:
            assert r.shared is not None
            return [(Origin.PREFIX, self.trace.prefixes[r.shared].index, start, end)]
        return self._spans(self._base[i], start, end)

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
            i = self._base[i]
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
            kept = min(self._kept[cur], limit)
            if limit > kept:
                segments.append(self._own_of(cur)[: limit - kept])
            limit = kept
            if limit == 0:
                break
            r = self.trace.requests[cur]
            if r.base is None:
                assert r.shared is not None
                segments.append(self._prefix_pages[r.shared][:limit])
                break
            cur = self._base[cur]
        segments.reverse()
        arr = np.concatenate(segments) if segments else np.empty(0, dtype=np.uint64)
        arr.setflags(write=False)
        if self._cache_size:
            self._cache[i] = arr
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return arr
