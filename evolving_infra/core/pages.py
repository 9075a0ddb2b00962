"""KV page identity: chained 64-bit page hashes.

A page of `page_tokens` tokens is identified by a hash over its parent page's hash and its own content,
so equal hashes mean equal whole prefixes (as engines identify KV blocks). Only full pages are hashed.
The hash is xxh3-64 (fast, non-cryptographic); the root page's parent is `ROOT_PARENT`.

Boundary: pure functions over bytes and token ids; what a page's content *is* (real token ids, or the
trace content model's spans) is decided by the caller.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
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


class CountUpdates(dict[PageHash, int]):
    """Branch counts of pages (page -> count, 0 = released) that also keep how they were made: `groups`, the
    stretches of pages given one count each, in order. Applying the groups in order gives the dict's content; a
    reader that takes them (`KvPool.set_counts`) checks a count once per stretch instead of once per page. Read
    as a plain mapping everywhere else (equal to the dict of the same items)."""

    __slots__ = ("groups",)

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[tuple[Sequence[PageHash], int]] = []

    def add(self, pages: Sequence[PageHash], count: int) -> None:
        """`pages` (distinct) now have `count`."""
        if not pages:
            return
        self.update(zip(pages, repeat(count)))
        self.groups.append((pages, count))

    def disjoint(self) -> bool:
        """Whether no page is in two groups (then each group's pages hold its count)."""
        return sum(map(len, map(itemgetter(0), self.groups))) == len(self)
