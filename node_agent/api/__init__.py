"""The node agent's gRPC edge: protobuf <-> dataclass conversions (`convert`), the KV page servicer
(`pages_service`: ReadPages, GetTransferEndpoint) and server assembly with health checking and
reflection (`server`).

Boundary: protobuf types stop here; everything inward takes the core's dataclasses. See docs/api.md.
"""
