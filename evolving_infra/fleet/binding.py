"""Binding users to partitions of a fleet: constraints first, then weighted consistent hashing with bounded load.

Boundary: pure decisions. No I/O, no clock, no global random state; the hash is a fixed function of its
input bytes (blake2b), so two processes (a gateway before and after a restart, the simulator) given the same
partitions and the same calls reach the same bindings. The gateway and the fleet simulator both bind with
this module.

API (kept small and stable; the fleet simulator imports it):

- `Partition(name, labels, weight)`: one partition (an AgentServingCluster); `weight` is its capacity
  (e.g. its GPUs), > 0.
- `Requirements(labels)`: label -> allowed values; a partition is eligible when, for every required label,
  its own value is one of the allowed values. `Requirements.parse("region=eu-west,hardware=gb300|h200")`
  reads the header/key form; `Requirements()` admits every partition.
- `Binder(partitions, load_factor=1.25)`:
  - `bind(user_key, requirements=Requirements(), branch_id=None, parent_branch_id=None, avoid=()) -> Binding`;
  - `finish_branch(branch_id)`, `release(user_key)`;
  - `add_partition(partition) -> list[Move]`, `remove_partition(name) -> list[Move]`,
    `update_partition(partition) -> list[Move]` (new labels or weight, same name);
  - `partition_of(user_key)`, `branch_partition(branch_id)`, `loads()`, `partitions`.
- Errors: `NoEligiblePartition` (no partition satisfies the requirements: permanent for that request),
  `BindingError` (bad partition set or argument).

How a request is bound (in this order):

1. An active branch (`branch_id` seen before and not finished) keeps its partition.
2. A new branch whose parent branch is active joins the parent's partition (a sub-agent reads its parent's
   KV, which lives in that partition's pool).
3. A user already bound keeps its partition, as long as that partition still meets the requirements.
4. Otherwise the user is hashed: eligible partitions (those meeting the requirements) are ranked by
   weighted rendezvous hashing (score `-weight / ln(u)`, `u` uniform in (0, 1) from
   `blake2b(user_key, partition_name)`), and the user goes to the first one in that order whose load is
   below its cap. A new branch is then pinned to the user's partition. Partitions in `avoid` (the
   gateway passes those that are down) are left out of the eligible set when a user is hashed, unless
   that leaves none; they never move a user already bound or an active branch.

Load is the number of bound users. The cap of a partition `p` in the eligible set `E`, when a user is bound,
is `ceil(c * (n_E + 1) * w_p / W_E)`, with `c = load_factor > 1`, `n_E` the users bound to partitions of `E`
and `W_E` their total weight. Some partition of `E` is always below its cap (the caps sum to more than
`n_E`), so binding never fails for load.

Invariants (property-tested in tests/fleet/test_binding.py):

I1 Stable: the same partitions and the same sequence of calls give the same bindings, in any process.
   A user's first choice depends only on its key and the eligible partitions; only users that overflowed
   a full partition depend on the order of arrivals.
I2 Constraints: every binding (user or branch) is to a partition meeting the requirements it was bound with.
I3 Bounded load: when a user is bound, its partition's load, the user included, is at most the cap above.
   With no releases and no membership change, each partition's load therefore stays within
   `ceil(c * n * w_p / W)` for users without requirements (n users in all).
I4 Minimal movement: adding a partition moves users only onto the new partition (those that rank it above
   their current partition, while it is below its cap); removing one moves only its own users.
I5 An active branch never changes partition: only `finish_branch` or the removal of its partition ends its
   pin (a removed partition's branches are lost and reported as moves with `branch_id` set); a partition
   whose labels or weight change (`update_partition`) keeps its pins.

Left open, and chosen here: a user already bound whose partition is down is told to retry, not moved, so
its KV stays useful when the partition returns (only new users avoid a down partition); the gateway
decides when users and branches are idle and calls `release` / `finish_branch`.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

DEFAULT_LOAD_FACTOR = 1.25
_LABEL_SEP = ","
_VALUE_SEP = "|"


class BindingError(ValueError):
    """A bad partition set or argument (a caller's mistake; permanent)."""


class NoEligiblePartition(BindingError):
    """No partition meets the requirements of a request (permanent for that request)."""

    def __init__(self, requirements: Requirements) -> None:
        super().__init__(f"no partition meets the requirements {requirements.render() or '(none)'}")
        self.requirements = requirements


@dataclass(frozen=True)
class Partition:
    """One partition of the fleet: a name, its labels (e.g. region, hardware) and its capacity weight."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise BindingError("a partition needs a non-empty name")
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight > 0):
            raise BindingError(f"partition {self.name!r}: weight must be a finite number > 0, got {self.weight!r}")
        object.__setattr__(self, "labels", dict(self.labels))

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.labels.items())), self.weight))


@dataclass(frozen=True)
class Requirements:
    """Required labels: each maps to the set of values a partition's label may take."""

    labels: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clean: dict[str, frozenset[str]] = {}
        for key, values in self.labels.items():
            allowed = frozenset(values)
            if not key or not allowed:
                raise BindingError(f"requirement {key!r} needs a label name and at least one value")
            clean[key] = allowed
        object.__setattr__(self, "labels", clean)

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, tuple(sorted(v))) for k, v in self.labels.items())))

    def admits(self, partition: Partition) -> bool:
        return all(partition.labels.get(key) in allowed for key, allowed in self.labels.items())

    def merged(self, other: Requirements) -> Requirements:
        """Both sets of requirements at once (values intersect where both name a label)."""
        out = {k: set(v) for k, v in self.labels.items()}
        for key, values in other.labels.items():
            out[key] = out[key] & set(values) if key in out else set(values)
            if not out[key]:
                raise BindingError(f"requirement {key!r}: no value satisfies both sets of requirements")
        return Requirements({k: frozenset(v) for k, v in out.items()})

    def render(self) -> str:
        return _LABEL_SEP.join(
            f"{key}={_VALUE_SEP.join(sorted(values))}" for key, values in sorted(self.labels.items())
        )

    @classmethod
    def parse(cls, text: str) -> Requirements:
        """Read `key=value[|value...][,key=value...]`; an empty string requires nothing."""
        labels: dict[str, frozenset[str]] = {}
        for item in (part.strip() for part in text.split(_LABEL_SEP)):
            if not item:
                continue
            key, sep, values = item.partition("=")
            allowed = frozenset(v.strip() for v in values.split(_VALUE_SEP) if v.strip())
            if not sep or not key.strip() or not allowed:
                raise BindingError(f"requirement {item!r}: expected key=value or key=value1|value2")
            if key.strip() in labels:
                raise BindingError(f"requirement {key.strip()!r} given twice")
            labels[key.strip()] = allowed
        return cls(labels)


class BindReason(Enum):
    """Why a request went where it went (the gateway exports it as a metric label)."""

    ACTIVE_BRANCH = "active_branch"
    PARENT_BRANCH = "parent_branch"
    BOUND_USER = "bound_user"
    FIRST_CHOICE = "first_choice"
    OVERFLOW = "overflow"


@dataclass(frozen=True)
class Binding:
    partition: str
    reason: BindReason


@dataclass(frozen=True)
class Move:
    """A user (or, with `branch_id`, a lost branch pin) leaving `source` for `target` (None: nowhere left)."""

    user_key: str | None
    source: str
    target: str | None
    branch_id: str | None = None


def rendezvous_score(user_key: str, partition: Partition) -> float:
    """Weighted rendezvous score: the highest wins; P(p wins) = w_p / sum(w) over the candidates."""
    digest = hashlib.blake2b(
        struct.pack("<I", len(user_key.encode())) + user_key.encode() + partition.name.encode(), digest_size=8
    ).digest()
    u = (int.from_bytes(digest, "little") + 0.5) / 2.0**64  # strictly inside (0, 1)
    return -partition.weight / math.log(u)


@dataclass(frozen=True)
class _UserState:
    partition: str
    requirements: Requirements


class Binder:
    """The binding table of one fleet (see the module docstring for the rules and invariants)."""

    def __init__(self, partitions: Iterable[Partition], *, load_factor: float = DEFAULT_LOAD_FACTOR) -> None:
        if not (math.isfinite(load_factor) and load_factor > 1.0):
            raise BindingError(f"load_factor must be > 1, got {load_factor!r}")
        self._c = load_factor
        self._partitions: dict[str, Partition] = {}
        for p in partitions:
            if p.name in self._partitions:
                raise BindingError(f"partition {p.name!r} given twice")
            self._partitions[p.name] = p
        self._users: dict[str, _UserState] = {}
        self._load: dict[str, int] = {name: 0 for name in self._partitions}
        self._branches: dict[str, str] = {}

    # -- reading ---------------------------------------------------------------------------------------------
    @property
    def load_factor(self) -> float:
        return self._c

    @property
    def partitions(self) -> tuple[Partition, ...]:
        return tuple(self._partitions.values())

    def loads(self) -> dict[str, int]:
        """Bound users per partition."""
        return dict(self._load)

    def partition_of(self, user_key: str) -> str | None:
        state = self._users.get(user_key)
        return state.partition if state else None

    def branch_partition(self, branch_id: str) -> str | None:
        return self._branches.get(branch_id)

    def active_branches(self) -> dict[str, str]:
        return dict(self._branches)

    def ranking(self, user_key: str, requirements: Requirements = Requirements()) -> list[str]:
        """Eligible partitions in the user's preference order (first choice first)."""
        eligible = [p for p in self._partitions.values() if requirements.admits(p)]
        eligible.sort(key=lambda p: (-rendezvous_score(user_key, p), p.name))
        return [p.name for p in eligible]

    def cap(self, partition: str, requirements: Requirements = Requirements(), avoid: Collection[str] = ()) -> int:
        """Most users `partition` may hold, the next one included, for a user with `requirements`
        (and `avoid`, as `bind` takes it)."""
        eligible = [p for p in self._partitions.values() if requirements.admits(p)]
        eligible = [p for p in eligible if p.name not in avoid] or eligible
        bound = sum(self._load[p.name] for p in eligible)
        total = sum(p.weight for p in eligible)
        return math.ceil(self._c * (bound + 1) * self._partitions[partition].weight / total)

    # -- binding ---------------------------------------------------------------------------------------------
    def bind(
        self,
        user_key: str,
        requirements: Requirements = Requirements(),
        *,
        branch_id: str | None = None,
        parent_branch_id: str | None = None,
        avoid: Collection[str] = (),
    ) -> Binding:
        """The partition for a request of `user_key` (and its branch), binding and pinning as needed."""
        if not user_key:
            raise BindingError("user_key must be non-empty")
        if branch_id is not None and branch_id in self._branches:
            return Binding(self._branches[branch_id], BindReason.ACTIVE_BRANCH)
        if branch_id is not None and parent_branch_id is not None and parent_branch_id in self._branches:
            parent = self._branches[parent_branch_id]
            if requirements.admits(self._partitions[parent]):
                self._branches[branch_id] = parent
                return Binding(parent, BindReason.PARENT_BRANCH)
        binding = self._bind_user(user_key, requirements, avoid)
        if branch_id is not None:
            self._branches[branch_id] = binding.partition
        return binding

    def _bind_user(self, user_key: str, requirements: Requirements, avoid: Collection[str] = ()) -> Binding:
        state = self._users.get(user_key)
        if state is not None:
            if requirements.admits(self._partitions[state.partition]):
                return Binding(state.partition, BindReason.BOUND_USER)
            self.release(user_key)
        order = self.ranking(user_key, requirements)
        if not order:
            raise NoEligiblePartition(requirements)
        candidates = [name for name in order if name not in avoid] or order
        bound = sum(self._load[name] for name in candidates)
        total = sum(self._partitions[name].weight for name in candidates)
        for name in candidates:
            if self._load[name] < math.ceil(self._c * (bound + 1) * self._partitions[name].weight / total):
                self._users[user_key] = _UserState(name, requirements)
                self._load[name] += 1
                return Binding(name, BindReason.FIRST_CHOICE if name == order[0] else BindReason.OVERFLOW)
        raise AssertionError("the caps of the eligible partitions sum to more than their load")

    def release(self, user_key: str) -> None:
        """Forget a user's binding (idle); its active branches keep their pins."""
        state = self._users.pop(user_key, None)
        if state is not None:
            self._load[state.partition] -= 1

    def finish_branch(self, branch_id: str) -> str | None:
        """End a branch's pin; returns the partition it was pinned to, if any."""
        return self._branches.pop(branch_id, None)

    # -- membership ------------------------------------------------------------------------------------------
    def add_partition(self, partition: Partition) -> list[Move]:
        """Add a partition; users that rank it above their current one move to it while it is below its cap.

        Users are considered in the order of their keys (so the result does not depend on arrival order).
        """
        if partition.name in self._partitions:
            raise BindingError(f"partition {partition.name!r} already exists")
        self._partitions[partition.name] = partition
        self._load[partition.name] = 0
        moves: list[Move] = []
        for user_key in sorted(self._users):
            state = self._users[user_key]
            if not state.requirements.admits(partition):
                continue
            current = self._partitions[state.partition]
            if rendezvous_score(user_key, partition) <= rendezvous_score(user_key, current):
                continue
            # The user counts among the bound users already; the cap is for it plus the others.
            self._load[state.partition] -= 1
            if self._load[partition.name] < self.cap(partition.name, state.requirements):
                self._users[user_key] = _UserState(partition.name, state.requirements)
                self._load[partition.name] += 1
                moves.append(Move(user_key, state.partition, partition.name))
            else:
                self._load[state.partition] += 1
        return moves

    def update_partition(self, partition: Partition) -> list[Move]:
        """Change a partition's labels or weight in place. Its branch pins stay, and so do its users that
        still meet their requirements; the others are bound again (in key order)."""
        if partition.name not in self._partitions:
            raise BindingError(f"no partition named {partition.name!r}")
        self._partitions[partition.name] = partition
        moves: list[Move] = []
        for user_key in sorted(k for k, s in self._users.items() if s.partition == partition.name):
            state = self._users[user_key]
            if state.requirements.admits(partition):
                continue
            self.release(user_key)
            try:
                target: str | None = self._bind_user(user_key, state.requirements).partition
            except NoEligiblePartition:
                target = None
            moves.append(Move(user_key, partition.name, target))
        return moves

    def remove_partition(self, name: str) -> list[Move]:
        """Remove a partition: its users are bound again among the rest (in key order), its branch pins end.

        A user whose requirements no other partition meets is released (a move with `target=None`).
        """
        if name not in self._partitions:
            raise BindingError(f"no partition named {name!r}")
        moves: list[Move] = []
        for branch_id in sorted(b for b, p in self._branches.items() if p == name):
            del self._branches[branch_id]
            moves.append(Move(None, name, None, branch_id=branch_id))
        orphans = sorted((k, s) for k, s in self._users.items() if s.partition == name)
        for user_key, _ in orphans:
            del self._users[user_key]
        del self._partitions[name]
        del self._load[name]
        for user_key, state in orphans:
            try:
                target: str | None = self._bind_user(user_key, state.requirements).partition
            except NoEligiblePartition:
                target = None
            moves.append(Move(user_key, name, target))
        return moves
