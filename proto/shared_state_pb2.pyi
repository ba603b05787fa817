from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefixInsert(_message.Message):
    __slots__ = ("address", "hashes", "capacity")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    address: str
    hashes: _containers.RepeatedScalarFieldContainer[int]
    capacity: int
    def __init__(self, address: _Optional[str] = ..., hashes: _Optional[_Iterable[int]] = ..., capacity: _Optional[int] = ...) -> None: ...

class SessionPin(_message.Message):
    __slots__ = ("session_id", "address")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    address: str
    def __init__(self, session_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("prefix", "session")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    prefix: PrefixInsert
    session: SessionPin
    def __init__(self, prefix: _Optional[_Union[PrefixInsert, _Mapping]] = ..., session: _Optional[_Union[SessionPin, _Mapping]] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("format", "events")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    format: int
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, format: _Optional[int] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class InFlight(_message.Message):
    __slots__ = ("requests", "tokens")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    requests: int
    tokens: int
    def __init__(self, requests: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class TenantUsage(_message.Message):
    __slots__ = ("served_s", "waiting_s")
    SERVED_S_FIELD_NUMBER: _ClassVar[int]
    WAITING_S_FIELD_NUMBER: _ClassVar[int]
    served_s: float
    waiting_s: float
    def __init__(self, served_s: _Optional[float] = ..., waiting_s: _Optional[float] = ...) -> None: ...

class EndpointMetrics(_message.Message):
    __slots__ = ("waiting", "running", "kv_cache_usage", "active_loras", "waiting_loras", "max_loras", "block_size", "num_gpu_blocks", "served_models", "running_unreported")
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LORAS_FIELD_NUMBER: _ClassVar[int]
    WAITING_LORAS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPU_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SERVED_MODELS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_UNREPORTED_FIELD_NUMBER: _ClassVar[int]
    waiting: int
    running: int
    kv_cache_usage: float
    active_loras: _containers.RepeatedScalarFieldContainer[str]
    waiting_loras: _containers.RepeatedScalarFieldContainer[str]
    max_loras: int
    block_size: int
    num_gpu_blocks: int
    served_models: _containers.RepeatedScalarFieldContainer[str]
    running_unreported: bool
    def __init__(self, waiting: _Optional[int] = ..., running: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., active_loras: _Optional[_Iterable[str]] = ..., waiting_loras: _Optional[_Iterable[str]] = ..., max_loras: _Optional[int] = ..., block_size: _Optional[int] = ..., num_gpu_blocks: _Optional[int] = ..., served_models: _Optional[_Iterable[str]] = ..., running_unreported: _Optional[bool] = ...) -> None: ...

class EndpointScrape(_message.Message):
    __slots__ = ("address", "healthy", "metrics", "age_ms")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    address: str
    healthy: bool
    metrics: EndpointMetrics
    age_ms: int
    def __init__(self, address: _Optional[str] = ..., healthy: _Optional[bool] = ..., metrics: _Optional[_Union[EndpointMetrics, _Mapping]] = ..., age_ms: _Optional[int] = ...) -> None: ...

class ScrapeBatch(_message.Message):
    __slots__ = ("format", "endpoints")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    format: int
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointScrape]
    def __init__(self, format: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[EndpointScrape, _Mapping]]] = ...) -> None: ...
