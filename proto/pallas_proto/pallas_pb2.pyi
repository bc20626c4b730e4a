from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Scheme(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEME_UNSPECIFIED: _ClassVar[Scheme]
    SCHEME_PALLAS: _ClassVar[Scheme]
    SCHEME_FULL_COPY: _ClassVar[Scheme]
    SCHEME_RECOMPUTATION: _ClassVar[Scheme]
    SCHEME_CTHO: _ClassVar[Scheme]
    SCHEME_DETOUR: _ClassVar[Scheme]
    SCHEME_NO_RC: _ClassVar[Scheme]
    SCHEME_NO_SM: _ClassVar[Scheme]
    SCHEME_PALLAS_BRIDGE: _ClassVar[Scheme]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_OK: _ClassVar[Status]
    STATUS_STALE_EPOCH: _ClassVar[Status]
    STATUS_UNKNOWN_SESSION: _ClassVar[Status]
    STATUS_REJECTED: _ClassVar[Status]
    STATUS_INVALID: _ClassVar[Status]
    STATUS_ERROR: _ClassVar[Status]

class SessionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_UNSPECIFIED: _ClassVar[SessionState]
    SESSION_NEW: _ClassVar[SessionState]
    SESSION_SERVING: _ClassVar[SessionState]
    SESSION_MIGRATING: _ClassVar[SessionState]
    SESSION_COMMITTING: _ClassVar[SessionState]
    SESSION_HANDED_OVER: _ClassVar[SessionState]
    SESSION_PREPARING: _ClassVar[SessionState]
    SESSION_RESUMED: _ClassVar[SessionState]
    SESSION_FINISHED: _ClassVar[SessionState]
    SESSION_FAILED: _ClassVar[SessionState]
SCHEME_UNSPECIFIED: Scheme
SCHEME_PALLAS: Scheme
SCHEME_FULL_COPY: Scheme
SCHEME_RECOMPUTATION: Scheme
SCHEME_CTHO: Scheme
SCHEME_DETOUR: Scheme
SCHEME_NO_RC: Scheme
SCHEME_NO_SM: Scheme
SCHEME_PALLAS_BRIDGE: Scheme
STATUS_UNSPECIFIED: Status
STATUS_OK: Status
STATUS_STALE_EPOCH: Status
STATUS_UNKNOWN_SESSION: Status
STATUS_REJECTED: Status
STATUS_INVALID: Status
STATUS_ERROR: Status
SESSION_UNSPECIFIED: SessionState
SESSION_NEW: SessionState
SESSION_SERVING: SessionState
SESSION_MIGRATING: SessionState
SESSION_COMMITTING: SessionState
SESSION_HANDED_OVER: SessionState
SESSION_PREPARING: SessionState
SESSION_RESUMED: SessionState
SESSION_FINISHED: SessionState
SESSION_FAILED: SessionState

class ModelIdentity(_message.Message):
    __slots__ = ("model", "weights_digest", "dtype", "kv_cache_dtype", "block_size", "backend", "kv_bytes_per_token", "num_layers", "block_bytes")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    model: str
    weights_digest: str
    dtype: str
    kv_cache_dtype: str
    block_size: int
    backend: str
    kv_bytes_per_token: int
    num_layers: int
    block_bytes: int
    def __init__(self, model: _Optional[str] = ..., weights_digest: _Optional[str] = ..., dtype: _Optional[str] = ..., kv_cache_dtype: _Optional[str] = ..., block_size: _Optional[int] = ..., backend: _Optional[str] = ..., kv_bytes_per_token: _Optional[int] = ..., num_layers: _Optional[int] = ..., block_bytes: _Optional[int] = ...) -> None: ...

class PeerEndpoint(_message.Message):
    __slots__ = ("agent_id", "address")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    address: str
    def __init__(self, agent_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class TriggerRequest(_message.Message):
    __slots__ = ("session_id", "epoch", "target", "split_tokens", "predicted_handover_time", "scheme", "window_s", "rank")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SPLIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_HANDOVER_TIME_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    target: PeerEndpoint
    split_tokens: int
    predicted_handover_time: float
    scheme: Scheme
    window_s: float
    rank: int
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., target: _Optional[_Union[PeerEndpoint, _Mapping]] = ..., split_tokens: _Optional[int] = ..., predicted_handover_time: _Optional[float] = ..., scheme: _Optional[_Union[Scheme, str]] = ..., window_s: _Optional[float] = ..., rank: _Optional[int] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("session_id", "epoch", "reason", "target")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    reason: str
    target: PeerEndpoint
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[str] = ..., target: _Optional[_Union[PeerEndpoint, _Mapping]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("session_id", "epoch", "actual_target", "scheme", "handover_time")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_TARGET_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_TIME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    actual_target: PeerEndpoint
    scheme: Scheme
    handover_time: float
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., actual_target: _Optional[_Union[PeerEndpoint, _Mapping]] = ..., scheme: _Optional[_Union[Scheme, str]] = ..., handover_time: _Optional[float] = ...) -> None: ...

class ControlReply(_message.Message):
    __slots__ = ("status", "message", "session_id", "epoch", "state", "split_tokens", "scheme", "blocks_moved", "kv_bytes_moved", "reused_tokens", "recomputed_tokens", "choice")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_MOVED_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    session_id: str
    epoch: int
    state: SessionState
    split_tokens: int
    scheme: Scheme
    blocks_moved: int
    kv_bytes_moved: int
    reused_tokens: int
    recomputed_tokens: int
    choice: CommitChoice
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., state: _Optional[_Union[SessionState, str]] = ..., split_tokens: _Optional[int] = ..., scheme: _Optional[_Union[Scheme, str]] = ..., blocks_moved: _Optional[int] = ..., kv_bytes_moved: _Optional[int] = ..., reused_tokens: _Optional[int] = ..., recomputed_tokens: _Optional[int] = ..., choice: _Optional[_Union[CommitChoice, _Mapping]] = ...) -> None: ...

class CommitChoice(_message.Message):
    __slots__ = ("option", "finish_s", "ctho_s", "recompute_s", "detour_s", "prefilled_tokens", "prefix_tokens", "received_blocks", "handover_tokens", "ctho_split_tokens", "prefill_rate", "goodput_bytes_per_s", "c_sync_s", "waited_s")
    OPTION_FIELD_NUMBER: _ClassVar[int]
    FINISH_S_FIELD_NUMBER: _ClassVar[int]
    CTHO_S_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    DETOUR_S_FIELD_NUMBER: _ClassVar[int]
    PREFILLED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CTHO_SPLIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_RATE_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    C_SYNC_S_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    option: str
    finish_s: float
    ctho_s: float
    recompute_s: float
    detour_s: float
    prefilled_tokens: int
    prefix_tokens: int
    received_blocks: int
    handover_tokens: int
    ctho_split_tokens: int
    prefill_rate: float
    goodput_bytes_per_s: float
    c_sync_s: float
    waited_s: float
    def __init__(self, option: _Optional[str] = ..., finish_s: _Optional[float] = ..., ctho_s: _Optional[float] = ..., recompute_s: _Optional[float] = ..., detour_s: _Optional[float] = ..., prefilled_tokens: _Optional[int] = ..., prefix_tokens: _Optional[int] = ..., received_blocks: _Optional[int] = ..., handover_tokens: _Optional[int] = ..., ctho_split_tokens: _Optional[int] = ..., prefill_rate: _Optional[float] = ..., goodput_bytes_per_s: _Optional[float] = ..., c_sync_s: _Optional[float] = ..., waited_s: _Optional[float] = ...) -> None: ...

class TelemetryRequest(_message.Message):
    __slots__ = ("period_ms",)
    PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    period_ms: int
    def __init__(self, period_ms: _Optional[int] = ...) -> None: ...

class SessionTelemetry(_message.Message):
    __slots__ = ("session_id", "ue_id", "tokens", "decode_rate", "prompt_tokens", "max_tokens", "state", "epoch", "remaining_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    UE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_RATE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REMAINING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    ue_id: str
    tokens: int
    decode_rate: float
    prompt_tokens: int
    max_tokens: int
    state: str
    epoch: int
    remaining_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., ue_id: _Optional[str] = ..., tokens: _Optional[int] = ..., decode_rate: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., state: _Optional[str] = ..., epoch: _Optional[int] = ..., remaining_tokens: _Optional[int] = ...) -> None: ...

class PeerTelemetry(_message.Message):
    __slots__ = ("agent_id", "goodput_bytes_per_s", "bytes_sent", "rtt_s", "measured_at")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    RTT_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    goodput_bytes_per_s: float
    bytes_sent: int
    rtt_s: float
    measured_at: float
    def __init__(self, agent_id: _Optional[str] = ..., goodput_bytes_per_s: _Optional[float] = ..., bytes_sent: _Optional[int] = ..., rtt_s: _Optional[float] = ..., measured_at: _Optional[float] = ...) -> None: ...

class ServerTelemetry(_message.Message):
    __slots__ = ("model", "prefill_rate", "free_kv_blocks", "total_kv_blocks", "decode_rate", "prefill_rate_measured_at")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_RATE_FIELD_NUMBER: _ClassVar[int]
    FREE_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DECODE_RATE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_RATE_MEASURED_AT_FIELD_NUMBER: _ClassVar[int]
    model: ModelIdentity
    prefill_rate: float
    free_kv_blocks: int
    total_kv_blocks: int
    decode_rate: float
    prefill_rate_measured_at: float
    def __init__(self, model: _Optional[_Union[ModelIdentity, _Mapping]] = ..., prefill_rate: _Optional[float] = ..., free_kv_blocks: _Optional[int] = ..., total_kv_blocks: _Optional[int] = ..., decode_rate: _Optional[float] = ..., prefill_rate_measured_at: _Optional[float] = ...) -> None: ...

class TelemetryReport(_message.Message):
    __slots__ = ("agent_id", "time", "server", "sessions", "peers")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    time: float
    server: ServerTelemetry
    sessions: _containers.RepeatedCompositeFieldContainer[SessionTelemetry]
    peers: _containers.RepeatedCompositeFieldContainer[PeerTelemetry]
    def __init__(self, agent_id: _Optional[str] = ..., time: _Optional[float] = ..., server: _Optional[_Union[ServerTelemetry, _Mapping]] = ..., sessions: _Optional[_Iterable[_Union[SessionTelemetry, _Mapping]]] = ..., peers: _Optional[_Iterable[_Union[PeerTelemetry, _Mapping]]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "min_tokens", "stop_token_ids", "ignore_eos", "seed", "has_seed")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    HAS_SEED_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    seed: int
    has_seed: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: bool = ..., seed: _Optional[int] = ..., has_seed: bool = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ("session_id", "epoch", "source", "model", "prefix_token_ids", "expected_kv_bytes", "scheme", "ue_id", "rank")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    UE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    source: PeerEndpoint
    model: ModelIdentity
    prefix_token_ids: _containers.RepeatedScalarFieldContainer[int]
    expected_kv_bytes: int
    scheme: Scheme
    ue_id: str
    rank: int
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., source: _Optional[_Union[PeerEndpoint, _Mapping]] = ..., model: _Optional[_Union[ModelIdentity, _Mapping]] = ..., prefix_token_ids: _Optional[_Iterable[int]] = ..., expected_kv_bytes: _Optional[int] = ..., scheme: _Optional[_Union[Scheme, str]] = ..., ue_id: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class PrepareReply(_message.Message):
    __slots__ = ("status", "message", "model", "free_kv_bytes", "lease_s")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FREE_KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    model: ModelIdentity
    free_kv_bytes: int
    lease_s: float
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., model: _Optional[_Union[ModelIdentity, _Mapping]] = ..., free_kv_bytes: _Optional[int] = ..., lease_s: _Optional[float] = ...) -> None: ...

class KVBlock(_message.Message):
    __slots__ = ("session_id", "epoch", "block_index", "fill", "checksum", "data")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    FILL_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    block_index: int
    fill: int
    checksum: int
    data: bytes
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., block_index: _Optional[int] = ..., fill: _Optional[int] = ..., checksum: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class StreamAck(_message.Message):
    __slots__ = ("session_id", "epoch", "blocks_received", "bytes_received", "blocks_rejected")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_REJECTED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    blocks_received: int
    bytes_received: int
    blocks_rejected: int
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., blocks_received: _Optional[int] = ..., bytes_received: _Optional[int] = ..., blocks_rejected: _Optional[int] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("session_id", "epoch", "token_ids", "prompt_tokens", "tail", "streamed_blocks", "sampling", "scheme", "split_tokens", "ue_id", "session_scheme", "warmup_wait_s", "deadline_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    STREAMED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    SPLIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_SCHEME_FIELD_NUMBER: _ClassVar[int]
    WARMUP_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_tokens: int
    tail: KVBlock
    streamed_blocks: int
    sampling: SamplingParams
    scheme: Scheme
    split_tokens: int
    ue_id: str
    session_scheme: Scheme
    warmup_wait_s: float
    deadline_s: float
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., prompt_tokens: _Optional[int] = ..., tail: _Optional[_Union[KVBlock, _Mapping]] = ..., streamed_blocks: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., scheme: _Optional[_Union[Scheme, str]] = ..., split_tokens: _Optional[int] = ..., ue_id: _Optional[str] = ..., session_scheme: _Optional[_Union[Scheme, str]] = ..., warmup_wait_s: _Optional[float] = ..., deadline_s: _Optional[float] = ...) -> None: ...

class SyncReply(_message.Message):
    __slots__ = ("status", "message", "reused_tokens", "blocks_received", "bytes_received")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    reused_tokens: int
    blocks_received: int
    bytes_received: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., reused_tokens: _Optional[int] = ..., blocks_received: _Optional[int] = ..., bytes_received: _Optional[int] = ...) -> None: ...

class ProgressRequest(_message.Message):
    __slots__ = ("session_id", "epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class ProgressReply(_message.Message):
    __slots__ = ("status", "prefix_tokens", "prefilled_tokens", "warmup_done", "blocks_received", "bytes_received", "prefill_rate", "warmup_failed")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILLED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_DONE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_RATE_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FAILED_FIELD_NUMBER: _ClassVar[int]
    status: Status
    prefix_tokens: int
    prefilled_tokens: int
    warmup_done: bool
    blocks_received: int
    bytes_received: int
    prefill_rate: float
    warmup_failed: bool
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., prefix_tokens: _Optional[int] = ..., prefilled_tokens: _Optional[int] = ..., warmup_done: bool = ..., blocks_received: _Optional[int] = ..., bytes_received: _Optional[int] = ..., prefill_rate: _Optional[float] = ..., warmup_failed: bool = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id", "epoch", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ("status", "message", "blocks_released")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RELEASED_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    blocks_released: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., blocks_released: _Optional[int] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("session_id", "epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class RenewReply(_message.Message):
    __slots__ = ("status", "message", "lease_s")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    lease_s: float
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., lease_s: _Optional[float] = ...) -> None: ...
