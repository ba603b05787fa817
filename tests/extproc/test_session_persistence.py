"""Session persistence's sans-IO part: the spec a route passes the picker, and each request's session."""

from __future__ import annotations

import pytest

from kvgate.extproc.session_persistence import Session, SessionSpec, cookie_value, session_of


@pytest.mark.parametrize("spec", [
    SessionSpec("cookie", "kvgate-session"), SessionSpec("cookie", "sid", 3600),
    SessionSpec("header", "x-chat"),
])
def test_a_spec_survives_its_metadata_value(spec: SessionSpec) -> None:
    assert SessionSpec.decode(spec.encode()) == spec


@pytest.mark.parametrize("text", ["", "cookie", "cookie;name=", "query;name=a", ";;;"])
def test_a_value_this_picker_cannot_read_is_no_session(text: str) -> None:
    assert SessionSpec.decode(text) is None


def test_cookies_are_read_from_the_cookie_header() -> None:
    assert cookie_value("a=1; kvgate-session=abc; b=2", "kvgate-session") == "abc"
    assert cookie_value('kvgate-session="quoted"', "kvgate-session") == "quoted"
    assert cookie_value("kvgate-session-old=x; other=y", "kvgate-session") is None
    assert cookie_value("", "kvgate-session") is None


def test_a_request_naming_no_session_starts_one_and_is_told_it() -> None:
    cookie = session_of({}, SessionSpec("cookie", "sid", 60))
    assert cookie is not None
    assert cookie.set_header == ("set-cookie", f"sid={cookie.id}; Path=/; HttpOnly; Max-Age=60")
    browser = session_of({}, SessionSpec("cookie", "sid"))
    assert browser is not None
    assert browser.set_header == ("set-cookie", f"sid={browser.id}; Path=/; HttpOnly")
    assert browser.id != cookie.id
    header = session_of({}, SessionSpec("header", "X-Chat"))
    assert header is not None
    assert header.set_header == ("x-chat", header.id)


def test_a_request_naming_its_session_keeps_it() -> None:
    assert session_of({"cookie": "sid=abc"}, SessionSpec("cookie", "sid")) == Session("abc")
    assert session_of({"x-chat": "c1"}, SessionSpec("header", "X-Chat")) == Session("c1")
    assert session_of({"x-session-id": "s"}, None) == Session("s")  # kvgate's own header, no rule
    assert session_of({}, None) is None
