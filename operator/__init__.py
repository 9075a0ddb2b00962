"""Kubernetes operator for the AgentServingCluster CRD (kopf): pure manifest builders and thin handlers.

Imported as `evolving_infra.operator`, never as `operator` (the standard library owns that name).
"""
