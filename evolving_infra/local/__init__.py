"""The local cluster driver: node agents and a router as processes on 127.0.0.1, and agent clients that replay
a workload through the router's HTTP API as real harnesses would (docs/local.md).

Layer: a driver, beside `evolving_infra.sim` and `evolving_infra.operator`; the CLI (`evolving-infra local`)
sits on top.
"""
