"""Outcome reports: what became of requests whose response the picker did not watch.

With ``skip_unread_responses`` a request whose response nothing needs skips the response-headers
round trip: one message fewer each way, and the picker no longer sees the status, the endpoint that
served (Envoy may have gone on to a fallback) or a non-streamed request's first token. Where kvgate
writes Envoy's configuration it can have Envoy tell it afterwards, off the request path: the picker
marks such a request with :data:`~extproc.names.OUTCOME_HEADER` (its pool and metric labels), and an
HTTP gRPC access log (``envoy.access_loggers.http_grpc``, filtered to requests with that header)
streams their entries in batches to the picker's gRPC server (``AccessLogService``). Each entry then
counts as the response headers would have: a 5xx or a fallback counts against the endpoint that
failed (``policies.outliers``), a response counts for the one that served, a fallback is counted in
the metrics, and a non-streamed request's time to its response headers is its first token.

The request itself ended in the picker when Envoy closed its stream (in-flight counts are not
held up by the report); only the outcome arrives later, about ``buffer_flush_interval`` later.
Sans-IO: :func:`outcome_of` reads one entry, :class:`OutcomeReports` applies it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import quote, unquote

from envoy.data.accesslog.v3 import accesslog_pb2

from kvgate.extproc import names
from kvgate.extproc.ports import Clock, PoolDirectory, RequestLabels, RequestMetrics
from kvgate.policies.errors import KvgateError

_log = logging.getLogger(__name__)
REPORT_RESULTS = ("applied", "unknown_pool", "unreadable")


def outcome_header(labels: RequestLabels, *, streamed: bool) -> str:
    """The value of :data:`~extproc.names.OUTCOME_HEADER` for a request (once per skipped request:
    names that need no escaping, the usual case, are checked once, joined, not run through ``quote``)."""
    parts = (labels.pool, labels.model, labels.target_model, "s" if streamed else "n")
    joined = " ".join(parts)
    if _plain(joined.replace(" ", "", 3)):  # only the 3 separators: no part needs escaping
        return joined
    return " ".join(part if _plain(part) else quote(part, safe="/:@") for part in parts)


def _plain(part: str) -> bool:
    return part.isascii() and part.isprintable() and " " not in part and "%" not in part


@dataclass(frozen=True, slots=True)
class Outcome:
    """One skipped request's outcome as Envoy logged it."""

    labels: RequestLabels
    streamed: bool
    picked: str
    """The endpoint the picker chose (the destination header)."""
    served: str | None
    """The upstream that answered last (``ip:port``); None when no connection was made."""
    status: int
    """The response's status (0: none, e.g. the client went away first)."""
    first_byte_s: float | None
    """Time from the request's first byte to the upstream's first response byte."""


def outcome_of(entry: accesslog_pb2.HTTPAccessLogEntry) -> Outcome | None:
    """The outcome an access-log entry reports; None for an entry without the outcome header."""
    headers = entry.request.request_headers
    value = headers.get(names.OUTCOME_HEADER)
    picked = headers.get(names.DESTINATION_HEADER, "").split(",", 1)[0].strip()
    if not value or not picked:
        return None
    parts = value.split(" ")
    if len(parts) != 4:
        return None
    pool, model, target, mode = (unquote(part) for part in parts)
    common = entry.common_properties
    served: str | None = None
    if common.HasField("upstream_remote_address"):
        socket = common.upstream_remote_address.socket_address
        if socket.address:
            served = f"{socket.address}:{socket.port_value}"
    first_byte = (
        common.time_to_first_upstream_rx_byte.ToNanoseconds() / 1e9
        if common.HasField("time_to_first_upstream_rx_byte") else None
    )
    return Outcome(
        labels=RequestLabels(pool=pool, model=model, target_model=target),
        streamed=mode == "s",
        picked=picked,
        served=served,
        status=entry.response.response_code.value,
        first_byte_s=first_byte,
    )


class OutcomeReports:
    """Applies reported outcomes to the pools' schedulers and the request metrics."""

    def __init__(self, directory: PoolDirectory, *, clock: Clock, metrics: RequestMetrics) -> None:
        self._directory = directory
        self._clock = clock
        self._metrics = metrics
        self.counts: dict[str, int] = dict.fromkeys(REPORT_RESULTS, 0)
        """Entries by what became of them (exported as ``kvgate_outcome_reports_total{result}``)."""

    def apply_entry(self, entry: accesslog_pb2.HTTPAccessLogEntry) -> None:
        """Apply one access-log entry (one without a readable outcome is counted and dropped)."""
        outcome = outcome_of(entry)
        if outcome is None:
            self.counts["unreadable"] += 1
            return
        self.apply(outcome)

    def apply(self, outcome: Outcome) -> None:
        try:
            pool = self._directory.resolve(outcome.labels.pool)
        except KvgateError:
            self.counts["unknown_pool"] += 1  # the pool went away since: nothing to count against
            return
        scheduler = pool.scheduler
        now = self._clock.now()
        served = outcome.served
        try:
            if served is not None and served != outcome.picked:  # Envoy went on past the pick
                scheduler.on_endpoint_outcome(outcome.picked, ok=False, now=now)
                self._metrics.served_by_fallback(outcome.labels)
            if outcome.status > 0:  # 0: no response (the client left first): nobody to blame
                scheduler.on_endpoint_outcome(served or outcome.picked, ok=outcome.status < 500, now=now)
        except Exception:
            _log.exception("scheduler on_endpoint_outcome failed")
        if 0 < outcome.status < 500 and not outcome.streamed and outcome.first_byte_s is not None:
            self._metrics.first_token(outcome.labels, outcome.first_byte_s)
        self.counts["applied"] += 1
