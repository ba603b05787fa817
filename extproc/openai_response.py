"""Response bodies: token usage from JSON and SSE, the injected usage chunk, the model name.

:class:`ResponseBodyProcessor` is fed the body chunk by chunk and returns the bytes to forward
at once. SSE passes through unbuffered unless events must be edited (the gateway added
``include_usage`` and the client did not ask for it, so the usage-only event is dropped; or the
model is renamed back): then whole events are forwarded as soon as they are complete and only a
partial event is held back. JSON bodies pass through as they come (a bounded copy is kept for the
usage) unless the model must be renamed, which needs the whole body.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from kvgate.policies.types import Usage

_log = logging.getLogger(__name__)

_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_EVENT_END = re.compile(rb"\r?\n\r?\n")
_TAIL_BYTES = 64 * 1024
_EVENT_TYPE = re.compile(rb'"type"\s*:\s*"(response\.[A-Za-z_.]+|error)"')
_PREAMBLE_EVENTS = frozenset({b"response.created", b"response.in_progress", b"response.queued"})
"""A Responses API stream's events before its output: vLLM sends the first two as the request
starts, before the prompt's prefill (``responses_stream_generator``), then the output's events."""


def usage_from_document(document: object) -> Usage | None:
    """Usage of a completion / chat / embeddings body, an SSE chunk, or a Responses API event."""
    if not isinstance(document, dict):
        return None
    usage = document.get("usage")
    if not isinstance(usage, dict):
        response = document.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=prompt or 0,
        completion_tokens=completion or 0,
        cached_tokens=_int(cached),
    )


def _last_match(pattern: re.Pattern[bytes], data: bytes | bytearray) -> re.Match[bytes] | None:
    match = None
    for match in pattern.finditer(data):  # noqa: B007 - only the last one is wanted
        pass
    return match


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ResponseBodyProcessor:
    """Per-response body filter. ``feed`` returns the bytes to forward now; ``usage`` is the last seen."""

    __slots__ = ("_copy", "_copy_limit", "_copy_size", "_drop_usage_chunk", "_model_pattern",
                 "_model_replacement", "_overflowed", "_pending", "_preamble", "_sse", "_tail", "usage")

    def __init__(
        self,
        *,
        sse: bool,
        drop_usage_chunk: bool = False,
        rename_model: tuple[str, str] | None = None,
        copy_limit: int = 4 * 1024 * 1024,
        preamble: bool = False,
    ) -> None:
        """``rename_model`` is (model the replica reports, model the client sent) or None;
        ``preamble``: a Responses API stream, whose first events come before its first token."""
        self._sse = sse
        self._preamble = preamble and sse
        self._drop_usage_chunk = drop_usage_chunk and sse
        self._model_pattern: re.Pattern[bytes] | None = None
        self._model_replacement = b""
        if rename_model is not None and rename_model[0] != rename_model[1]:
            served = json.dumps(rename_model[0])[1:-1].encode()
            self._model_pattern = re.compile(rb'("model"\s*:\s*)"' + re.escape(served) + rb'"')
            self._model_replacement = json.dumps(rename_model[1]).encode().replace(b"\\", b"\\\\")
        self._pending = bytearray()
        self._copy: list[bytes] = []
        self._copy_limit = copy_limit
        self._copy_size = 0
        self._overflowed = False
        self._tail = b""
        self.usage: Usage | None = None

    def carries_output(self, data: bytes) -> bool:
        """Whether the body, with ``data``, has carried the response's first token: any data, but
        for a Responses API stream an event past the ones sent before the prefill (read first as
        the first token, they counted a long prompt's prefill done at once: its queued prefill
        left out of the picker's estimates, and a time to first token of a few milliseconds)."""
        if not self._preamble:
            return bool(data)
        for match in _EVENT_TYPE.finditer(data):
            if match.group(1) not in _PREAMBLE_EVENTS:
                self._preamble = False
                return True
        return False

    @property
    def edits(self) -> bool:
        """True when forwarded bytes may differ from the replica's (Content-Length must go)."""
        return self._drop_usage_chunk or self._model_pattern is not None

    def feed(self, data: bytes, end_of_stream: bool) -> bytes:
        if self._sse:
            return self._feed_sse(data, end_of_stream)
        return self._feed_json(data, end_of_stream)

    # SSE -----------------------------------------------------------------------------------
    def _feed_sse(self, data: bytes, end_of_stream: bool) -> bytes:
        self._pending += data
        complete = len(self._pending)
        if not end_of_stream:
            last = _last_match(_EVENT_END, self._pending)
            complete = last.end() if last is not None else 0
        events = bytes(self._pending[:complete])
        del self._pending[:complete]
        if not self.edits:
            self._scan_sse(events)
            return data
        return self._edit_sse(events)

    def _scan_sse(self, events: bytes) -> None:
        if _USAGE_OBJECT.search(events) is None:
            return
        for event in _EVENT_END.split(events):
            if _USAGE_OBJECT.search(event) is not None:
                self._usage_of_event(event)

    def _edit_sse(self, events: bytes) -> bytes:
        if not events:
            return b""
        out: list[bytes] = []
        position = 0
        for end in _EVENT_END.finditer(events):
            out.append(self._edit_event(events[position : end.start()], events[end.start() : end.end()]))
            position = end.end()
        if position < len(events):
            out.append(self._edit_event(events[position:], b""))
        return b"".join(out)

    def _edit_event(self, event: bytes, separator: bytes) -> bytes:
        if _USAGE_OBJECT.search(event) is not None:
            document = self._usage_of_event(event)
            if self._drop_usage_chunk and isinstance(document, dict) and document.get("choices") == []:
                return b""
        if self._model_pattern is not None:
            event = self._model_pattern.sub(rb"\1" + self._model_replacement, event, count=1)
        return event + separator

    def _usage_of_event(self, event: bytes) -> object:
        payload = b"\n".join(
            line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")
        )
        if not payload or payload == b"[DONE]":
            return None
        try:
            document: Any = json.loads(payload)
        except ValueError:
            _log.debug("unparsable SSE event with usage skipped")
            return None
        usage = usage_from_document(document)
        if usage is not None:
            self.usage = usage
        return document

    # JSON ----------------------------------------------------------------------------------
    def _feed_json(self, data: bytes, end_of_stream: bool) -> bytes:
        self._keep(data)
        if self._model_pattern is not None and not self._overflowed:
            if not end_of_stream:
                return b""
            body = b"".join(self._copy)
            self._parse_usage(body)
            return self._model_pattern.sub(rb"\1" + self._model_replacement, body, count=1)
        if end_of_stream:
            self._parse_usage(b"".join(self._copy) if not self._overflowed else self._tail)
        if self._model_pattern is not None and self._copy:
            # Too large to rename: forward what was held back, unchanged, and pass the rest through.
            held, self._copy = b"".join(self._copy), []
            return held
        return data

    def _keep(self, data: bytes) -> None:
        if self._overflowed:
            self._tail = (self._tail + data)[-_TAIL_BYTES:]
            return
        self._copy_size += len(data)
        self._copy.append(data)
        if self._copy_size > self._copy_limit:
            self._overflowed = True
            joined = b"".join(self._copy)
            self._tail = joined[-_TAIL_BYTES:]
            if self._model_pattern is None:
                self._copy = []

    def _parse_usage(self, body: bytes) -> None:
        if not self._overflowed:
            try:
                self.usage = usage_from_document(json.loads(body))
            except ValueError:
                _log.debug("non-JSON response body: no usage")
            return
        match = _last_match(_USAGE_OBJECT, body)
        if match is None:
            return
        try:
            usage, _ = json.JSONDecoder().raw_decode(body[match.end() - 1 :].decode(errors="replace"))
        except ValueError:
            return
        self.usage = usage_from_document({"usage": usage})
