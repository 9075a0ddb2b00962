"""The gateway's binding table: the fleet `Binder` plus when each user and branch was last seen.

- `route(identity, now, down)`: the partition for a request (an active branch keeps its partition, a new
  user avoids partitions that are down); the user and the branch are marked seen and the branch in use.
- `done(identity, now)`: the request ended; a branch marked finished (or ephemeral) loses its pin once no
  other request of it is in flight.
- `finish(branch)`: the explicit branch-finished call.
- `sweep(now)`: unbinds users unseen for `user_idle_s`, unpins branches idle for `branch_idle_s` with no
  request in flight (a branch in flight is never unpinned, so it cannot change partition mid-use).
- `reconcile(partitions)`: brings the binder's partitions in line with the current set (removed, changed
  labels/weight updated in place, added); returns the moves.

Boundary: pure (the clock is a parameter); the server calls it on its event loop.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from evolving_infra.fleet.binding import Binder, Binding, Move, Partition
from evolving_infra.gateway.identity import Identity, UserSource


@dataclass
class _Seen:
    last: float
    inflight: int = 0
    finish_when_idle: bool = False


class BindingTable:
    def __init__(self, partitions: Sequence[Partition], *, load_factor: float, user_idle_s: float, branch_idle_s: float) -> None:
        self.binder = Binder(partitions, load_factor=load_factor)
        self.user_idle_s = user_idle_s
        self.branch_idle_s = branch_idle_s
        self._users: dict[str, float] = {}
        self._branches: dict[str, _Seen] = {}

    def route(self, identity: Identity, now: float, down: Collection[str] = ()) -> Binding:
        binding = self.binder.bind(
            identity.user_key,
            identity.requirements,
            branch_id=identity.branch,
            parent_branch_id=identity.parent,
            avoid=down,
        )
        if identity.source is UserSource.REQUEST:
            self.binder.release(identity.user_key)  # an ephemeral user holds no binding
        else:
            self._users[identity.user_key] = now
        if identity.branch is not None:
            seen = self._branches.setdefault(identity.branch, _Seen(now))
            seen.last = now
            seen.inflight += 1
            seen.finish_when_idle |= identity.finish_after
        return binding

    def done(self, identity: Identity, now: float) -> None:
        if identity.branch is None:
            return
        seen = self._branches.get(identity.branch)
        if seen is None:
            return
        seen.last = now
        seen.inflight = max(0, seen.inflight - 1)
        if seen.finish_when_idle and seen.inflight == 0:
            self.finish(identity.branch)

    def finish(self, branch: str) -> str | None:
        self._branches.pop(branch, None)
        return self.binder.finish_branch(branch)

    def sweep(self, now: float) -> tuple[int, int]:
        """Unbind idle users and unpin idle branches; returns how many of each."""
        users = [u for u, last in self._users.items() if now - last >= self.user_idle_s]
        for user in users:
            del self._users[user]
            self.binder.release(user)
        branches = [b for b, s in self._branches.items() if s.inflight == 0 and now - s.last >= self.branch_idle_s]
        for branch in branches:
            self.finish(branch)
        return len(users), len(branches)

    def reconcile(self, partitions: Sequence[Partition]) -> list[Move]:
        wanted = {p.name: p for p in partitions}
        current = {p.name: p for p in self.binder.partitions}
        moves: list[Move] = []
        for name in sorted(set(current) - set(wanted)):
            moves += self.binder.remove_partition(name)
        for name, p in sorted(wanted.items()):
            if name in current and current[name] != p:
                moves += self.binder.update_partition(p)
        for name, p in sorted(wanted.items()):
            if name not in current:
                moves += self.binder.add_partition(p)
        for move in moves:
            if move.branch_id is not None:
                self._branches.pop(move.branch_id, None)
            if move.user_key is not None and move.target is None:
                self._users.pop(move.user_key, None)
        return moves
