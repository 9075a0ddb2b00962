"""KV movement that shares bandwidth: peer fetches and prefill-to-decode transfers as fluid flows.

Each node has three resources from its hardware profile: the two directions of its network interface
(`nic_bandwidth`, out and in) and its host-memory bandwidth available to KV movement
(`host_memory_bandwidth`, when the profile sets one). A flow crosses some of them:

- a peer fetch (host memory of the peer -> host memory of the node): the peer's NIC out and host memory,
  the node's NIC in and host memory; a single fetch moves at most `fetch_bandwidth` (the rate one fetch
  reaches on its own) and lands `fetch_latency` after its last byte;
- a KV transfer (prefill GPUs -> decode GPUs, GPUDirect): the prefill node's NIC out and the decode node's
  NIC in; at most `transfer_bandwidth`.

Loads from a node's host memory into its GPUs (restored prefixes, HiCache load-back) are not flows: they get
`host_share`, what the fetches through that host memory leave of it (never less than an equal share), at most
`load_bandwidth`; the driver tells the engine whenever that changes. Loads do not slow fetches in turn.

Concurrent flows share each resource max-min fairly (progressive filling): every flow gets the same rate
unless its own cap or another resource it crosses limits it, and what it leaves unused goes to the others.
Rates are recomputed whenever a flow starts or ends, so a flow alone takes exactly `profile.fetch_time` or
`profile.transfer_time`, and one sharing a link takes longer.

Invariant: between two changes every flow moves bytes at its rate; the sum of the rates of the flows
crossing a resource never exceeds its capacity; a flow ends exactly once (`Landed`).

Boundary: the arithmetic of rates and completion times, no kernel events; `sim.flow` schedules the next
completion and acts on what landed.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

import numpy as np

from evolving_infra.node_agent.profile import HardwareProfile

_EPS_BYTES = 1e-3  # a flow with less than this left has landed (float rounding of rate * time)
_EPS_S = 1e-9  # ... as has one that would need less than this many seconds more


class FlowKind(enum.Enum):
    FETCH = "fetch"
    TRANSFER = "transfer"


class Resource(str, enum.Enum):
    """A bandwidth of one node. A `str` enum so that the (node, resource) keys hash in C: `fair_rates` looks
    them up millions of times at partition scale, and a plain enum member's hash runs Python code."""

    NIC_OUT = "nic-out"
    NIC_IN = "nic-in"
    HOST_MEMORY = "host-memory"


@dataclass(eq=False)
class Flow:
    """One movement of KV bytes; `key` identifies it to the driver, `payload` is the driver's."""

    key: Hashable
    kind: FlowKind
    source: str
    target: str
    total_bytes: float
    remaining: float
    cap: float
    latency: float
    started: float
    resources: tuple[tuple[str, Resource], ...]
    payload: object = None
    rate: float = 0.0


@dataclass(frozen=True, slots=True)
class Landed:
    """A flow whose last byte arrived at `bytes_done`; it completes (for the driver) at `at`."""

    flow: Flow
    bytes_done: float
    at: float


@dataclass
class LinkModel:
    """The flows in flight over the cluster's links (see the module docstring)."""

    profile: HardwareProfile
    flows: dict[Hashable, Flow] = field(default_factory=dict)
    now: float = 0.0
    peak_concurrency: int = 0
    loading_nodes: set[str] = field(default_factory=set)
    """Nodes whose engines were last told a host-to-GPU load bandwidth below the profile's (the driver's)."""

    def __post_init__(self) -> None:
        p = self.profile
        self._nic = p.nic_bandwidth if p.nic_bandwidth is not None else max(p.fetch_bandwidth, p.transfer_bandwidth)
        self._host = p.host_memory_bandwidth
        # the flows through each node's host memory, in the order they started (that of `flows`): `host_share`
        # reads one node's without scanning every flow in flight
        self._host_users: dict[tuple[str, Resource], dict[Hashable, Flow]] = {}

    def _enlist(self, flow: Flow) -> None:
        for r in flow.resources:
            if r[1] is Resource.HOST_MEMORY:
                self._host_users.setdefault(r, {})[flow.key] = flow

    def _delist(self, flow: Flow) -> None:
        for r in flow.resources:
            if r[1] is Resource.HOST_MEMORY:
                users = self._host_users[r]
                del users[flow.key]
                if not users:
                    del self._host_users[r]

    def capacity(self, resource: Resource) -> float:
        if resource is Resource.HOST_MEMORY:
            return self._host if self._host is not None else math.inf
        return self._nic

    # --- changes -------------------------------------------------------------------------------------
    def start(self, key: Hashable, kind: FlowKind, source: str, target: str, nbytes: float, now: float,
              payload: object = None) -> Flow:
        """Start a flow of `nbytes` from `source` to `target` at `now` (rates of all flows are recomputed)."""
        if key in self.flows:
            raise ValueError(f"flow {key!r} is already in flight")
        if not nbytes >= 0:
            raise ValueError(f"flow {key!r}: bytes must be >= 0, got {nbytes}")
        self.advance(now)
        p = self.profile
        if kind is FlowKind.FETCH:
            res: list[tuple[str, Resource]] = [(source, Resource.NIC_OUT), (target, Resource.NIC_IN)]
            if self._host is not None:
                res += [(source, Resource.HOST_MEMORY), (target, Resource.HOST_MEMORY)]
            cap, latency = p.fetch_bandwidth, p.fetch_latency
        else:
            res, cap, latency = [(source, Resource.NIC_OUT), (target, Resource.NIC_IN)], p.transfer_bandwidth, 0.0
        flow = Flow(key, kind, source, target, float(nbytes), float(nbytes), cap, latency, now, tuple(res), payload)
        self.flows[key] = flow
        self._enlist(flow)
        self.peak_concurrency = max(self.peak_concurrency, len(self.flows))
        self._share()
        return flow

    def cancel(self, key: Hashable, now: float) -> Flow | None:
        """Drop a flow (its request went away); None if it is not in flight."""
        self.advance(now)
        flow = self.flows.pop(key, None)
        if flow is not None:
            self._delist(flow)
            self._share()
        return flow

    def advance(self, now: float) -> None:
        """Move every flow's bytes up to `now`."""
        dt = now - self.now
        if dt < 0:
            raise ValueError(f"link model: time went backwards ({now} < {self.now})")
        if dt > 0:
            for flow in self.flows.values():
                flow.remaining = max(0.0, flow.remaining - flow.rate * dt)
            self.now = now

    def next_landing(self) -> float | None:
        """When the next flow's last byte arrives at the current rates (None without flows)."""
        best: float | None = None
        for flow in self.flows.values():
            if _arrived(flow):
                t = self.now
            elif flow.rate > 0:
                t = self.now + flow.remaining / flow.rate
            else:
                continue
            best = t if best is None or t < best else best
        return best

    def land(self, now: float) -> list[Landed]:
        """Advance to `now` and remove every flow whose bytes have all arrived (rates are then recomputed)."""
        self.advance(now)
        done = [f for f in self.flows.values() if _arrived(f)]
        for flow in done:
            del self.flows[flow.key]
            self._delist(flow)
        if done:
            self._share()
        return [Landed(f, f.total_bytes, now + f.latency) for f in done]

    def expected_end(self, key: Hashable) -> float | None:
        """When the flow would complete at the current rates (its latency included)."""
        flow = self.flows.get(key)
        if flow is None or flow.rate <= 0:
            return None
        return self.now + flow.remaining / flow.rate + flow.latency

    def host_share(self, node: str, cap: float) -> float:
        """The rate a new flow capped at `cap` would get through `node`'s host memory alone: what the flows in
        flight leave of it, and never less than an equal share with them (a load from host memory to GPUs)."""
        host = self.capacity(Resource.HOST_MEMORY)
        if host == math.inf:
            return cap
        through = self._host_users.get((node, Resource.HOST_MEMORY))
        users = [f for f in through.values() if not _arrived(f)] if through else []
        if not users:
            return cap  # alone, a load runs at the profile's load bandwidth
        left = host - sum(f.rate for f in users)
        return min(cap, max(left, host / (len(users) + 1)))

    # --- fair shares ---------------------------------------------------------------------------------
    def _share(self) -> None:
        """Max-min fair rates by progressive filling over the resources and each flow's own cap."""
        rates = fair_rates(
            [(f.key, f.cap, f.resources) for f in self.flows.values() if f.remaining > _EPS_BYTES],
            self.capacity,
        )
        for flow in self.flows.values():
            flow.rate = rates.get(flow.key, math.inf if flow.remaining <= _EPS_BYTES else 0.0)
            if flow.rate == math.inf:
                flow.rate = flow.cap


def _arrived(flow: Flow) -> bool:
    return flow.remaining <= _EPS_BYTES or flow.remaining <= flow.rate * _EPS_S


ARRAYS_FROM = 24
"""From this many flows `fair_rates` fills with numpy arrays (per round a few array operations instead of a Python
step per flow and resource: at partition scale hundreds of flows are in flight and the rates are recomputed at
every start and landing). The arithmetic is the same operation for operation, so the rates are equal bit for bit
either way (`tests/sim/test_sim_links.py`)."""


def fair_rates(
    flows: Iterable[tuple[Hashable, float, tuple[tuple[str, Resource], ...]]],
    capacity: Callable[[Resource], float],
) -> dict[Hashable, float]:
    """Max-min fair rates: raise all unfrozen flows' rates together until a resource is full (its flows freeze)
    or a flow reaches its cap (it freezes); repeat. `capacity(resource)` gives each resource's bandwidth."""
    cap_of = capacity
    pending = {key: (cap, res) for key, cap, res in flows}
    if len(pending) >= ARRAYS_FROM:
        return _fair_rates_arrays(pending, cap_of)
    rates: dict[Hashable, float] = {}
    left: dict[tuple[str, Resource], float] = {}
    users: dict[tuple[str, Resource], set[Hashable]] = {}
    for key, (_, res) in pending.items():
        for r in res:
            left.setdefault(r, cap_of(r[1]))
            users.setdefault(r, set()).add(key)
    level = 0.0
    while pending:
        step = min(cap - level for cap, _ in pending.values())
        for r, keys in users.items():
            step = min(step, left[r] / len(keys))
        step = max(0.0, step)
        level += step
        for r, keys in users.items():
            left[r] -= step * len(keys)
        frozen = {key for key, (cap, _) in pending.items() if cap - level <= 1e-9 * max(1.0, cap)}
        for r, keys in users.items():
            if left[r] <= 1e-9 * max(1.0, cap_of(r[1])):
                frozen |= keys
        if not frozen:  # numerical safety: freeze the tightest flow
            frozen = {min(pending, key=lambda k: pending[k][0])}
        emptied: list[tuple[str, Resource]] = []
        for key in frozen:
            rates[key] = level
            for r in pending[key][1]:
                keys = users[r]
                keys.discard(key)
                if not keys:
                    emptied.append(r)
            del pending[key]
        for r in emptied:  # a resource without unfrozen flows no longer limits anything: leave it out
            users.pop(r, None)
    return rates


def _fair_rates_arrays(
    pending: dict[Hashable, tuple[float, tuple[tuple[str, Resource], ...]]], cap_of: Callable[[Resource], float]
) -> dict[Hashable, float]:
    """`fair_rates`' filling over arrays: the same rounds, and in each the same float operations on each flow and
    resource (a resource whose flows all froze takes part in none: its count of unfrozen flows is 0)."""
    keys = list(pending)
    index: dict[tuple[str, Resource], int] = {}
    inc_f: list[int] = []  # (flow, resource) incidences
    inc_r: list[int] = []
    for f, (_, res) in enumerate(pending.values()):
        for r in res:
            j = index.setdefault(r, len(index))
            inc_f.append(f)
            inc_r.append(j)
    flow_of = np.array(inc_f, dtype=np.intp)
    res_of = np.array(inc_r, dtype=np.intp)
    n_res = len(index)
    left = np.array([cap_of(r[1]) for r in index], dtype=np.float64)
    res_tol = 1e-9 * np.maximum(1.0, left)
    users = np.bincount(res_of, minlength=n_res).astype(np.float64)  # unfrozen flows per resource
    caps = np.array([cap for cap, _ in pending.values()], dtype=np.float64)
    cap_tol = 1e-9 * np.maximum(1.0, caps)
    alive = np.ones(len(keys), dtype=np.bool_)
    rates = np.empty(len(keys), dtype=np.float64)
    level = 0.0
    while alive.any():
        step = float((caps[alive] - level).min())
        used = users > 0
        if used.any():
            step = min(step, float((left[used] / users[used]).min()))
        step = max(0.0, step)
        level += step
        left -= step * users  # (0 for a resource without unfrozen flows: it keeps its value, as when skipped)
        frozen = alive & (caps - level <= cap_tol)
        full = used & (left <= res_tol)
        if full.any():
            crossing = np.zeros(len(keys), dtype=np.bool_)
            crossing[flow_of[full[res_of]]] = True
            frozen |= alive & crossing
        if not frozen.any():  # numerical safety: freeze the tightest flow (the first of the least cap)
            frozen[int(np.argmin(np.where(alive, caps, np.inf)))] = True
        rates[frozen] = level
        alive &= ~frozen
        users -= np.bincount(res_of[frozen[flow_of]], minlength=n_res)
    return dict(zip(keys, rates.tolist()))
