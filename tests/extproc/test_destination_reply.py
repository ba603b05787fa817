"""extproc.destination_reply: the body re-sent in chunks (the destination's headers and metadata are
checked through the lifecycle: tests/extproc/test_lifecycle.py, test_one_pass.py)."""

from __future__ import annotations

from kvgate.extproc.actions import Phase, StreamBody
from kvgate.extproc.destination_reply import streamed_body


def test_the_body_goes_in_chunks_and_only_the_last_ends_the_stream() -> None:
    chunks = streamed_body(b"abcdefg", True, 3)
    assert chunks == [
        StreamBody(Phase.REQUEST, b"abc", False),
        StreamBody(Phase.REQUEST, b"def", False),
        StreamBody(Phase.REQUEST, b"g", True),
    ]
    assert streamed_body(b"abcdef", True, 3)[-1] == StreamBody(Phase.REQUEST, b"def", True)
    assert [c.end_of_stream for c in streamed_body(b"abcdef", False, 3)] == [False, False]  # trailers follow
    assert streamed_body(b"", True, 3) == [StreamBody(Phase.REQUEST, b"", True)]
