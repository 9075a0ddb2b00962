"""Built-in hardware profiles as YAML data files (one per file, file name = profile name).

Boundary: data only; `evolving_infra.node_agent.profiles` reads and validates them.
"""
