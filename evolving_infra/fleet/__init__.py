"""A fleet: several AgentServingClusters (partitions), each with its own router, planner and KV directory.

Boundary: `binding` binds users to partitions (pure, shared by the gateway and the fleet simulator);
`partitions` reads partitions from AgentServingCluster YAML files or objects; `status` builds the fleet
status table. Serving traffic is the gateway's (`evolving_infra.gateway`).
"""
