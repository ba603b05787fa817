"""A rule's ``sessionPersistence`` (GEP-1619) as the picker's session spec (``extproc.session_persistence``).

The picker keeps sessions for InferencePool backends: a Cookie session (the default type) is named
by a cookie the picker sets on a session's first response (``kvgate-session`` unless
``sessionName`` says otherwise; a Permanent cookie lives ``absoluteTimeout``, a Session cookie as
long as the browser's session), a Header session by a header the client sends again
(``x-session-id``, kvgate's own session header, unless ``sessionName`` says otherwise). The pins
last until the picker's ``--max-session-pins`` bound evicts the least recent: ``idleTimeout`` is not
applied (warned).
"""

from __future__ import annotations

from kvgate.extproc.names import SESSION_HEADER
from kvgate.extproc.session_persistence import SessionSpec
from kvgate.gateway.controlplane.resources.gateway_api import SessionPersistence

DEFAULT_COOKIE = "kvgate-session"


def session_spec(persistence: SessionPersistence, warnings: list[str], owner: str) -> SessionSpec:
    if persistence.idle_timeout is not None:
        warnings.append(f"{owner}: sessionPersistence idleTimeout is not applied (a session's pin lasts "
                        "until --max-session-pins evicts the least recent)")
    if persistence.type == "Header":
        return SessionSpec("header", persistence.session_name or SESSION_HEADER)
    cookie = persistence.cookie_config
    permanent = cookie is not None and cookie.lifetime_type == "Permanent"
    seconds = persistence.absolute_seconds
    max_age = round(seconds) if permanent and seconds is not None else None
    return SessionSpec("cookie", persistence.session_name or DEFAULT_COOKIE, max_age)
