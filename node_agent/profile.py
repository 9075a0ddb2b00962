"""Hardware profiles: the true cost coefficients and capacities of one (GPU, model, parallelism).

A profile is data (YAML or JSON) validated on load, so users add their own. The emulated engine takes its
iteration times from a profile's coefficients (the paper's equations 1 and 2); the planner and router never
read them: they fit their own online (`evolving_infra.router.fitting`).

Boundary: the schema and conversion to the core's coefficient types; reading files lives in
`evolving_infra.node_agent.profiles`.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolving_infra.core.itermodel import (
    DecodeCoefficients,
    PrefillCoefficients,
    PrefillItem,
    decode_iteration_time,
    prefill_iteration_time,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrefillModel(_Strict):
    """Coefficients of eq. 1, in seconds."""

    c0: float = Field(ge=0, description="fixed cost of a prefill iteration (s)")
    c1: float = Field(ge=0, description="time per uncached token (s)")
    c2: float = Field(ge=0, description="time per query-key pair (s)")
    c3: float = Field(ge=0, description="time per token restored from host memory (s)")

    def coefficients(self) -> PrefillCoefficients:
        return PrefillCoefficients(self.c0, self.c1, self.c2, self.c3)


class DecodeModel(_Strict):
    """Coefficients of eq. 2, in seconds, and the speculative-decoding and MoE shape."""

    d0: float = Field(ge=0, description="fixed cost of a decode iteration (s)")
    d1: float = Field(ge=0, description="time to read all routed experts (s)")
    d2: float = Field(ge=0, description="time per running request (s)")
    k: int = Field(ge=1, description="routed experts each token selects (top-k)")
    experts: int = Field(ge=1, description="routed experts E per MoE layer")
    t_fwd: float = Field(ge=1, description="tokens each running request feeds into an iteration")
    t_acc: float = Field(gt=0, description="mean tokens accepted per request per iteration")

    @model_validator(mode="after")
    def _shape(self) -> DecodeModel:
        if self.k > self.experts:
            raise ValueError(f"k ({self.k}) cannot exceed experts ({self.experts})")
        if self.t_acc > self.t_fwd:
            raise ValueError(f"t_acc ({self.t_acc}) cannot exceed t_fwd ({self.t_fwd})")
        return self

    def coefficients(self) -> DecodeCoefficients:
        return DecodeCoefficients(self.d0, self.d1, self.d2, self.k, self.experts, self.t_fwd)


class GroundTruth(_Strict):
    """What the emulated engine's true iteration time adds to eq. 1 and 2 (docs/hardware-profiles.md, "Ground truth").

    The fitted models have the form of eq. 1 and 2, so none of these can be captured exactly: the held-out
    error of a fit measures them together with the noise. All zero (the default for a user's profile) makes
    the true time eq. 1 and 2 with the profile's coefficients.
    """

    prefill_chunk_s: float = Field(
        default=0.0, ge=0, le=1, description="fixed cost of each request's chunk in a prefill iteration (s)"
    )
    decode_context_s: float = Field(
        default=0.0, ge=0, le=1e-6,
        description="decode time per token of context held by the running batch (s per token; attention reads)",
    )
    decode_graph_sizes: tuple[int, ...] = Field(
        default=(), description="captured decode batch sizes, ascending; a batch runs padded to the next one "
        "(its per-request term d2 is paid for the padded size); empty or past the last: no padding",
    )
    node_slowdown: float = Field(
        default=0.0, ge=0, le=1, description="largest relative slowdown of a node; each node's factor lies in "
        "[1, 1 + node_slowdown], fixed by its id",
    )

    @model_validator(mode="after")
    def _sizes(self) -> GroundTruth:
        sizes = self.decode_graph_sizes
        if any(b < 1 for b in sizes) or any(a >= b for a, b in zip(sizes, sizes[1:], strict=False)):
            raise ValueError(f"decode_graph_sizes must be positive and strictly ascending, got {list(sizes)}")
        return self

    @property
    def exact(self) -> bool:
        """Whether the true time is eq. 1 and 2 exactly (no effect set)."""
        return not (self.prefill_chunk_s or self.decode_context_s or self.decode_graph_sizes or self.node_slowdown)


class HardwareProfile(_Strict):
    """One node type: 4 GPUs serving one model with one parallelism, and its KV tiers and links."""

    name: str = Field(min_length=1, description="profile id, e.g. glm-5.2-4xgb300-tp4")
    description: str = Field(default="", description="what the profile models")
    gpu: str = Field(min_length=1, description="GPU type, e.g. GB300")
    gpus_per_node: int = Field(ge=1, description="GPUs per node")
    model: str = Field(min_length=1, description="served model")
    parallelism: str = Field(min_length=1, description="parallelism of the engine, e.g. TP4")
    prefill: PrefillModel
    decode: DecodeModel
    kv_bytes_per_token: int = Field(gt=0, description="KV bytes per token, one copy per node")
    l1_tokens: int = Field(gt=0, description="KV capacity of GPU memory (L1) in tokens")
    l2_tokens: int = Field(gt=0, description="KV capacity of host memory (L2) in tokens")
    page_tokens: int = Field(default=64, ge=1, description="tokens per KV page")
    chunk_tokens: int = Field(default=8192, ge=1, description="chunked-prefill token budget per iteration")
    fetch_bandwidth: float = Field(gt=0, description="peer host-to-host KV fetch bandwidth (bytes/s)")
    fetch_latency: float = Field(ge=0, description="fixed setup time of one peer fetch (s)")
    transfer_bandwidth: float = Field(gt=0, description="prefill-to-decode KV transfer bandwidth (bytes/s)")
    load_bandwidth: float = Field(gt=0, description="host-to-GPU load bandwidth within a node (bytes/s)")
    nic_bandwidth: float | None = Field(
        default=None, gt=0, description="each direction of a node's network interface, shared fairly by the "
        "fetches and KV transfers in flight through it (bytes/s; None: the largest of fetch_bandwidth and "
        "transfer_bandwidth)",
    )
    host_memory_bandwidth: float | None = Field(
        default=None, gt=0, description="host-memory bandwidth of a node available to KV movement, shared fairly "
        "by the fetches reading or writing it (bytes/s; None: no limit beyond the NIC)",
    )
    switch_latency: float = Field(
        default=0.7, ge=0, le=600, description="seconds a node needs after its drain before it serves its new "
        "phase (paper: 0.7 s on GPUs)",
    )
    truth: GroundTruth = Field(default_factory=GroundTruth, description="effects eq. 1 and 2 leave out")
    sources: dict[str, str] = Field(default_factory=dict, description="where each number comes from")

    @model_validator(mode="after")
    def _capacities(self) -> HardwareProfile:
        if self.l1_tokens < self.page_tokens:
            raise ValueError(f"l1_tokens ({self.l1_tokens}) must hold at least one page ({self.page_tokens})")
        if self.l2_tokens < self.page_tokens:
            raise ValueError(f"l2_tokens ({self.l2_tokens}) must hold at least one page ({self.page_tokens})")
        return self

    @model_validator(mode="after")
    def _source_keys(self) -> HardwareProfile:
        known = set(self.numeric_fields())
        unknown = sorted(set(self.sources) - known)
        if unknown:
            raise ValueError(
                f"sources names unknown field(s) {unknown}; sources are keyed by numeric field, one of {sorted(known)}"
            )
        return self

    @classmethod
    def numeric_fields(cls) -> tuple[str, ...]:
        """Dotted names of every number a profile holds (`prefill.c0`, `l1_tokens`, ...): the keys `sources` uses."""
        names: list[str] = []
        for name, info in cls.model_fields.items():
            sub = info.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                names.extend(f"{name}.{inner}" for inner in sub.model_fields)
            elif info.annotation in (int, float, float | None):
                names.append(name)
        return tuple(names)

    def prefill_time(self, items: Iterable[PrefillItem]) -> float:
        """True duration of one prefill iteration (eq. 1 with the profile's coefficients)."""
        return prefill_iteration_time(self.prefill.coefficients(), items)

    def decode_time(self, batch: float) -> float:
        """True duration of one decode iteration with `batch` running requests (eq. 2)."""
        return decode_iteration_time(self.decode.coefficients(), batch)

    @property
    def l1_pages(self) -> int:
        return self.l1_tokens // self.page_tokens

    @property
    def l2_pages(self) -> int:
        return self.l2_tokens // self.page_tokens

    def fetch_time(self, tokens: int) -> float:
        """Seconds to pull `tokens` of KV from a peer's host memory into this node's memory."""
        if tokens <= 0:
            return 0.0
        return self.fetch_latency + tokens * self.kv_bytes_per_token / self.fetch_bandwidth

    def transfer_time(self, tokens: int) -> float:
        """Seconds to send `tokens` of KV from a prefill node's GPUs to a decode node's GPUs."""
        return max(0, tokens) * self.kv_bytes_per_token / self.transfer_bandwidth

    def load_time(self, tokens: int) -> float:
        """Seconds to load `tokens` of KV from this node's host memory into its GPU memory."""
        return max(0, tokens) * self.kv_bytes_per_token / self.load_bandwidth
