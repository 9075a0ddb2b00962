"""The router's pure core: the cluster-wide KV directory, branch counts, and (later) models, planner and
routing policies, plus the live HTTP front end that drives them.

Boundary: modules here other than the explicitly named service modules are pure (no I/O, time passed in).
"""
