"""A request's headers as the picker reads them: the ones it keeps, the forged system headers to
strip, the API the path names, and what it refuses: a path outside the inference API, a declared
length over the gateway's body limit."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from extproc import names
from extproc.events import Headers
from extproc.inference_paths import check_path
from extproc.openai_request import api_kind
from policies.errors import PayloadTooLargeError
from policies.types import ApiKind


@dataclass(frozen=True, slots=True)
class ReadHeaders:
    headers: MappingProxyType[str, str]
    """Every header but the system-owned ones, by lower-case name (the last copy wins)."""
    strip: tuple[str, ...]
    """System-owned headers a client sent (``names.is_system_owned``): each once, in arrival order."""
    api: ApiKind

    def refuse(self, limit: int, extra_paths: frozenset[str]) -> None:
        """404 for a path the picker does not serve (``extproc.inference_paths``: the pool's
        ``extra_paths`` besides the inference API), 413 when the declared ``content-length`` is over
        ``limit`` bytes."""
        headers = self.headers
        check_path(headers.get(":method", ""), headers.get(":path", ""), extra_paths)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise PayloadTooLargeError(f"request body exceeds the gateway limit of {limit} bytes")


def read_request_headers(pairs: Headers) -> ReadHeaders:
    headers: dict[str, str] = {}
    strip: list[str] = []
    system_owned, kvgate_prefix = names.SYSTEM_OWNED_HEADERS, names.KVGATE_HEADER_PREFIX
    for name, value in pairs:  # names.is_system_owned, inlined (every header, every request)
        key = name.lower()
        if key in system_owned or key.startswith(kvgate_prefix):
            strip.append(key)
        else:
            headers[key] = value
    api = api_kind(headers.get(":path", ""))
    return ReadHeaders(MappingProxyType(headers), tuple(dict.fromkeys(strip)), api)


def model_header(pairs: Headers) -> str:
    """The ``x-gateway-model-name`` header (set from the body by the body-based router), or ''."""
    return next((value for name, value in pairs if name.lower() == names.MODEL_NAME_HEADER), "")
