"""The gRPC/protobuf API of evolving-infra: `.proto` sources and their generated Python stubs, one
subpackage per API version (`evolving_infra.proto.v1`).

Boundary: wire types only. Code converts to and from the core's dataclasses at the service edge
(`evolving_infra.node_agent.api.convert`); nothing else passes protobuf messages around.
"""
