"""Decode binding, when a request's prefill starts: ours and two baselines.

- Ours (`FewestRequestsBinder`, algorithm E.3 line 13): among decode nodes with KV room for the request
  (free KV tokens >= prompt + output tokens), the one running the fewest requests; ties to the smallest
  node id. None (`NO_KV_ROOM`) when no node has room: the request waits for room.
- Round robin (the paper's SGLang baseline): the next node in node-id order after the last one bound.
- Power of two: two distinct nodes drawn from the seeded generator, the one running fewer requests
  wins (the first drawn on a tie).
The baselines do not look at KV room by default (the gateway does not; the decode engine queues the
transfer until it has room); `require_room=True` makes them skip nodes without room.
Every binder answers None (`NO_DECODE_NODE`) when there is no decode node.

Boundary: pure; state (round-robin cursor) changes only in `on_bound`; randomness from the generator
passed in.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from evolving_infra.core.types import NodeId
from evolving_infra.router.routing.base import BindReason, DecodeBinding, DecodePolicyName
from evolving_infra.router.routing.inputs import DecodeNodeView, RouteRequest, unique_nodes
from evolving_infra.router.routing.round_robin import next_in_cycle


def kv_tokens_needed(request: RouteRequest) -> int:
    """KV tokens the request occupies on its decode node by its last token."""
    return request.prompt_tokens + request.output_tokens


@dataclass(frozen=True, slots=True)
class BaselineBinderSettings:
    require_room: bool = False


class _Binder:
    policy: DecodePolicyName
    require_room: bool = True

    @property
    def name(self) -> DecodePolicyName:
        return self.policy

    def _candidates(
        self, request: RouteRequest, nodes: Sequence[DecodeNodeView]
    ) -> tuple[list[DecodeNodeView], DecodeBinding | None]:
        need = kv_tokens_needed(request)
        if not nodes:
            return [], DecodeBinding(None, self.policy, BindReason.NO_DECODE_NODE, need)
        unique_nodes(nodes, "decode")
        fits = [v for v in nodes if v.free_kv_tokens >= need] if self.require_room else list(nodes)
        if not fits:
            return [], DecodeBinding(None, self.policy, BindReason.NO_KV_ROOM, need, tuple(nodes))
        return fits, None

    def on_bound(self, request: RouteRequest, binding: DecodeBinding, now: float) -> None:
        return None


class FewestRequestsBinder(_Binder):
    policy = DecodePolicyName.FEWEST_REQUESTS

    def bind(self, request: RouteRequest, nodes: Sequence[DecodeNodeView], now: float) -> DecodeBinding:
        fits, refusal = self._candidates(request, nodes)
        if refusal is not None:
            return refusal
        best = min(fits, key=lambda v: (v.running_requests, v.node))
        return DecodeBinding(best.node, self.policy, BindReason.FEWEST_REQUESTS, kv_tokens_needed(request),
                             tuple(nodes))


class RoundRobinBinder(_Binder):
    policy = DecodePolicyName.ROUND_ROBIN

    def __init__(self, settings: BaselineBinderSettings | None = None) -> None:
        self.require_room = (settings or BaselineBinderSettings()).require_room
        self._last: NodeId | None = None

    def bind(self, request: RouteRequest, nodes: Sequence[DecodeNodeView], now: float) -> DecodeBinding:
        fits, refusal = self._candidates(request, nodes)
        if refusal is not None:
            return refusal
        node = next_in_cycle((v.node for v in fits), self._last)
        return DecodeBinding(node, self.policy, BindReason.ROUND_ROBIN, kv_tokens_needed(request), tuple(nodes))

    def on_bound(self, request: RouteRequest, binding: DecodeBinding, now: float) -> None:
        if binding.node is not None:
            self._last = binding.node


class PowerOfTwoBinder(_Binder):
    policy = DecodePolicyName.POWER_OF_TWO

    def __init__(self, rng: random.Random, settings: BaselineBinderSettings | None = None) -> None:
        self.require_room = (settings or BaselineBinderSettings()).require_room
        self.rng = rng

    def bind(self, request: RouteRequest, nodes: Sequence[DecodeNodeView], now: float) -> DecodeBinding:
        fits, refusal = self._candidates(request, nodes)
        if refusal is not None:
            return refusal
        ordered = sorted(fits, key=lambda v: v.node)
        if len(ordered) == 1:
            chosen = ordered[0]
        else:
            first, second = self.rng.sample(ordered, 2)
            chosen = first if first.running_requests <= second.running_requests else second
        return DecodeBinding(chosen.node, self.policy, BindReason.POWER_OF_TWO, kv_tokens_needed(request),
                             tuple(nodes))
