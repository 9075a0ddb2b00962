"""How long huge prompts stall the router's HTTP event loop: the longest gap between /healthz answers (polled every
10 ms) while N 10 MB chat bodies are answered by the front end with FakeBackend, parsed and tokenized on the event
loop (offload_bytes 1 GiB) and in worker processes (the default). Usage: python -P scripts/bench_big_prompt.py N
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp

from evolving_infra.router.http import FakeBackend, RouterHttpSettings, start_server

async def main(offload: int) -> None:
    NBL = int(sys.argv[1])
    server = await start_server(RouterHttpSettings(port=0, offload_bytes=offload, max_prompt_tokens=1 << 24, max_body_bytes=64 << 20), FakeBackend())
    lat = []
    async with aiohttp.ClientSession() as s:
        stop = False
        async def poll():
            while not stop:
                async with s.get(server.url + "/healthz") as r:
                    await r.read()
                lat.append(time.perf_counter())
                await asyncio.sleep(0.01)
        p = asyncio.ensure_future(poll())
        await asyncio.sleep(0.3)
        body = {"messages": [{"role": "user", "content": "word " * 2_000_000}], "max_tokens": 1}
        data = json.dumps(body).encode()
        t = time.perf_counter()
        big = [s.post(server.url + "/v1/chat/completions", data=data, headers={"content-type": "application/json"}) for _ in range(NBL)]
        resps = await asyncio.gather(*big)
        statuses = [r.status for r in resps]
        took = time.perf_counter() - t
        stop = True
        await p
    await server.stop()
    gaps = sorted(b - a for a, b in zip(lat, lat[1:]))
    print(json.dumps({"offload_bytes": offload, "body_mb": round(len(data) / 1e6, 1), "bodies": NBL, "statuses": statuses,
                      "wall_s": round(took, 2), "healthz_answers": len(lat), "longest_gap_ms": round(gaps[-1] * 1000, 1),
                      "p50_gap_ms": round(gaps[len(gaps) // 2] * 1000, 1)}))

if __name__ == "__main__":
    for off in (1 << 30, 64 * 1024):
        asyncio.run(main(off))
