"""Build a simulated cluster from a `SimConfig` and a trace: engines, the router core (directory, branch table,
prefill router, decode binder), planner, replayer and pause rule, wired onto the kernel (`initial_commands`).

Nodes are named `n0 .. n{N-1}` (zero-padded so that name order is index order); the first P nodes of the
initial split serve prefill. With a collocated warmup every node starts in collocated mode and the control core
(`ControlCore`, the same as the live router's) orders each to its initial phase at `warmup_s`; otherwise the nodes
start in their initial phases and the planner runs from t=0.

Every random choice draws from a named stream of `RandomStreams(cfg.seed)`, so a run is a pure function of
the config and the trace.

Pages are named by the content model's dense labels (`PageLabels.DENSE`: the same equalities as content hashes,
cheaper page tables; `traces.content`), unless a content model is given. The workload is read lazily: the content
model names a request's pages when it is issued, and a `GrowingTrace`
(closed loop) loads each agent when the replayer starts it and releases it when it finishes (its pages are
dropped then); the results are those of the whole trace loaded up front.

Boundary: construction and wiring; behaviour lives in `flow`, `stepping` and `phases`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from evolving_infra.core.eviction import eviction_policy
from evolving_infra.core.types import NodeId, NodeMode, Phase
from evolving_infra.node_agent.engine import EngineCore
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.router.branches import BranchTable
from evolving_infra.router.core import CoreSettings, RouterCore
from evolving_infra.router.core.control import ControlCore, ControlSettings
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.planner import Planner
from evolving_infra.router.planner.registry import PLANNERS
from evolving_infra.router.routing import PrefillRouter
from evolving_infra.router.routing.registry import DECODE_BINDING, PREFILL_ROUTING
from evolving_infra.sim import flow, phases, stepping
from evolving_infra.sim.config import DecodeReservation, PauseRuleName, SimConfig
from evolving_infra.sim.kernel import Command, Event, Priority
from evolving_infra.sim.models import model_book
from evolving_infra.sim.pause import ThunderAgentRule
from evolving_infra.sim.replay import AgentReplayer, ReplayMode, StreamedPlan
from evolving_infra.sim.rng import RandomStreams
from evolving_infra.sim.state import ClusterState, SimNode
from evolving_infra.traces.content import ContentModel, PageLabels
from evolving_infra.traces.growing import GrowingTrace, LoadedAgent
from evolving_infra.traces.records import Relation, Request, Trace


def node_ids(count: int) -> list[NodeId]:
    width = len(str(count - 1))
    return [NodeId(f"n{i:0{width}d}") for i in range(count)]


def initial_phases(cfg: SimConfig) -> dict[str, Phase]:
    p, _ = cfg.split_counts
    return {n: (Phase.PREFILL if i < p else Phase.DECODE) for i, n in enumerate(node_ids(cfg.nodes))}


def engine_factory(cfg: SimConfig, profile: HardwareProfile, streams: RandomStreams,
                   dense_labels: bool = False) -> Callable[[NodeId, NodeMode], EngineCore]:  # fmt: skip
    """Engines for the simulated nodes; `dense_labels`: the content model names pages by dense labels."""

    def make(node: NodeId, mode: NodeMode) -> EngineCore:
        noise = cfg.engine_noise
        rng = streams.seeded(f"noise/{node}") if noise > 0 else None
        return EngineCore(node, profile, mode, eviction_policy(cfg.eviction), cfg.data_plane, noise=noise, rng=rng,
                          report_detail=False, exact_models=cfg.exact_models, dense_labels=dense_labels)

    return make


def fork_parents(trace: Trace | GrowingTrace, requests: Iterable[Request]) -> dict[str, str]:
    """Branch -> the branch it forked from, for the forks among `requests`."""
    return {r.branch: trace.request(r.base).branch for r in requests if r.relation is Relation.FORK and r.base}


def build_cluster(cfg: SimConfig, trace: Trace | GrowingTrace, profile: HardwareProfile | None = None,
                  content: ContentModel | None = None, labels: PageLabels = PageLabels.DENSE) -> ClusterState:
    """A cluster ready to run `trace`; `profile` and `content` may be given to skip loading them (else the
    content model names pages by `labels`)."""
    profile = profile if profile is not None else load_profile(cfg.profile)
    streams = RandomStreams(cfg.seed)
    if content is None or content.page_tokens != profile.page_tokens:
        content = ContentModel(trace, profile.page_tokens, lazy=True, labels=labels)
    streamed = isinstance(trace, GrowingTrace) and cfg.agents is not None
    if isinstance(trace, GrowingTrace) and not streamed:
        trace.load_all()  # open loop: every agent's start time is needed up front
    parents: dict[str, str] = {}
    if isinstance(trace, GrowingTrace):
        if trace.listened:
            raise ValueError("this growing trace already serves a simulation (it releases agents as that run "
                             "finishes them); make another one for this run (sim.run.workload_stream)")
        lazy = trace

        def loaded(agent: LoadedAgent) -> None:
            parents.update(fork_parents(lazy, agent.requests))

        def released(agent: LoadedAgent) -> None:
            content.release(r.index for r in agent.requests)
            for r in agent.requests:
                parents.pop(r.branch, None)

        trace.on_load(loaded)
        trace.on_release(released)
    else:
        parents.update(fork_parents(trace, trace.requests))
    collocated = cfg.collocated_warmup and cfg.warmup_s > 0
    start = initial_phases(cfg)
    make_engine = engine_factory(cfg, profile, streams, dense_labels=content.labels is PageLabels.DENSE)
    directory = KvDirectory()
    nodes: dict[NodeId, SimNode] = {}
    for n, phase in start.items():
        nid = NodeId(n)
        directory.add_node(nid)
        mode = NodeMode.COLLOCATED if collocated else NodeMode.of(phase)
        nodes[nid] = SimNode(id=nid, phase=None if collocated else phase, engine=make_engine(nid, mode),
                             span_phase=None if collocated else phase)
    branches = BranchTable({NodeId(n): (Phase.PREFILL if collocated else p) for n, p in start.items()})
    replay_mode = (ReplayMode.closed_loop(cfg.agents, cfg.skip_late_s, cfg.replay_mix) if cfg.agents is not None
                   else ReplayMode.open_loop(cfg.max_active))
    models = model_book(profile, cfg.models)
    core = RouterCore(
        nodes,
        router=_router(cfg, streams),
        binder=DECODE_BINDING.build(cfg.decode_routing, cfg.decode_settings, streams.seeded("decode-binder")),
        settings=CoreSettings(
            shared_pool=cfg.shared_pool,
            reserve_on_bind=cfg.decode_reservation is DecodeReservation.AT_PREFILL_START,
            context_length_tokens=cfg.context_length_tokens,
            kv_capacity_tokens=profile.l1_tokens,
            node_kv_pages=models.shape.node_kv_pages,  # (the live router's figure: the same shape)
        ),
        directory=directory,
        branches=branches,
    )
    planner = _planner(cfg, streams)
    control = ControlCore(
        core, planner,
        ControlSettings(
            initial={NodeId(n): p for n, p in start.items()},
            warmup_s=cfg.warmup_s if collocated else 0.0,
            fit_interval_s=cfg.fit_interval_s,
        ),
        models,
    )  # fmt: skip
    state = ClusterState(
        cfg=cfg,
        profile=profile,
        nodes=nodes,
        core=core,
        control=control,
        replayer=AgentReplayer(StreamedPlan(trace) if isinstance(trace, GrowingTrace) and streamed else trace,
                               replay_mode),
        content=content,
        trace=trace,
        parents=parents,
        pause=ThunderAgentRule() if cfg.pause_rule is PauseRuleName.THUNDERAGENT else None,
        make_engine=make_engine,
        scored_end=cfg.scored_end,
    )
    state.on_step = lambda e: stepping.on_step(state, e)
    return state


def _router(cfg: SimConfig, streams: RandomStreams) -> PrefillRouter:
    return PREFILL_ROUTING.build(cfg.prefill_routing, cfg.routing_settings, streams.seeded("prefill-router"))


def _planner(cfg: SimConfig, streams: RandomStreams) -> Planner:
    return PLANNERS.build(cfg.planner, cfg.planner_settings, streams.seeded("relaunch"))


def initial_commands(state: ClusterState) -> list[Command]:
    """What starts the run at t=0: the replayer's first effects, the control core (warmup or split), the pause
    ticks."""
    out = phases.start_control(state, 0.0)
    out += flow.react(state, state.replayer.start(0.0), 0.0)
    if state.pause is not None:
        out.append(Event(state.pause.interval_s, Priority.CONTROL, lambda e: phases.on_pause_tick(state, e),
                         label="pause tick"))
    return out
