"""Run the front end alone against `FakeBackend`, for trying the API with curl or an OpenAI SDK:

    EVOLVING_ROUTER_PORT=8000 python -P -m evolving_infra.router.http

Settings come from `EVOLVING_ROUTER_*` variables. Stops gracefully on SIGINT/SIGTERM.
Boundary: a demo entry point; the live router wires its real backend instead.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from evolving_infra.router.http.fake import FakeBackend
from evolving_infra.router.http.server import start_server
from evolving_infra.router.http.settings import RouterHttpSettings


async def _main() -> None:
    settings = RouterHttpSettings()
    backend = FakeBackend(
        model_ids=(settings.model_name,), first_token_delay_s=0.05, inter_token_delay_s=0.02
    )
    server = await start_server(settings, backend)
    logging.getLogger(__name__).info("serving the fake backend on %s", server.url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_main())
