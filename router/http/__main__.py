"""Run the front end alone against `FakeBackend`, for trying the API with curl or an OpenAI SDK:

    python -P -m evolving_infra.router.http --port 8000

Flags set the host, port and model name; every other setting keeps its default (the live router's settings,
`RouterSettings`, are the ones read from the environment and files). Stops gracefully on SIGINT/SIGTERM.
Boundary: a demo entry point; the live router wires its real backend instead.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from evolving_infra.router.http.fake import FakeBackend
from evolving_infra.router.http.server import start_server
from evolving_infra.router.http.settings import RouterHttpSettings


async def _main(settings: RouterHttpSettings) -> None:
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
    parser = argparse.ArgumentParser(prog="python -m evolving_infra.router.http", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    parser.add_argument("--model", default="evolving-emulated", help="the model name served")
    args = parser.parse_args()
    asyncio.run(_main(RouterHttpSettings(host=args.host, port=args.port, model_name=args.model)))
