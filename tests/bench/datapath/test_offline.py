"""bench.datapath.offline: the replay runs kvgate's message sequences through the real lifecycle."""

from __future__ import annotations

from kvgate.bench.datapath.offline import REQUEST_PATH, STAGES, replay, request_path_stages


def test_each_sequence_gets_its_replies() -> None:
    # GIE's full duplex: headers (held) + the streamed body, then response headers and body
    assert replay(20, 1024, endpoints=4)[1] == 5
    assert replay(20, 1024, endpoints=4, one_pass=True)[1] == 3  # headers, body, response headers
    assert replay(20, 1024, endpoints=4, lean=True)[1] == 2  # headers, body: the response skipped



def test_the_request_path_stages_cover_each_step_and_add_up_to_the_path() -> None:
    stages = request_path_stages(30, 1024, endpoints=4, cold_mb=0)
    assert set(stages) == {*STAGES, REQUEST_PATH}
    steps = sum(
        stages[f"{part}: {step}"]
        for part in ("headers", "body")
        for step in ("decode", "lifecycle", "encode")
    )
    # medians of parts need not add up exactly; the path is the steps on Envoy's side of the reply
    assert 0.5 * steps <= stages[REQUEST_PATH] <= 2 * steps
    assert all(value > 0 for value in stages.values())
