from __future__ import annotations

import pytest

from kvgate.gateway.picker.shared_state.codec import (
    BATCH_FIELD,
    FORMAT,
    LEGACY_BATCH_FIELD,
    PrefixInsert,
    SessionPin,
    SharedEvent,
    UnknownFormat,
    decode_batch,
    decode_entry,
    decode_inflight,
    encode_batch,
    encode_inflight,
)
from kvgate.gateway.picker.shared_state.mirror import MirroredState
from kvgate.policies.state import InFlight
from kvgate.proto import shared_state_pb2 as pb


def test_event_batches_round_trip() -> None:
    events: list[SharedEvent] = [
        PrefixInsert("10.0.0.1:8000", (1, 2**64 - 1, 12345678901234567890), 500),
        SessionPin("user-ü", "10.0.0.2:8000"),
        PrefixInsert("10.0.0.3:8000", (), 1),
    ]
    assert decode_batch(encode_batch(events)) == events
    assert decode_inflight(encode_inflight(InFlight(3, 900))) == InFlight(3, 900)


def test_unencodable_events_are_skipped_and_garbage_is_rejected() -> None:
    blob = encode_batch([PrefixInsert("a:1", (-1,), 1), SessionPin("s", "a:1")])
    assert decode_batch(blob) == [SessionPin("s", "a:1")]
    with pytest.raises(ValueError, match="not an event batch"):
        decode_batch(b"\xff\xffjunk")
    with pytest.raises(ValueError, match="not an event batch"):
        decode_batch(encode_batch([PrefixInsert("a:1", (1, 2, 3), 5)])[:-3])


# What kvgate wrote before proto/ (format 0, stream field "b"), captured from that encoder:
# PrefixInsert("10.0.0.1:8000", (1, 2**64 - 1), 4096), SessionPin("user-7", "10.0.0.2:8000").
FORMAT_0_BATCH = bytes.fromhex(
    "500d0031302e302e302e313a383030300010000002000100000000000000ffffffffffffffff"
    "530600757365722d370d0031302e302e302e323a38303030"
)


def test_a_batch_written_by_the_previous_version_is_read() -> None:
    assert decode_entry({b"o": b"old-picker", LEGACY_BATCH_FIELD: FORMAT_0_BATCH}) == [
        PrefixInsert("10.0.0.1:8000", (1, 2**64 - 1), 4096),
        SessionPin("user-7", "10.0.0.2:8000"),
    ]
    assert decode_inflight(b"3 900") == InFlight(3, 900)  # format 0's in-flight text


def test_a_batch_of_a_format_this_version_does_not_know_is_refused_clearly() -> None:
    newer = pb.EventBatch(format=FORMAT + 1)
    newer.events.add().session.session_id = "s"
    with pytest.raises(UnknownFormat, match=f"format {FORMAT + 1}"):
        decode_entry({BATCH_FIELD: newer.SerializeToString()})
    with pytest.raises(UnknownFormat):
        decode_entry({b"o": b"someone", b"x": b"?"})
    assert decode_entry({BATCH_FIELD: encode_batch([SessionPin("s", "a:1")])}) == [SessionPin("s", "a:1")]


def test_in_flight_records_round_trip_including_zero() -> None:
    for value in (InFlight(0, 0), InFlight(1, 0), InFlight(70_000, 2**40)):
        assert decode_inflight(encode_inflight(value)) == value
    with pytest.raises(ValueError, match="not an in-flight record"):
        decode_inflight(b"\xff\xff")


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
