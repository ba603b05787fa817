"""Outlier ejection: endpoints that keep failing requests are left out of picking for a while.

A replica can fail requests while its /metrics page still answers (a crashed engine behind a live
HTTP server answering 500, a listener that refuses connections while the metrics port lives). The
scraper cannot see that; the requests can. The request lifecycle reports each failure it sees
(``Scheduler.on_endpoint_failed``: a 5xx from the replica, or the pick failing over to a fallback
endpoint) and each success (``on_finished`` with ok). ``consecutive`` failures in a row eject the
endpoint for ``base_ejection_s``, doubled on each further ejection up to ``max_ejection_s``; when the
time is up it is picked again, and a success there resets its count and its back-off. Ejection never
leaves a pool empty: if every candidate is ejected, all are candidates (routing degrades, the gateway
keeps serving). Envoy ejects on its own as well (``outlier_detection`` on kvgate's pool clusters),
so a request the picker already sent to a failing replica skips it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OutlierSettings:
    consecutive: int = 5
    base_ejection_s: float = 5.0
    max_ejection_s: float = 60.0


@dataclass(slots=True)
class _Record:
    failures: int = 0
    ejections: int = 0
    until: float = 0.0


@dataclass
class OutlierTracker:
    """Per-endpoint failure counts and ejections of one pool (one picker process). Not thread-safe."""

    settings: OutlierSettings = field(default_factory=OutlierSettings)
    _records: dict[str, _Record] = field(default_factory=dict)
    _ejected_until: float = 0.0  # the latest end of any ejection: nothing is ejected after it
    _ejected_set: frozenset[str] = frozenset()
    _set_expires: float = -math.inf  # the earliest end of an ejection in ``_ejected_set``

    def failed(self, address: str, now: float) -> bool:
        """Count a failure; True when it ejects the endpoint now."""
        record = self._records.setdefault(address, _Record())
        if record.until > now:
            return False  # already ejected: requests picked before the ejection are still ending
        record.failures += 1
        if record.failures < self.settings.consecutive:
            return False
        record.ejections += 1
        record.failures = 0
        seconds = min(
            self.settings.max_ejection_s, self.settings.base_ejection_s * 2 ** (record.ejections - 1)
        )
        record.until = now + seconds
        self._ejected_until = max(self._ejected_until, record.until)
        self._set_expires = -math.inf  # the set changed
        return True

    def succeeded(self, address: str) -> None:
        """A request there went well: its failure count and back-off start again."""
        record = self._records.get(address)
        if record is not None and record.until == 0.0:
            del self._records[address]
        elif record is not None:
            record.failures = 0
            record.ejections = 0

    def ejected(self, address: str, now: float) -> bool:
        if now >= self._ejected_until:
            return False
        record = self._records.get(address)
        return record is not None and record.until > now

    def ejections(self, address: str) -> int:
        """How many times in a row ``address`` was ejected (0 once a success reset it)."""
        record = self._records.get(address)
        return 0 if record is None else record.ejections

    def any_ejected(self, now: float) -> bool:
        """Cheap check for the hot path: False means no endpoint is ejected at ``now``."""
        return now < self._ejected_until

    def ejected_at(self, now: float) -> frozenset[str]:
        """The endpoints ejected at ``now``: the same object until an ejection begins or ends."""
        if now >= self._ejected_until:
            return frozenset()
        if now >= self._set_expires:
            live = {address: r.until for address, r in self._records.items() if r.until > now}
            if frozenset(live) != self._ejected_set:
                self._ejected_set = frozenset(live)
            self._set_expires = min(live.values(), default=math.inf)
        return self._ejected_set

    def forget(self, address: str) -> None:
        self._records.pop(address, None)
        self._set_expires = -math.inf
