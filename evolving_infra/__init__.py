"""evolving-infra: agent-adaptive LLM serving.

Boundary: this root package only names the distribution. The pure core lives in `evolving_infra.core`
(types, page identity, policy interfaces) and `evolving_infra.traces` (the agent trace contract); the
components are mapped in from the repository's top-level folders: `evolving_infra.router` (KV directory,
branch counts, models, planner, routing), `evolving_infra.node_agent` (symmetric engine), `evolving_infra.sim`
(virtual-time driver) and `evolving_infra.operator` (Kubernetes operator).
"""

__version__ = "0.1.0"
