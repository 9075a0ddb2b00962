"""The fleet's global router ("gateway"): one OpenAI-compatible front door over several partitions.

It binds each user to one partition (`evolving_infra.fleet.binding`) and forwards requests and streams,
unchanged, to that partition's router; it serves the fleet status at `/fleet`. docs/gateway.md.

Boundary: `settings` (typed settings), `identity` (who a request is, pure), `table` (bindings with idle
expiry, pure), `errors`, `metrics`, `health` (partition probes), `proxy` (forwarding), `server` (the
aiohttp application and its background loops).
"""
