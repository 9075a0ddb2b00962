"""A run of pages that forms one chain (`ChainRun`): each page's parent is the page before it, the first page's parent
is given. It reads as the mapping page -> parent that the pool's run operations take (`KvPool.store_all`,
`IdTierPool.insert_run`, `PageIds.intern_run`, `KvOutbox.stored_items`), but keeps its pages and parents as two
tuples, so those operations read them without copying the run into lists and without comparing the parents with
the pages to find out that the run is a chain. The dict itself is made only where a caller looks a page up.

Why: a decode's received prompt (`walks.admit_prompt`) is ~2,000 pages of one chain at partition scale, and every
step of its store (the pool's run, the id table's intern, the write-through, the KV events) listed the run's pages
and parents and compared them again: about ten passes over the pages per admission, and a list of (page, parent)
pairs and a dict made from it before any of them.

Boundary: the run's shape only; what storing it means is `kvpool`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from evolving_infra.core.pages import PageHash


class ChainRun(Mapping[PageHash, PageHash | None]):
    """The chain `pages` (distinct, non-empty) whose first page's parent is `parent`, as a mapping page -> parent
    in chain order. Immutable."""

    __slots__ = ("pages", "parents", "_dict")

    def __init__(self, pages: tuple[PageHash, ...], parent: PageHash | None) -> None:
        if not pages:
            raise ValueError("a chain run has at least one page")
        self.pages = pages
        self.parents: tuple[PageHash | None, ...] = (parent, *pages[:-1])
        self._dict: dict[PageHash, PageHash | None] | None = None

    @classmethod
    def of(cls, chain: Sequence[PageHash], start: int, end: int | None = None) -> ChainRun:
        """The pages `chain[start:end]` (non-empty) of the chain `chain` (distinct pages, each the parent of the
        next, the first a root): each page's parent is the page before it in `chain`."""
        return cls(tuple(chain[start:end]), chain[start - 1] if start else None)

    @property
    def parent(self) -> PageHash | None:
        """The first page's parent."""
        return self.parents[0]

    def as_dict(self) -> dict[PageHash, PageHash | None]:
        if self._dict is None:
            self._dict = dict(zip(self.pages, self.parents))
        return self._dict

    def pairs(self) -> list[tuple[PageHash, PageHash | None]]:
        """(page, parent) of every page, in order."""
        return list(zip(self.pages, self.parents))

    def __len__(self) -> int:
        return len(self.pages)

    def __iter__(self) -> Iterator[PageHash]:
        return iter(self.pages)

    def __getitem__(self, page: PageHash) -> PageHash | None:
        return self.as_dict()[page]

    def __contains__(self, page: object) -> bool:
        return page in self.as_dict()

    def __repr__(self) -> str:
        return f"ChainRun({len(self.pages)} pages from {self.pages[0]!r}, parent {self.parents[0]!r})"


def pages_and_parents(
    run: Mapping[PageHash, PageHash | None],
) -> tuple[Sequence[PageHash], Sequence[PageHash | None], bool]:
    """(pages, parents, chain) of the run `run` (a mapping page -> parent in order): a `ChainRun`'s own tuples and
    True, or lists of any other mapping's keys and values and whether they form a chain (each page the parent of
    the next)."""
    if type(run) is ChainRun:
        return run.pages, run.parents, True
    pages = list(run)
    parents = list(run.values())
    return pages, parents, parents[1:] == pages[:-1]
