"""A rule's sessionPersistence as the picker's session spec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.extproc.session_persistence import SessionSpec
from kvgate.gateway.controlplane.resources.gateway_api import SessionPersistence
from kvgate.gateway.controlplane.translate.sessions import session_spec


def spec(fields: dict[str, object], warnings: list[str] | None = None) -> SessionSpec:
    return session_spec(SessionPersistence.model_validate(fields), [] if warnings is None else warnings, "r")


def test_the_gateway_apis_defaults_and_kvgates_names() -> None:
    assert spec({}) == SessionSpec("cookie", "kvgate-session")  # Cookie is the default type
    assert spec({"type": "Header"}) == SessionSpec("header", "x-session-id")  # kvgate's own header
    assert spec({"type": "Header", "sessionName": "X-Chat"}) == SessionSpec("header", "X-Chat")


def test_only_a_permanent_cookie_has_a_max_age() -> None:
    permanent: dict[str, object] = {"sessionName": "s", "absoluteTimeout": "2h",
                                    "cookieConfig": {"lifetimeType": "Permanent"}}
    assert spec(permanent) == SessionSpec("cookie", "s", 7200)
    assert spec({"sessionName": "s", "absoluteTimeout": "2h"}) == SessionSpec("cookie", "s")
    with pytest.raises(ValidationError, match="AbsoluteTimeout"):
        SessionPersistence.model_validate({"cookieConfig": {"lifetimeType": "Permanent"}})


def test_an_idle_timeout_is_warned_not_applied() -> None:
    warnings: list[str] = []
    assert spec({"idleTimeout": "10m"}, warnings) == SessionSpec("cookie", "kvgate-session")
    assert len(warnings) == 1
    assert "idleTimeout" in warnings[0]
