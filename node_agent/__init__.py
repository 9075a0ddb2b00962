"""The node: the symmetric engine core (one scheduling loop for both phases), its L1/L2 KV pool, hardware
profiles, and (later) the node agent service that drives the engine on the wall clock.

Boundary: the engine core and profiles are pure; the service layer is the only place with I/O.
"""
