"""Errors of the host KV arena and the transports.

Each names what went wrong and where. `TransportUnavailable` is permanent on this node (a library or a
peer's transport is missing: use another transport); `TransferFailed` may be temporary (retry, or fetch
from another peer); `PagesMissing` means the peer no longer holds pages (re-plan the fetch);
`ChecksumMismatch` means bytes arrived damaged or the peer reused the slot mid-read (retry).
"""

from __future__ import annotations

from collections.abc import Iterable

from evolving_infra.core.pages import PageHash


def _hexes(pages: Iterable[PageHash], limit: int = 8) -> str:
    pages = list(pages)
    shown = ", ".join(f"{p:#018x}" for p in pages[:limit])
    return shown + (f" and {len(pages) - limit} more" if len(pages) > limit else "")


class TransferError(Exception):
    """Base of every arena and transport error."""


class ArenaFull(TransferError):
    def __init__(self, wanted: int, free: int, slots: int) -> None:
        super().__init__(f"host arena full: {wanted} slot(s) wanted, {free} free of {slots}")
        self.wanted, self.free, self.slots = wanted, free, slots


class PageNotResident(TransferError):
    def __init__(self, pages: Iterable[PageHash], where: str = "the local arena") -> None:
        self.pages = tuple(pages)
        super().__init__(f"{len(self.pages)} page(s) not resident in {where}: {_hexes(self.pages)}")


class PageAlreadyPresent(TransferError):
    def __init__(self, page: PageHash) -> None:
        super().__init__(f"page {page:#018x} is already stored or reserved in the arena")
        self.page = page


class PagePinned(TransferError):
    def __init__(self, page: PageHash, pins: int) -> None:
        super().__init__(f"page {page:#018x} is being read ({pins} reader(s)); release it after they finish")
        self.page, self.pins = page, pins


class WrongSlotState(TransferError):
    """A reserved page was committed twice, or a stored page was treated as reserved."""


class ChecksumMismatch(TransferError):
    def __init__(self, page: PageHash, expected: int, actual: int, source: str) -> None:
        super().__init__(
            f"page {page:#018x} from {source}: checksum {actual:#018x} does not match the expected {expected:#018x}"
        )
        self.page, self.expected, self.actual, self.source = page, expected, actual, source


class PagesMissing(TransferError):
    """The peer does not hold (some of) the requested pages."""

    def __init__(self, peer: str, pages: Iterable[PageHash]) -> None:
        self.peer, self.pages = peer, tuple(pages)
        super().__init__(f"peer {peer} does not hold {len(self.pages)} requested page(s): {_hexes(self.pages)}")


class TransportUnavailable(TransferError):
    """This transport cannot run here, or the peer does not serve it."""


class TransferFailed(TransferError):
    """A transfer started but did not complete."""
