"""KV page identity: chained 64-bit page hashes.

A page of `page_tokens` tokens is identified by a hash over its parent page's hash and its own content,
so equal hashes mean equal whole prefixes (as engines identify KV blocks). Only full pages are hashed.
The hash is xxh3-64 (fast, non-cryptographic); the root page's parent is `ROOT_PARENT`.

Boundary: pure functions over bytes and token ids; what a page's content *is* (real token ids, or the
trace content model's spans) is decided by the caller.
"""

from __future__ import annotations

import struct
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from itertools import repeat
from operator import itemgetter
from typing import NewType

import xxhash

PageHash = NewType("PageHash", int)
"""Unsigned 64-bit chained hash of a whole prefix ending at a page boundary."""

DEFAULT_PAGE_TOKENS = 64
ROOT_PARENT = 0
_PARENT = struct.Struct("<Q")


def validate_page_tokens(page_tokens: int) -> int:
    """Return `page_tokens` if it is a usable page size, else raise ValueError naming the bound."""
    if not isinstance(page_tokens, int) or isinstance(page_tokens, bool) or page_tokens < 1:
        raise ValueError(f"page size must be a positive integer number of tokens, got {page_tokens!r}")
    return page_tokens


def hash_page(parent: int, content: bytes) -> PageHash:
    """Hash of a page given its parent's hash (ROOT_PARENT for the first page) and its content bytes."""
    return PageHash(xxhash.xxh3_64_intdigest(_PARENT.pack(parent) + content))


def chain_hashes(contents: Iterable[bytes], parent: int = ROOT_PARENT) -> list[PageHash]:
    """Chained hashes of consecutive pages, each over the previous page's hash and its content."""
    out: list[PageHash] = []
    for content in contents:
        parent = hash_page(parent, content)
        out.append(PageHash(parent))
    return out


def token_page_hashes(tokens: Sequence[int], page_tokens: int = DEFAULT_PAGE_TOKENS) -> list[PageHash]:
    """Page hashes of a real token sequence: full pages only, content = token ids as int32 little-endian."""
    validate_page_tokens(page_tokens)
    full = len(tokens) // page_tokens
    pages = (
        struct.pack(f"<{page_tokens}i", *tokens[i * page_tokens : (i + 1) * page_tokens]) for i in range(full)
    )
    return chain_hashes(pages)


class CountUpdates(Mapping[PageHash, int]):
    """Branch counts of pages (page -> count, 0 = released) kept as they were made: `groups`, the stretches of
    pages given one count each, in order; read as a mapping, it is the dict those stretches give applied in order
    (built on first read, so a reader that takes the stretches, `KvPool.set_counts`, never pays for it).

    `consistent` is the producer's promise that a page in two stretches has the same count in both (the router's
    pushes: every count is read at the push); then applying the stretches one after another changes a table
    exactly as the dict does, overlapping or not."""

    __slots__ = ("groups", "consistent", "_dict")

    def __init__(self, *, consistent: bool = False) -> None:
        self.groups: list[tuple[Sequence[PageHash], int]] = []
        self.consistent = consistent
        self._dict: dict[PageHash, int] | None = None

    def add(self, pages: Sequence[PageHash], count: int) -> None:
        """`pages` (distinct) now have `count`."""
        if not pages:
            return
        self.groups.append((pages, count))
        self._dict = None

    def as_dict(self) -> dict[PageHash, int]:
        """The updates as a plain dict (kept until the next `add`; do not change it)."""
        out = self._dict
        if out is None:
            out = self._dict = {}
            for pages, count in self.groups:
                out.update(zip(pages, repeat(count)))
        return out

    def disjoint(self) -> bool:
        """Whether no page is in two groups (then each group's pages hold its count)."""
        return sum(map(len, map(itemgetter(0), self.groups))) == len(self.as_dict())

    def __getitem__(self, page: PageHash) -> int:
        return self.as_dict()[page]

    def __iter__(self) -> Iterator[PageHash]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __bool__(self) -> bool:
        return bool(self.groups)  # (no empty stretch is kept)

    def keys(self) -> KeysView[PageHash]:
        return self.as_dict().keys()

    def items(self) -> ItemsView[PageHash, int]:
        return self.as_dict().items()

    def values(self) -> ValuesView[int]:
        return self.as_dict().values()

    def __repr__(self) -> str:
        return f"CountUpdates({self.as_dict()!r})"
