"""Emulated KV page content and page checksums.

The emulated engine computes no real KV, yet the data plane moves real bytes: a page's content is a
deterministic function of its hash (bytes from a PCG64 generator seeded with the hash), so any node can
produce or check a page it never saw. Every stored page carries an xxh3-64 checksum of its bytes;
transports compare it after each transfer.

Boundary: pure functions over page hashes and bytes.
"""

from __future__ import annotations

import numpy as np
import xxhash

from evolving_infra.core.pages import PageHash, chain_hashes

BytesLike = bytes | bytearray | memoryview | np.ndarray
"""Contiguous page bytes: anything with the buffer protocol."""


def page_checksum(data: BytesLike) -> int:
    """xxh3-64 of a page's bytes (any contiguous buffer)."""
    return xxhash.xxh3_64_intdigest(data)  # type: ignore[arg-type]  # numpy arrays export the buffer protocol


def emulated_page(page: PageHash, page_bytes: int) -> np.ndarray:
    """The emulated content of `page`: `page_bytes` bytes determined by the hash alone."""
    if page_bytes < 1:
        raise ValueError(f"page_bytes must be >= 1, got {page_bytes}")
    generator = np.random.Generator(np.random.PCG64(int(page)))
    return np.frombuffer(generator.bytes(page_bytes), dtype=np.uint8)


def emulated_checksum(page: PageHash, page_bytes: int) -> int:
    """Checksum of `emulated_page(page, page_bytes)`."""
    return page_checksum(emulated_page(page, page_bytes))


def demo_chain(count: int, seed: int = 0) -> tuple[PageHash, ...]:
    """`count` chained page hashes of a made-up prompt (benchmarks and tests name pages with it)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return tuple(chain_hashes(f"demo:{seed}:{i}".encode() for i in range(count)))
