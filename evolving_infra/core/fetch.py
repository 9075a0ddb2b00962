"""A fetch plan's run: consecutive prompt pages a node lacks and pulls from a peer's host memory.

One type from the directory to the engine. The directory's prefix match names a run by its page indices
`[start, end)` in the prompt and every peer whose host memory holds all of those pages; routing policies price
and choose runs as they are; the router core binds the chosen runs to the request's prompt (`bound`), keeping
the one peer the node will pull from; the wire carries `peer` and `pages`, and the engine reads them.

Boundary: an immutable value with validation; no directory, routing or transfer logic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId


@dataclass(frozen=True, slots=True)
class FetchRun:
    """Prompt pages `[start, end)`, each held in host memory by every one of `peers`.

    `prompt` is the prompt's page hashes once the run is bound to a request (empty before); runs are compared by
    their indices and peers only, as they are only ever compared within one prompt.
    """

    start: int
    end: int
    peers: frozenset[NodeId]
    prompt: tuple[PageHash, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"fetch run [{self.start}, {self.end})"
        if self.start < 0:
            raise ValueError(f"{where}: start must be >= 0")
        if self.end <= self.start:
            raise ValueError(f"{where}: names no pages (end must be > start)")
        if not self.peers:
            raise ValueError(f"{where}: needs at least one peer to fetch from")
        if self.prompt and self.end > len(self.prompt):
            raise ValueError(f"{where}: ends past the prompt's {len(self.prompt)} pages")

    @classmethod
    def of(cls, peer: NodeId, pages: Sequence[PageHash], prompt: Sequence[PageHash]) -> FetchRun:
        """The run of `pages` (consecutive pages of `prompt`, in prompt order) pulled from `peer`.

        Raises ValueError when `pages` is empty or is not a consecutive stretch of `prompt`."""
        runs = cls.runs_of(peer, pages, prompt)
        if len(runs) != 1:
            what = "names no pages" if not runs else f"its {len(pages)} pages are not consecutive prompt pages"
            raise ValueError(f"fetch run from peer {peer!r}: {what}")
        return runs[0]

    @classmethod
    def runs_of(cls, peer: NodeId, pages: Sequence[PageHash], prompt: Sequence[PageHash]) -> tuple[FetchRun, ...]:
        """`pages` (prompt pages, in prompt order, not necessarily consecutive) pulled from `peer`, as runs of
        consecutive prompt pages. Raises ValueError when a page is not in `prompt` or the order is not the
        prompt's."""
        prompt = tuple(prompt)
        position = {page: i for i, page in enumerate(prompt)}
        runs: list[FetchRun] = []
        start = end = -1
        for page in pages:
            i = position.get(page)
            if i is None:
                raise ValueError(f"fetch run from peer {peer!r}: page {page!r} is not in the prompt")
            if i == end:
                end += 1
                continue
            if i < end:
                raise ValueError(f"fetch run from peer {peer!r}: page {page!r} is out of prompt order or repeated")
            if end > start >= 0:
                runs.append(cls(start, end, frozenset((peer,)), prompt))
            start, end = i, i + 1
        if end > start >= 0:
            runs.append(cls(start, end, frozenset((peer,)), prompt))
        return tuple(runs)

    @property
    def count(self) -> int:
        """Pages in the run."""
        return self.end - self.start

    @property
    def peer(self) -> NodeId:
        """The peer the node pulls from: the only one once bound, else the lowest id (deterministic)."""
        return min(self.peers)

    @property
    def pages(self) -> tuple[PageHash, ...]:
        """The run's page hashes, in prompt order. Raises ValueError when the run is not bound to a prompt."""
        if not self.prompt:
            raise ValueError(f"fetch run [{self.start}, {self.end}) is not bound to a prompt")
        return self.prompt[self.start : self.end]

    def bound(self, prompt: tuple[PageHash, ...], peer: NodeId | None = None) -> FetchRun:
        """This run bound to `prompt`, pulled from `peer` (default: `self.peer`, which must be one of `peers`)."""
        chosen = self.peer if peer is None else peer
        if chosen not in self.peers:
            raise ValueError(f"fetch run [{self.start}, {self.end}): peer {chosen!r} does not hold its pages")
        return FetchRun(self.start, self.end, frozenset((chosen,)), prompt)
