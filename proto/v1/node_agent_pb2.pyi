from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_PREFILL: _ClassVar[Phase]
    PHASE_DECODE: _ClassVar[Phase]

class NodeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_MODE_UNSPECIFIED: _ClassVar[NodeMode]
    NODE_MODE_PREFILL: _ClassVar[NodeMode]
    NODE_MODE_DECODE: _ClassVar[NodeMode]
    NODE_MODE_COLLOCATED: _ClassVar[NodeMode]

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_GPU: _ClassVar[Tier]
    TIER_HOST: _ClassVar[Tier]

class SwitchState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SWITCH_STATE_UNSPECIFIED: _ClassVar[SwitchState]
    SWITCH_STATE_SERVING: _ClassVar[SwitchState]
    SWITCH_STATE_DRAINING: _ClassVar[SwitchState]
    SWITCH_STATE_SWITCHED: _ClassVar[SwitchState]
    SWITCH_STATE_RELAUNCHING: _ClassVar[SwitchState]

class SwitchMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SWITCH_MODE_UNSPECIFIED: _ClassVar[SwitchMode]
    SWITCH_MODE_IN_PLACE: _ClassVar[SwitchMode]
    SWITCH_MODE_IN_PLACE_STRAND_KV: _ClassVar[SwitchMode]
    SWITCH_MODE_RELAUNCH: _ClassVar[SwitchMode]

class TransportKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSPORT_KIND_UNSPECIFIED: _ClassVar[TransportKind]
    TRANSPORT_KIND_MOONCAKE_TCP: _ClassVar[TransportKind]
    TRANSPORT_KIND_GRPC: _ClassVar[TransportKind]

class RejectReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECT_REASON_UNSPECIFIED: _ClassVar[RejectReason]
    REJECT_REASON_WRONG_PHASE: _ClassVar[RejectReason]
    REJECT_REASON_DRAINING: _ClassVar[RejectReason]
    REJECT_REASON_TOO_LARGE: _ClassVar[RejectReason]
    REJECT_REASON_DUPLICATE: _ClassVar[RejectReason]
PHASE_UNSPECIFIED: Phase
PHASE_PREFILL: Phase
PHASE_DECODE: Phase
NODE_MODE_UNSPECIFIED: NodeMode
NODE_MODE_PREFILL: NodeMode
NODE_MODE_DECODE: NodeMode
NODE_MODE_COLLOCATED: NodeMode
TIER_UNSPECIFIED: Tier
TIER_GPU: Tier
TIER_HOST: Tier
SWITCH_STATE_UNSPECIFIED: SwitchState
SWITCH_STATE_SERVING: SwitchState
SWITCH_STATE_DRAINING: SwitchState
SWITCH_STATE_SWITCHED: SwitchState
SWITCH_STATE_RELAUNCHING: SwitchState
SWITCH_MODE_UNSPECIFIED: SwitchMode
SWITCH_MODE_IN_PLACE: SwitchMode
SWITCH_MODE_IN_PLACE_STRAND_KV: SwitchMode
SWITCH_MODE_RELAUNCH: SwitchMode
TRANSPORT_KIND_UNSPECIFIED: TransportKind
TRANSPORT_KIND_MOONCAKE_TCP: TransportKind
TRANSPORT_KIND_GRPC: TransportKind
REJECT_REASON_UNSPECIFIED: RejectReason
REJECT_REASON_WRONG_PHASE: RejectReason
REJECT_REASON_DRAINING: RejectReason
REJECT_REASON_TOO_LARGE: RejectReason
REJECT_REASON_DUPLICATE: RejectReason

class TraceContext(_message.Message):
    __slots__ = ("traceparent", "tracestate")
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    traceparent: str
    tracestate: str
    def __init__(self, traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class PageList(_message.Message):
    __slots__ = ("pages",)
    PAGES_FIELD_NUMBER: _ClassVar[int]
    pages: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, pages: _Optional[_Iterable[int]] = ...) -> None: ...

class FetchRun(_message.Message):
    __slots__ = ("peer", "pages", "peer_address")
    PEER_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    peer: str
    pages: _containers.RepeatedScalarFieldContainer[int]
    peer_address: str
    def __init__(self, peer: _Optional[str] = ..., pages: _Optional[_Iterable[int]] = ..., peer_address: _Optional[str] = ...) -> None: ...

class TierGauges(_message.Message):
    __slots__ = ("capacity", "free", "cached", "pinned", "in_use")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    free: int
    cached: int
    pinned: int
    in_use: int
    def __init__(self, capacity: _Optional[int] = ..., free: _Optional[int] = ..., cached: _Optional[int] = ..., pinned: _Optional[int] = ..., in_use: _Optional[int] = ...) -> None: ...

class SwitchPhaseRequest(_message.Message):
    __slots__ = ("target", "generation", "trace", "mode", "relaunch_seconds")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RELAUNCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    target: Phase
    generation: int
    trace: TraceContext
    mode: SwitchMode
    relaunch_seconds: float
    def __init__(self, target: _Optional[_Union[Phase, str]] = ..., generation: _Optional[int] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ..., mode: _Optional[_Union[SwitchMode, str]] = ..., relaunch_seconds: _Optional[float] = ...) -> None: ...

class SwitchPhaseResponse(_message.Message):
    __slots__ = ("phase", "generation", "drain_seconds", "switch_seconds", "handed_back", "already_serving")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SWITCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HANDED_BACK_FIELD_NUMBER: _ClassVar[int]
    ALREADY_SERVING_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    generation: int
    drain_seconds: float
    switch_seconds: float
    handed_back: _containers.RepeatedScalarFieldContainer[str]
    already_serving: bool
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., generation: _Optional[int] = ..., drain_seconds: _Optional[float] = ..., switch_seconds: _Optional[float] = ..., handed_back: _Optional[_Iterable[str]] = ..., already_serving: _Optional[bool] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunningPrefill(_message.Message):
    __slots__ = ("request_id", "remaining_tokens", "context_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REMAINING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    remaining_tokens: int
    context_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., remaining_tokens: _Optional[int] = ..., context_tokens: _Optional[int] = ...) -> None: ...

class NodeState(_message.Message):
    __slots__ = ("node", "mode", "switch_state", "generation", "l1", "l2", "prefill_queued", "prefill_waiting", "prefill_running", "decode_queued", "decode_running", "time", "prefill_events", "running_prefills", "queued_prefills", "prefill_queue_reported")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SWITCH_STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    L1_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    PREFILL_QUEUED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WAITING_FIELD_NUMBER: _ClassVar[int]
    PREFILL_RUNNING_FIELD_NUMBER: _ClassVar[int]
    DECODE_QUEUED_FIELD_NUMBER: _ClassVar[int]
    DECODE_RUNNING_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PREFILL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_QUEUE_REPORTED_FIELD_NUMBER: _ClassVar[int]
    node: str
    mode: NodeMode
    switch_state: SwitchState
    generation: int
    l1: TierGauges
    l2: TierGauges
    prefill_queued: int
    prefill_waiting: int
    prefill_running: int
    decode_queued: int
    decode_running: int
    time: float
    prefill_events: bool
    running_prefills: _containers.RepeatedCompositeFieldContainer[RunningPrefill]
    queued_prefills: _containers.RepeatedScalarFieldContainer[str]
    prefill_queue_reported: bool
    def __init__(self, node: _Optional[str] = ..., mode: _Optional[_Union[NodeMode, str]] = ..., switch_state: _Optional[_Union[SwitchState, str]] = ..., generation: _Optional[int] = ..., l1: _Optional[_Union[TierGauges, _Mapping]] = ..., l2: _Optional[_Union[TierGauges, _Mapping]] = ..., prefill_queued: _Optional[int] = ..., prefill_waiting: _Optional[int] = ..., prefill_running: _Optional[int] = ..., decode_queued: _Optional[int] = ..., decode_running: _Optional[int] = ..., time: _Optional[float] = ..., prefill_events: _Optional[bool] = ..., running_prefills: _Optional[_Iterable[_Union[RunningPrefill, _Mapping]]] = ..., queued_prefills: _Optional[_Iterable[str]] = ..., prefill_queue_reported: _Optional[bool] = ...) -> None: ...

class SubmitPrefillRequest(_message.Message):
    __slots__ = ("request_id", "branch_id", "prompt_pages", "prompt_tokens", "output_tokens", "t_acc", "fetch", "generated_pages", "trace")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_PAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    T_ACC_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    GENERATED_PAGES_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    branch_id: str
    prompt_pages: _containers.RepeatedScalarFieldContainer[int]
    prompt_tokens: int
    output_tokens: int
    t_acc: float
    fetch: _containers.RepeatedCompositeFieldContainer[FetchRun]
    generated_pages: PageList
    trace: TraceContext
    def __init__(self, request_id: _Optional[str] = ..., branch_id: _Optional[str] = ..., prompt_pages: _Optional[_Iterable[int]] = ..., prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., t_acc: _Optional[float] = ..., fetch: _Optional[_Iterable[_Union[FetchRun, _Mapping]]] = ..., generated_pages: _Optional[_Union[PageList, _Mapping]] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("accepted", "queue_position", "reject_reason", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    REJECT_REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    queue_position: int
    reject_reason: RejectReason
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., queue_position: _Optional[int] = ..., reject_reason: _Optional[_Union[RejectReason, str]] = ..., message: _Optional[str] = ...) -> None: ...

class SubmitDecodeRequest(_message.Message):
    __slots__ = ("request_id", "branch_id", "prompt_pages", "prompt_tokens", "output_tokens", "t_acc", "fetch", "generated_pages", "trace")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_PAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    T_ACC_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    GENERATED_PAGES_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    branch_id: str
    prompt_pages: _containers.RepeatedScalarFieldContainer[int]
    prompt_tokens: int
    output_tokens: int
    t_acc: float
    fetch: _containers.RepeatedCompositeFieldContainer[FetchRun]
    generated_pages: PageList
    trace: TraceContext
    def __init__(self, request_id: _Optional[str] = ..., branch_id: _Optional[str] = ..., prompt_pages: _Optional[_Iterable[int]] = ..., prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., t_acc: _Optional[float] = ..., fetch: _Optional[_Iterable[_Union[FetchRun, _Mapping]]] = ..., generated_pages: _Optional[_Union[PageList, _Mapping]] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ...) -> None: ...

class DecodeProgress(_message.Message):
    __slots__ = ("request_id", "accepted", "tokens", "finished")
    class Tokens(_message.Message):
        __slots__ = ("new_tokens", "total_tokens", "token_ids", "time")
        NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
        TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
        TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
        TIME_FIELD_NUMBER: _ClassVar[int]
        new_tokens: int
        total_tokens: int
        token_ids: _containers.RepeatedScalarFieldContainer[int]
        time: float
        def __init__(self, new_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., time: _Optional[float] = ...) -> None: ...
    class Finished(_message.Message):
        __slots__ = ("output_tokens", "time")
        OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
        TIME_FIELD_NUMBER: _ClassVar[int]
        output_tokens: int
        time: float
        def __init__(self, output_tokens: _Optional[int] = ..., time: _Optional[float] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    accepted: SubmitResponse
    tokens: DecodeProgress.Tokens
    finished: DecodeProgress.Finished
    def __init__(self, request_id: _Optional[str] = ..., accepted: _Optional[_Union[SubmitResponse, _Mapping]] = ..., tokens: _Optional[_Union[DecodeProgress.Tokens, _Mapping]] = ..., finished: _Optional[_Union[DecodeProgress.Finished, _Mapping]] = ...) -> None: ...

class ReadPagesRequest(_message.Message):
    __slots__ = ("pages", "chunk_bytes")
    PAGES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    pages: _containers.RepeatedScalarFieldContainer[int]
    chunk_bytes: int
    def __init__(self, pages: _Optional[_Iterable[int]] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class PagePiece(_message.Message):
    __slots__ = ("page", "offset", "data", "checksum", "page_bytes")
    PAGE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    page: int
    offset: int
    data: bytes
    checksum: int
    page_bytes: int
    def __init__(self, page: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., checksum: _Optional[int] = ..., page_bytes: _Optional[int] = ...) -> None: ...

class PageChunk(_message.Message):
    __slots__ = ("pieces",)
    PIECES_FIELD_NUMBER: _ClassVar[int]
    pieces: _containers.RepeatedCompositeFieldContainer[PagePiece]
    def __init__(self, pieces: _Optional[_Iterable[_Union[PagePiece, _Mapping]]] = ...) -> None: ...

class GetTransferEndpointRequest(_message.Message):
    __slots__ = ("pages",)
    PAGES_FIELD_NUMBER: _ClassVar[int]
    pages: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, pages: _Optional[_Iterable[int]] = ...) -> None: ...

class PageLocation(_message.Message):
    __slots__ = ("page", "slot", "checksum")
    PAGE_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    page: int
    slot: int
    checksum: int
    def __init__(self, page: _Optional[int] = ..., slot: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class TransferEndpoint(_message.Message):
    __slots__ = ("node", "transports", "mooncake_address", "buffer_base", "buffer_length", "slot_bytes", "slots", "locations", "missing")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    MOONCAKE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_BASE_FIELD_NUMBER: _ClassVar[int]
    BUFFER_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SLOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    node: str
    transports: _containers.RepeatedScalarFieldContainer[TransportKind]
    mooncake_address: str
    buffer_base: int
    buffer_length: int
    slot_bytes: int
    slots: int
    locations: _containers.RepeatedCompositeFieldContainer[PageLocation]
    missing: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node: _Optional[str] = ..., transports: _Optional[_Iterable[_Union[TransportKind, str]]] = ..., mooncake_address: _Optional[str] = ..., buffer_base: _Optional[int] = ..., buffer_length: _Optional[int] = ..., slot_bytes: _Optional[int] = ..., slots: _Optional[int] = ..., locations: _Optional[_Iterable[_Union[PageLocation, _Mapping]]] = ..., missing: _Optional[_Iterable[int]] = ...) -> None: ...

class KvStored(_message.Message):
    __slots__ = ("node", "tier", "parent", "pages", "time")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    node: str
    tier: Tier
    parent: int
    pages: _containers.RepeatedScalarFieldContainer[int]
    time: float
    def __init__(self, node: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., parent: _Optional[int] = ..., pages: _Optional[_Iterable[int]] = ..., time: _Optional[float] = ...) -> None: ...

class KvRemoved(_message.Message):
    __slots__ = ("node", "tier", "pages", "time")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    node: str
    tier: Tier
    pages: _containers.RepeatedScalarFieldContainer[int]
    time: float
    def __init__(self, node: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., pages: _Optional[_Iterable[int]] = ..., time: _Optional[float] = ...) -> None: ...

class KvCleared(_message.Message):
    __slots__ = ("node", "tier", "time")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    node: str
    tier: Tier
    time: float
    def __init__(self, node: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., time: _Optional[float] = ...) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("stored", "removed", "cleared")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    stored: KvStored
    removed: KvRemoved
    cleared: KvCleared
    def __init__(self, stored: _Optional[_Union[KvStored, _Mapping]] = ..., removed: _Optional[_Union[KvRemoved, _Mapping]] = ..., cleared: _Optional[_Union[KvCleared, _Mapping]] = ...) -> None: ...

class PrefillItem(_message.Message):
    __slots__ = ("t_uc", "t_c", "t_rst")
    T_UC_FIELD_NUMBER: _ClassVar[int]
    T_C_FIELD_NUMBER: _ClassVar[int]
    T_RST_FIELD_NUMBER: _ClassVar[int]
    t_uc: int
    t_c: int
    t_rst: int
    def __init__(self, t_uc: _Optional[int] = ..., t_c: _Optional[int] = ..., t_rst: _Optional[int] = ...) -> None: ...

class IterationReport(_message.Message):
    __slots__ = ("node", "phase", "start", "duration", "prefill", "decode_batch")
    NODE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_BATCH_FIELD_NUMBER: _ClassVar[int]
    node: str
    phase: Phase
    start: float
    duration: float
    prefill: _containers.RepeatedCompositeFieldContainer[PrefillItem]
    decode_batch: int
    def __init__(self, node: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ..., start: _Optional[float] = ..., duration: _Optional[float] = ..., prefill: _Optional[_Iterable[_Union[PrefillItem, _Mapping]]] = ..., decode_batch: _Optional[int] = ...) -> None: ...

class SwitchCompleted(_message.Message):
    __slots__ = ("node", "source", "target", "began", "completed", "handed_back", "generation")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BEGAN_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    HANDED_BACK_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    node: str
    source: NodeMode
    target: NodeMode
    began: float
    completed: float
    handed_back: int
    generation: int
    def __init__(self, node: _Optional[str] = ..., source: _Optional[_Union[NodeMode, str]] = ..., target: _Optional[_Union[NodeMode, str]] = ..., began: _Optional[float] = ..., completed: _Optional[float] = ..., handed_back: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class PrefillStarted(_message.Message):
    __slots__ = ("node", "request_id", "time", "prompt_tokens", "cached_tokens", "restored_tokens")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESTORED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    node: str
    request_id: str
    time: float
    prompt_tokens: int
    cached_tokens: int
    restored_tokens: int
    def __init__(self, node: _Optional[str] = ..., request_id: _Optional[str] = ..., time: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., restored_tokens: _Optional[int] = ...) -> None: ...

class PrefillFinished(_message.Message):
    __slots__ = ("node", "request_id", "time", "pages", "tokens", "cached_tokens")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    node: str
    request_id: str
    time: float
    pages: int
    tokens: int
    cached_tokens: int
    def __init__(self, node: _Optional[str] = ..., request_id: _Optional[str] = ..., time: _Optional[float] = ..., pages: _Optional[int] = ..., tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class HandedBack(_message.Message):
    __slots__ = ("node", "request_ids", "generation", "time")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    node: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    time: float
    def __init__(self, node: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ..., time: _Optional[float] = ...) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("subscriber",)
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    subscriber: str
    def __init__(self, subscriber: _Optional[str] = ...) -> None: ...

class NodeEvent(_message.Message):
    __slots__ = ("sequence", "kv", "iteration", "state", "switch_completed", "prefill_started", "prefill_finished", "handed_back")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SWITCH_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_STARTED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FINISHED_FIELD_NUMBER: _ClassVar[int]
    HANDED_BACK_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    kv: KvEventBatch
    iteration: IterationReport
    state: NodeState
    switch_completed: SwitchCompleted
    prefill_started: PrefillStarted
    prefill_finished: PrefillFinished
    handed_back: HandedBack
    def __init__(self, sequence: _Optional[int] = ..., kv: _Optional[_Union[KvEventBatch, _Mapping]] = ..., iteration: _Optional[_Union[IterationReport, _Mapping]] = ..., state: _Optional[_Union[NodeState, _Mapping]] = ..., switch_completed: _Optional[_Union[SwitchCompleted, _Mapping]] = ..., prefill_started: _Optional[_Union[PrefillStarted, _Mapping]] = ..., prefill_finished: _Optional[_Union[PrefillFinished, _Mapping]] = ..., handed_back: _Optional[_Union[HandedBack, _Mapping]] = ...) -> None: ...

class KvEventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ...) -> None: ...

class CountUpdate(_message.Message):
    __slots__ = ("sequence", "pages", "counts")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    pages: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sequence: _Optional[int] = ..., pages: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class PushCountsResponse(_message.Message):
    __slots__ = ("updates", "pages")
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    updates: int
    pages: int
    def __init__(self, updates: _Optional[int] = ..., pages: _Optional[int] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("prefill_cancelled", "decode_cancelled")
    PREFILL_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    DECODE_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    prefill_cancelled: bool
    decode_cancelled: bool
    def __init__(self, prefill_cancelled: _Optional[bool] = ..., decode_cancelled: _Optional[bool] = ...) -> None: ...
