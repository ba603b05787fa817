"""Runs the prefill half of disaggregated requests (``extproc.prefill_step``): one HTTP POST to the
prefill endpoint per request, over a pooled aiohttp connector, bounded by a timeout. Every failure
(refused, reset, timed out, a non-2xx answer, an answer without ``kv_transfer_params``) becomes a
:class:`PrefillDone` without params: the request then goes to its decode endpoint unchanged."""

from __future__ import annotations

import logging
import time

import aiohttp

from kvgate.extproc.actions import RunPrefill
from kvgate.extproc.events import PrefillDone
from kvgate.extproc.pd_bodies import PrefillAnswerError, transfer_params

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 20.0
"""Below Envoy's ext_proc ``message_timeout`` (30 s): the held body reply must go before Envoy gives up."""
WARN_EVERY_S = 5.0
ANSWER_LIMIT = 4 * 1024 * 1024
"""A prefill answers one token and its params; anything longer is not a prefill answer."""


async def _whole(response: aiohttp.ClientResponse) -> bytes:
    """The answer's body to its end (``read(n)`` would return the first chunk that came), refused
    past :data:`ANSWER_LIMIT`."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > ANSWER_LIMIT:
            raise PrefillAnswerError(f"the prefill answer is over {ANSWER_LIMIT} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class PrefillClient:
    """One per picker process; ``close`` when the server stops."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._warned_at = -WARN_EVERY_S
        self._unreported = 0

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                                  auto_decompress=False)
        return self._session

    async def run(self, step: RunPrefill) -> PrefillDone:
        started = time.perf_counter()
        headers = dict(step.headers)
        headers["content-type"] = "application/json"
        try:
            scheme = "http" if step.tls is None else "https"
            async with self._open().post(f"{scheme}://{step.address}{step.path}", data=step.body,
                                         headers=headers, ssl=step.tls or True) as response:
                if response.status // 100 != 2:
                    # a 4xx is the request's own (the decode endpoint will answer it the same), but
                    # 408 and 429 say the endpoint is slow or full
                    refused = response.status // 100 == 4 and response.status not in (408, 429)
                    return self._failed(started, step, f"status {response.status}", request_fault=refused)
                params = transfer_params(await _whole(response))
        except TimeoutError:
            return self._failed(started, step, "timed out")
        except (aiohttp.ClientError, OSError, PrefillAnswerError) as exc:
            return self._failed(started, step, str(exc) or type(exc).__name__)
        return PrefillDone(params, time.perf_counter() - started)

    def _failed(self, started: float, step: RunPrefill, error: str, *,
                request_fault: bool = False) -> PrefillDone:
        """A failed prefill: a warning (one line per :data:`WARN_EVERY_S` at most, with how many
        others failed meanwhile; none for the request's own fault), and no params."""
        if request_fault:
            _log.debug("prefill at %s refused the request (%s): its decode endpoint answers it", step.address,
                       error)
            return PrefillDone(None, time.perf_counter() - started, error, request_fault=True)
        now = time.monotonic()
        self._unreported += 1
        if now - self._warned_at >= WARN_EVERY_S:
            others = self._unreported - 1
            _log.warning("prefill at %s failed (%s): its decode endpoint prefills instead%s", step.address,
                         error, f" ({others} more prefills failed since the last warning)" if others else "")
            self._warned_at, self._unreported = now, 0
        return PrefillDone(None, time.perf_counter() - started, error)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
