from __future__ import annotations

import pytest

from gateway.shared_state.codec import (
    PrefixInsert,
    SessionPin,
    SharedEvent,
    decode_batch,
    decode_inflight,
    encode_batch,
    encode_inflight,
)
from gateway.shared_state.mirror import MirroredState
from policies.state import InFlight


def test_event_batches_round_trip() -> None:
    events: list[SharedEvent] = [
        PrefixInsert("10.0.0.1:8000", (1, 2**64 - 1, 12345678901234567890), 500),
        SessionPin("user-ü", "10.0.0.2:8000"),
        PrefixInsert("10.0.0.3:8000", (), 1),
    ]
    assert decode_batch(encode_batch(events)) == events
    assert decode_inflight(encode_inflight(InFlight(3, 900))) == InFlight(3, 900)


def test_unencodable_events_are_skipped_and_garbage_is_rejected() -> None:
    too_long = SessionPin("x" * 70_000, "a:1")
    blob = encode_batch([PrefixInsert("a:1", (-1,), 1), too_long, SessionPin("s", "a:1")])
    assert decode_batch(blob) == [SessionPin("s", "a:1")]
    with pytest.raises(ValueError, match="unknown"):
        decode_batch(b"Zjunk")
    with pytest.raises(ValueError, match="truncated"):
        decode_batch(encode_batch([PrefixInsert("a:1", (1, 2, 3), 5)])[:-3])


def test_mirror_sums_peers_in_flight_and_counts_exactly_its_own() -> None:
    state = MirroredState()
    state.inflight_add("r1", "a:1", 100)
    state.inflight_add("r2", "a:1", 50)
    state.set_peer_inflight([{"a:1": InFlight(2, 10), "b:1": InFlight(1, 5)}, {"b:1": InFlight(1, 1)}])
    assert state.inflight("a:1") == InFlight(4, 160)
    assert state.inflight("b:1") == InFlight(2, 6)
    state.inflight_move("r1", "b:1")
    assert state.inflight("a:1") == InFlight(3, 60)
    assert state.inflight("b:1") == InFlight(3, 106)
    assert state.own_inflight() == {"a:1": InFlight(1, 50), "b:1": InFlight(1, 100)}
    state.inflight_remove("r1")
    state.inflight_remove("r1")
    state.inflight_remove("r2")
    state.set_peer_inflight([])
    assert dict(state.inflight_by_endpoint()) == {}


def test_mirror_queues_what_peers_need_and_drops_when_full() -> None:
    state = MirroredState(outbox_limit=2)
    state.prefix_insert("a:1", [1, 2, 3], 100)
    state.session_set("s1", "a:1")
    state.session_set("s1", "a:1")  # unchanged: not shared again
    state.prefix_insert("b:1", [1, 2], 100)  # outbox full
    assert state.dropped == 1
    assert state.take_outbox(10) == [PrefixInsert("a:1", (1, 2, 3), 100), SessionPin("s1", "a:1")]
    assert state.prefix_match([1, 2, 3]) == {"a:1": 3, "b:1": 2}
    peer = MirroredState()
    peer.apply_peer_events([PrefixInsert("a:1", (1, 2, 3), 100), SessionPin("s1", "a:1")])
    assert peer.prefix_match([1, 2, 9]) == {"a:1": 2}
    assert peer.session_get("s1") == "a:1"
    assert peer.outbox_size == 0  # peers' events are not re-shared


def test_forget_endpoint_drops_peers_counts_too() -> None:
    state = MirroredState()
    state.inflight_add("r1", "a:1", 10)
    state.set_peer_inflight([{"a:1": InFlight(1, 1)}])
    state.forget_endpoint("a:1")
    assert state.inflight("a:1") == InFlight()
    state.inflight_remove("r1")
    assert dict(state.inflight_by_endpoint()) == {}
