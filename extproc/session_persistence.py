"""Gateway API session persistence (an HTTPRoute rule's ``sessionPersistence``, GEP-1619) for
InferencePool backends: the session the picker pins a request to, named by a cookie or a header.

The picker already keeps session pins (``x-session-id``, the profile's session scorer and recorder:
a session's requests go back to the replica that served it while that replica is fit). A rule's
``sessionPersistence`` names the session differently, per rule: the control plane passes it to the
picker as the stream's gRPC initial metadata ``x-kvgate-session`` (``cookie;name=N[;max-age=S]`` or
``header;name=N``), and for a request that names no session yet the picker starts one: a new id, sent
back in the response (``Set-Cookie: N=ID; Path=/; HttpOnly`` with ``Max-Age`` for a Permanent
cookie, or the header ``N: ID`` for the client to send again), and pinned to the replica it picked.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kvgate.extproc import names


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """How a rule's requests name their session: a cookie or a header called ``name``."""

    kind: Literal["cookie", "header"]
    name: str
    max_age_s: int | None = None
    """A Permanent cookie's lifetime (``absoluteTimeout``); None: a browser session's cookie."""

    def encode(self) -> str:
        """The ``x-kvgate-session`` metadata value naming this spec."""
        tail = f";max-age={self.max_age_s}" if self.max_age_s is not None else ""
        return f"{self.kind};name={self.name}{tail}"

    @staticmethod
    def decode(text: str) -> SessionSpec | None:
        """The spec of a metadata value; None for one this picker cannot read (no session then)."""
        kind, *fields = text.split(";")
        values = dict(field.partition("=")[::2] for field in fields)
        name = values.get("name", "")
        if kind not in ("cookie", "header") or not name:
            return None
        age = values.get("max-age", "")
        return SessionSpec(kind, name, int(age) if age.isdigit() else None)  # type: ignore[arg-type]


def cookie_value(header: str, name: str) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` header (``a=1; b=2``), or None."""
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip('"') or None
    return None


@dataclass(frozen=True, slots=True)
class Session:
    """A request's session: its id, and the response header that tells the client a new one."""

    id: str
    set_header: tuple[str, str] | None = None


def session_of(headers: Mapping[str, str], spec: SessionSpec | None) -> Session | None:
    """The session a request names under ``spec`` (a new one when it names none); without a spec,
    the ``x-session-id`` header's, if any."""
    if spec is None:
        given = headers.get(names.SESSION_HEADER)
        return Session(given) if given else None
    if spec.kind == "header":
        given = headers.get(spec.name.lower())
    else:
        given = cookie_value(headers.get("cookie", ""), spec.name)
    if given:
        return Session(given)
    new = secrets.token_hex(16)
    if spec.kind == "header":
        return Session(new, (spec.name.lower(), new))
    age = f"; Max-Age={spec.max_age_s}" if spec.max_age_s is not None else ""
    return Session(new, ("set-cookie", f"{spec.name}={new}; Path=/; HttpOnly{age}"))
