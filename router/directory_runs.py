"""Runs of pages for the KV directory (`directory.KvDirectory`): the run record and the pure helpers over
position ranges within a run and per-holder last-use times (one time, or one per page).

Boundary: plain data and functions over lists, arrays and ranges; the directory's state and its invariants are
`directory`'s.
"""

from __future__ import annotations

from array import array

from evolving_infra.core.pages import PageHash

Times = dict[int, "float | array[float]"]
"""Last use per holder bit (3i + t, t = 0 GPU, 1 host): one time for every page, or one per page."""


class _Run:
    """Consecutive pages of one chain (each page's parent is the page before it; `parent` is the first page's)
    with one holder mask and the last use of its pages per holder bit."""

    __slots__ = ("pages", "parent", "mask", "times")

    def __init__(self, pages: list[PageHash], parent: PageHash | None, mask: int, times: Times) -> None:
        self.pages = pages
        self.parent = parent
        self.mask = mask
        self.times = times


Ranges = list[tuple[int, int]]
"""Sorted, disjoint [start, end) position ranges within a run."""


def _merge(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and out[-1][1] >= lo:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _flag_ranges(flags: bytes) -> Ranges:
    """The [start, end) ranges of the 1 bytes of `flags` (found by C-level searches)."""
    out: Ranges = []
    lo = flags.find(1)
    while lo >= 0:
        hi = flags.find(0, lo)
        if hi < 0:
            out.append((lo, len(flags)))
            break
        out.append((lo, hi))
        lo = flags.find(1, hi)
    return out


def _positions(rp: list[PageHash], chunk: list[PageHash]) -> Ranges:
    """The position ranges in run pages `rp` of the distinct pages `chunk` (all of them in `rp`, any order).

    Victims of an eviction come in eviction order, so a chunk is often a stretch of the run forwards or
    backwards (checked with slice comparisons); otherwise one C-level pass flags the run's pages."""
    n, size = len(chunk), len(rp)
    if n == size:
        return [(0, n)]
    if n == 1:
        o = rp.index(chunk[0])
        return [(o, o + 1)]
    first, last = chunk[0], chunk[-1]
    if rp[size - 1] == last and rp[size - n :] == chunk:
        return [(size - n, size)]
    if rp[size - 1] == first and rp[size - n :] == chunk[::-1]:
        return [(size - n, size)]
    if rp[0] == first and rp[:n] == chunk:
        return [(0, n)]
    if rp[0] == last and rp[:n] == chunk[::-1]:
        return [(0, n)]
    if n <= 4:
        return _ranges_of(sorted(map(rp.index, chunk)))
    return _flag_ranges(bytes(map(set(chunk).__contains__, rp)))


def _ranges_of(sorted_positions: list[int]) -> Ranges:
    out: Ranges = []
    for p in sorted_positions:
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return out


def _sliced(times: Times, lo: int, hi: int) -> Times:
    """The times of the pages at [lo, hi) (a one-page slice of an array becomes a number)."""
    out: Times = {}
    for b, v in times.items():
        if isinstance(v, array):
            out[b] = v[lo] if hi - lo == 1 else v[lo:hi]
        else:
            out[b] = v
    return out


def _as_array(v: float | array[float], n: int) -> array[float]:
    """`v` as one time per page of `n` pages."""
    return v if isinstance(v, array) else array("d", (v,)) * n


def _set_time(run: _Run, bit: int, lo: int, hi: int, time: float) -> None:
    """The pages of `run` at [lo, hi) were last used at `time` by holder `bit` (which holds them)."""
    times = run.times
    n = len(run.pages)
    if hi - lo == n:
        times[bit] = time
        return
    v = times[bit]
    if not isinstance(v, array):
        if v == time:
            return
        v = times[bit] = array("d", (v,)) * n
    v[lo:hi] = array("d", (time,)) * (hi - lo)


def _common(a: list[PageHash], i: int, b: list[PageHash], j: int, k: int) -> int:
    """The length of the common prefix of a[i:i+k] and b[j:j+k] (>= 1, < k: they differ and start equal).

    With chained hashes, equal pages at an offset mean equal pages before it, so a binary search on single
    pages finds it; the answer is then checked with one slice comparison, and found page by page otherwise."""
    lo, hi = 1, k  # a[i:i+lo] == b[j:j+lo]; the first difference is before hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[i + mid - 1] == b[j + mid - 1]:
            lo = mid
        else:
            hi = mid
    if a[i + lo] != b[j + lo] and a[i : i + lo] == b[j : j + lo]:
        return lo
    m = 0
    while m < k and a[i + m] == b[j + m]:
        m += 1
    return m
