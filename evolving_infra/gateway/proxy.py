"""Forwarding one request to a partition router, and its answer (JSON or a stream) back, unchanged.

The request goes out with its method, path, query, body bytes and headers, less the hop-by-hop ones,
plus `x-evolving-partition: <namespace/name>` (what a Gateway API HTTPRoute can match on) and the
request id the gateway resolved (`X-Request-Id`, so the router echoes the same one). The answer comes
back with its status, headers (less hop-by-hop) and body bytes as they arrive (`iter_any`: each
server-sent event is written on as soon as it is read), plus `x-evolving-partition`.

A failure to connect, or a connection lost before the answer's head (twice: a kept-alive connection the
router closed is retried once on a fresh one), is `PartitionDown` (nothing was sent to the client yet, so
the server answers 503). A failure after the head was sent can only end the
stream: the connection is closed.

Boundary: HTTP plumbing; which partition is the caller's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

PARTITION_HEADER = "x-evolving-partition"
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
        "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
    }
)  # fmt: skip


class PartitionDown(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class UpstreamTimeout(Exception):
    """The partition router sent no answer head within the deadline."""


def _outgoing(headers: CIMultiDictProxy[str], partition: str, request_id: str) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        if key.lower() not in HOP_BY_HOP and key.lower() != PARTITION_HEADER:
            out.add(key, value)
    out[PARTITION_HEADER] = partition
    out["X-Request-Id"] = request_id
    return out


async def forward(
    session: aiohttp.ClientSession,
    request: web.Request,
    body: bytes,
    *,
    base_url: str,
    partition: str,
    request_id: str,
    connect_timeout_s: float,
    total_timeout_s: float,
    on_head: Callable[[int], None] = lambda status: None,
) -> web.StreamResponse:
    """Send `request` (with `body`) to `base_url` and stream the answer back to the client."""
    timeout = aiohttp.ClientTimeout(total=total_timeout_s, sock_connect=connect_timeout_s)
    headers = _outgoing(request.headers, partition, request_id)
    for attempt in range(2):
        try:
            upstream = await session.request(
                request.method,
                base_url + request.rel_url.path_qs,
                data=body if body else None,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                auto_decompress=False,
            )
            break
        except aiohttp.ClientConnectorError as exc:  # nothing listens: the partition is down
            raise PartitionDown(f"{type(exc).__name__}: {exc}") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            # A kept-alive connection the router closed (e.g. it restarted): once more on a fresh one.
            # Safe before the answer's head: the router answers nothing twice and inference has no side effects.
            if attempt == 1:
                raise PartitionDown(f"{type(exc).__name__}: {exc}") from None
        except asyncio.TimeoutError:
            raise UpstreamTimeout() from None
    try:
        on_head(upstream.status)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in HOP_BY_HOP:
                response.headers.add(key, value)
        response.headers[PARTITION_HEADER] = partition
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        upstream.release()
