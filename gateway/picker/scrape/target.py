"""One endpoint the scraper follows (:class:`ScrapeTarget`) and its counters (:class:`ScrapeCounters`).

Loop-thread only state of ``gateway.picker.scraper.MetricsScraper``; kept apart so the scraper's
module holds its loops and publishing alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kvgate.gateway.picker.model_server_tls import ClientTls
from kvgate.gateway.picker.scrape.dialects import MetricsDialect
from kvgate.gateway.picker.scrape.http_get import MetricsConnection
from kvgate.policies.types import Endpoint, EndpointView


@dataclass(frozen=True, slots=True)
class ScrapeCounters:
    """Per-endpoint scrape counts, for a later Prometheus export.

    ``errors`` counts failures by kind: ``timeout``, ``connection``, ``status`` (not 200),
    ``page`` (unreadable or not the pool's dialect), ``http`` (any other client error) and
    ``internal`` (a bug of ours, logged).
    """

    successes: int = 0
    failures: int = 0
    delegated: int = 0
    """Rounds skipped because another picker scraped the endpoint (shared scrapes)."""
    consecutive_failures: int = 0
    errors: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    last_error: str = ""


class ScrapeTarget:
    """One endpoint being scraped: its connection, GET in flight, latest view and counters
    (loop-thread only)."""

    __slots__ = (
        "adopted",
        "connection",
        "consecutive_failures",
        "covered_until",
        "delegated",
        "dialect",
        "endpoint",
        "errors",
        "last_error",
        "sent_at",
        "successes",
        "tls",
        "url",
        "view",
    )

    def __init__(
        self, endpoint: Endpoint, dialect: MetricsDialect, url: str, connection: MetricsConnection,
        tls: ClientTls | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.tls = tls
        self.dialect = dialect
        self.url = url
        self.connection = connection
        self.view = EndpointView(endpoint)
        self.adopted = False
        """``view`` came from another picker's batch (``MetricsScraper.adopt``), not this one's scrape."""
        self.covered_until = 0.0
        """Another picker scrapes it until then, as the delegate last said (not asked again before)."""
        self.sent_at: float | None = None
        """When the GET in flight was sent (None: none in flight)."""
        self.successes = 0
        self.delegated = 0
        self.consecutive_failures = 0
        self.errors: dict[str, int] = {}
        self.last_error = ""

    def counters(self) -> ScrapeCounters:
        return ScrapeCounters(
            successes=self.successes,
            failures=sum(self.errors.values()),
            delegated=self.delegated,
            consecutive_failures=self.consecutive_failures,
            errors=MappingProxyType(dict(self.errors)),
            last_error=self.last_error,
        )


def checked_endpoint(endpoint: Endpoint) -> Endpoint:
    host, sep, port = endpoint.address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"endpoint address {endpoint.address!r} is not host:port")
    return endpoint


def metrics_url(endpoint: Endpoint, path: str, port: int | None = None, *, https: bool = False) -> str:
    """``http://host:port/path`` for an endpoint (IPv6 hosts bracketed; ``port`` overrides its port;
    ``https``: its model server serves TLS)."""
    host = endpoint.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{'https' if https else 'http'}://{host}:{endpoint.port if port is None else port}{path}"
