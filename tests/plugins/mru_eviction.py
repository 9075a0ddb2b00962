"""A host eviction order declared outside the package, as a user's or a test's plugin: the most recently used
unpinned page goes first (counts ignored). Loaded by name or path through the `plugins` setting of the
simulator, the router and the node agents; nothing else in the project names it.

Boundary: one policy declaration.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evolving_infra.core.eviction import EVICTION, HostPage, _KeyedPolicy
from evolving_infra.core.plugins import PolicyKind, PolicySpec

NAME = "test-mru"


@dataclass(frozen=True)
class MruSettings:
    """No settings."""


class MruEviction(_KeyedPolicy):
    name = NAME

    def key(self, page: HostPage) -> tuple[float, ...]:
        return (-page.last_access,)


def _build(settings: MruSettings, rng: random.Random) -> MruEviction:
    return MruEviction()


SPEC = PolicySpec(PolicyKind.EVICTION, NAME, "test: most recently used first", MruSettings, _build, frozenset(), __name__)
if NAME not in EVICTION:
    EVICTION.register(SPEC)
