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
