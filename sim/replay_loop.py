"""The replayer on the event kernel against an ideal server: each request completes a given service time
after it is issued, with no queueing or capacity limit.

It is the smallest complete wiring of `AgentReplayer` into `Kernel` (the pattern the cluster simulator
follows: replayer effects become kernel events, one cancellable wake-up event tracks `next_wakeup()`), and
it gives a trace's shape in time: how long agents run when serving costs only the service time.

Boundary: driving only; service times come from the caller (a function of the request, possibly drawing
from a seeded generator the caller owns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from evolving_infra.sim.kernel import Cancel, Command, Event, Kernel, Priority, RunResult
from evolving_infra.sim.replay import AgentReplayer, Effect, IssueRequest, RequestSpec

_WAKE = "replayer-wake"


@dataclass
class ReplayLog:
    """Everything the replayer emitted, in order, and when each request completed."""

    effects: list[Effect] = field(default_factory=list)
    completed: dict[str, float] = field(default_factory=dict)
    result: RunResult | None = None


def run_replay(
    replayer: AgentReplayer,
    service_s: Callable[[RequestSpec], float],
    *,
    kernel: Kernel | None = None,
    until: float | None = None,
) -> ReplayLog:
    """Replay until every agent finishes (or `until`); the kernel's clock starts the replay."""
    kernel = kernel or Kernel()
    log = ReplayLog()

    def react(effects: list[Effect]) -> list[Command]:
        commands: list[Command] = []
        for effect in effects:
            log.effects.append(effect)
            if isinstance(effect, IssueRequest):
                service = service_s(effect.request)
                if not service >= 0:
                    raise ValueError(f"service time of {effect.request.id!r} must be >= 0, got {service!r}")
                commands.append(
                    Event(
                        effect.at + service,
                        Priority.COMPLETION,
                        complete,
                        label=f"complete {effect.request.id}",
                        payload=effect.request.id,
                    )
                )
        wake = replayer.next_wakeup()
        commands.append(Cancel(_WAKE))
        if wake is not None:
            commands.append(Event(wake, Priority.ARRIVAL, on_wake, label="replayer wake-up", token=_WAKE))
        return commands

    def complete(event: Event) -> list[Command]:
        log.completed[event.payload] = event.time
        return react(replayer.completed(event.payload, event.time))

    def on_wake(event: Event) -> list[Command]:
        return react(replayer.due(event.time))

    kernel.apply(react(replayer.start(kernel.now)))
    log.result = kernel.run(until=until)
    return log
