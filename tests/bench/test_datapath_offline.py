"""bench.datapath_offline: the replay runs kvgate's message sequences through the real lifecycle."""

from __future__ import annotations

from bench.datapath_offline import replay


def test_each_sequence_gets_its_replies() -> None:
    # GIE's full duplex: headers (held) + the streamed body, then response headers and body
    assert replay(20, 1024, endpoints=4)[1] == 5
    assert replay(20, 1024, endpoints=4, one_pass=True)[1] == 3  # headers, body, response headers
    assert replay(20, 1024, endpoints=4, lean=True)[1] == 2  # headers, body: the response skipped

