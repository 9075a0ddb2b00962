"""Pure core shared by every component: request work, phases, ids, KV page identity, policy interfaces.

Boundary: no I/O, no clock, no global state; nothing here imports a service layer (gRPC, HTTP, Kubernetes).
"""
