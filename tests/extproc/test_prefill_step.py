"""A disaggregated request through the lifecycle, sans IO: the picker's prefill step (a RunPrefill
step, then the PrefillDone the servicer hands back) and the sidecar mode's x-prefiller-host-port."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from kvgate.extproc import codec
from kvgate.extproc.actions import RunPrefill, Step
from kvgate.extproc.events import PrefillDone, StreamClosed
from kvgate.extproc.lifecycle import RequestLifecycle, State
from kvgate.extproc.pd_bodies import ASK_FOR_REMOTE_DECODE, PrefillAnswerError, prefill_body, transfer_params
from kvgate.policies.contracts import Keep, PrefillPick, SchedulingResult
from kvgate.policies.framework import SchedulingTrace
from kvgate.policies.types import EndpointView, InferenceRequest, Role
from tests.extproc.fakes import (
    BUFFERED,
    NONE,
    FakePool,
    RecordingMetrics,
    RecordingScheduler,
    completion,
    make_machine,
    removed_headers,
    request_body,
    request_headers,
    set_headers,
    streamed,
)

PREFILL, DECODE = "10.0.0.1:8000", "10.0.0.2:8000"
PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2, 3],
          "remote_engine_id": "e0", "remote_request_id": "cmpl-1", "remote_host": "10.0.0.1",
          "remote_port": 8000, "tp_size": 1}


@dataclasses.dataclass
class SplittingScheduler(RecordingScheduler):
    """Decodes on the decode-role candidates and prefills on the first prefill-role one."""

    def schedule(
        self, request: InferenceRequest, candidates: Sequence[EndpointView], now: float,
        trace: SchedulingTrace | None = None, keep: Keep | None = None,
    ) -> SchedulingResult:
        self.seen.append((request, tuple(c.address for c in candidates)))
        decoders = tuple(c.endpoint for c in candidates if c.endpoint.role is Role.DECODE)
        prefill = next(c.endpoint for c in candidates if c.endpoint.role is Role.PREFILL)
        half = dataclasses.replace(request, request_id=request.request_id + ":prefill", max_tokens=1)
        return SchedulingResult(decoders, "pd", prefill=PrefillPick(half, prefill))


def pd_pool(*, picker_runs_prefill: bool = True) -> FakePool:
    return FakePool("llama", (PREFILL, DECODE), scheduler=SplittingScheduler(),
                    roles={PREFILL: Role.PREFILL, DECODE: Role.DECODE},
                    picker_runs_prefill=picker_runs_prefill)


def one_pass_headers(**kwargs: Any) -> pb.ProcessingRequest:
    return request_headers(mode=BUFFERED, response_mode=NONE, **kwargs)


def pick(machine: RequestLifecycle, body: bytes, **kwargs: Any) -> Sequence[Step]:
    codec.encode_replies(machine.handle(codec.decode(one_pass_headers(**kwargs))))
    return machine.handle(codec.decode(request_body(body, eos=True)))


def test_the_picker_holds_the_body_reply_for_its_prefill_then_sends_the_params_to_decode() -> None:
    pool = pd_pool()
    metrics = RecordingMetrics()
    machine = make_machine(pool, metrics=metrics)
    body = completion(prompt="a long document", stream=True, stream_options={"include_usage": True},
                      max_tokens=64)
    steps = pick(machine, body, extra=[("authorization", "Bearer k"), ("x-request-id", "r-9")])
    [step] = steps
    assert isinstance(step, RunPrefill)
    assert machine.state is State.PREFILL
    assert (step.address, step.path) == (PREFILL, "/v1/completions")
    assert dict(step.headers) == {"authorization": "Bearer k", "x-request-id": "r-9"}
    sent = json.loads(step.body)
    assert sent["kv_transfer_params"] == ASK_FOR_REMOTE_DECODE
    assert (sent["stream"], sent["max_tokens"]) == (False, 1)
    assert "stream_options" not in sent
    assert pool.scheduler.calls[:1] == [("picked", DECODE)]

    [reply] = codec.encode_replies(machine.handle(PrefillDone(PARAMS, 0.25)))
    assert machine.state.value == "upstream"  # (mypy narrowed the state above)
    decoded = json.loads(reply.request_body.response.body_mutation.body)
    assert decoded["kv_transfer_params"] == PARAMS
    assert decoded["stream"] is True  # the client's own request otherwise
    assert decoded["max_tokens"] == 64
    headers = set_headers(reply)
    assert headers["x-gateway-destination-endpoint"] == DECODE
    assert headers["content-length"] == str(len(reply.request_body.response.body_mutation.body))
    assert "x-prefiller-host-port" not in headers
    assert pool.scheduler.first_tokens == [PREFILL]  # the prefill half's bookkeeping ends
    assert ("finished", (PREFILL, True)) in pool.scheduler.calls
    assert ("prefill", True) in metrics.events


def test_a_failed_prefill_releases_the_request_unchanged_to_decode() -> None:
    pool = pd_pool()
    metrics = RecordingMetrics()
    machine = make_machine(pool, metrics=metrics)
    body = completion(prompt="doc", max_tokens=8)
    pick(machine, body)
    [reply] = codec.encode_replies(machine.handle(PrefillDone(None, 20.0, "timed out")))
    mutation = reply.request_body.response.body_mutation
    assert json.loads(mutation.body or body).get("kv_transfer_params") is None
    assert set_headers(reply)["x-gateway-destination-endpoint"] == DECODE
    assert pool.scheduler.failed_endpoints == [PREFILL]
    assert ("finished", (PREFILL, False)) in pool.scheduler.calls
    assert ("prefill", False) in metrics.events


def test_a_prefill_the_endpoint_refused_as_the_requests_own_fault_is_not_counted_against_it() -> None:
    pool = pd_pool()
    machine = make_machine(pool)
    body = completion(prompt="doc", max_tokens=8)
    pick(machine, body)
    [reply] = codec.encode_replies(machine.handle(PrefillDone(None, 0.01, "status 400", request_fault=True)))
    assert set_headers(reply)["x-gateway-destination-endpoint"] == DECODE  # the decode answers it
    assert pool.scheduler.failed_endpoints == []  # (outlier ejection counts these)
    assert ("finished", (PREFILL, False)) in pool.scheduler.calls


def test_a_client_gone_during_the_prefill_ends_the_request_once() -> None:
    pool = pd_pool()
    machine = make_machine(pool)
    pick(machine, completion(prompt="doc"))
    assert machine.handle(StreamClosed(cancelled=True)) == []
    assert machine.state is State.DONE
    assert pool.scheduler.count("finished") == 1  # the decode request; the scheduler ends its prefill


def test_full_duplex_streams_the_decode_body_after_the_prefill() -> None:
    pool = pd_pool()
    machine = make_machine(pool)
    codec.encode_replies(machine.handle(codec.decode(request_headers())))
    [step] = machine.handle(codec.decode(request_body(completion(prompt="doc"), eos=True)))
    assert isinstance(step, RunPrefill)
    out = codec.encode_replies(machine.handle(PrefillDone(PARAMS, 0.1)))
    assert set_headers(out[0])["x-gateway-destination-endpoint"] == DECODE
    assert json.loads(streamed(out))["kv_transfer_params"] == PARAMS


def test_in_sidecar_mode_the_prefill_endpoint_goes_in_x_prefiller_host_port() -> None:
    pool = pd_pool(picker_runs_prefill=False)
    machine = make_machine(pool)
    [reply] = codec.encode_replies(pick(machine, completion(prompt="doc"),
                                        extra=[("x-prefiller-host-port", "6.6.6.6:80")]))
    headers = set_headers(reply)
    assert headers["x-gateway-destination-endpoint"] == DECODE
    assert headers["x-prefiller-host-port"] == PREFILL  # the client's forged value is overwritten
    assert not reply.request_body.response.body_mutation.body  # the sidecar writes the params


def test_a_forged_prefiller_header_is_removed_from_other_requests() -> None:
    machine = make_machine(FakePool("llama", (DECODE,)))
    forged = [("x-prefiller-host-port", "6.6.6.6:80")]
    [reply] = codec.encode_replies(pick(machine, completion(), extra=forged))
    assert "x-prefiller-host-port" in removed_headers(reply)


def test_the_prefill_and_decode_bodies_follow_vllms_proxy() -> None:
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "max_completion_tokens": 50, "min_tokens": 5, "stream_options": {}}).encode()
    sent = json.loads(prefill_body(chat))
    assert (sent["max_tokens"], sent["max_completion_tokens"], sent["stream"]) == (1, 1, False)
    assert "min_tokens" not in sent
    assert "stream_options" not in sent
    assert transfer_params(json.dumps({"kv_transfer_params": PARAMS}).encode()) == PARAMS
    for answer in (b"not json", b"[]", b'{"choices": []}', b'{"kv_transfer_params": {}}'):
        with pytest.raises(PrefillAnswerError):
            transfer_params(answer)
