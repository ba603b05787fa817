"""Which ``model`` names the gateway accepts (``extproc.model_names``), in the parser and the
body-based router; and how names the pool does not know are labelled in the metrics."""

from __future__ import annotations

import json

import pytest

from kvgate.extproc.actions import Immediate
from kvgate.extproc.bbr import BodyBasedRouter
from kvgate.extproc.events import RequestBodyChunk, RequestHeaders
from kvgate.extproc.model_names import MAX_MODEL_NAME_CHARS, check_model_name
from kvgate.extproc.openai_request import parse_request_body
from kvgate.extproc.ports import OTHER_MODELS, RequestLabels
from kvgate.policies.errors import InvalidModelNameError
from kvgate.policies.types import ApiKind
from tests.extproc.fakes import (
    RecordingMetrics,
    completion,
    feed,
    make_machine,
    make_pool,
    request_body,
    request_headers,
)

ACCEPTED = [
    "meta-llama/Llama-3.1-8B-Instruct",  # a Hugging Face id
    "/models/llama-3.1-8b",  # vLLM's default served name: the path it loaded
    "ft:gpt-4o-mini:acme:support:9x7Yz",  # OpenAI's fine-tune names
    "llama3.2:8b-instruct-q4_K_M",  # Ollama's tags
    "sql-lora@v2+fast=1~b",
    "模型-lora",  # letters of any script
    "m" * MAX_MODEL_NAME_CHARS,
]
REFUSED = [
    "a\u0000b\r",  # broke the metrics page
    "a\nb",  # broke the header mutation (503)
    "m" * (MAX_MODEL_NAME_CHARS + 1),
    "m" * 100_000,
    "two words",
    'quote"d',
    "back\\slash",
    "tab\tbed",
    "bell\u0007",
    "zero\u200bwidth",  # a format character: invisible in a label
]


@pytest.mark.parametrize("model", ACCEPTED)
def test_real_model_and_adapter_names_are_accepted(model: str) -> None:
    check_model_name(model)
    body = json.dumps({"model": model, "prompt": "p"}).encode()
    assert parse_request_body(ApiKind.COMPLETIONS, body).model == model


@pytest.mark.parametrize("model", REFUSED)
def test_names_no_server_has_are_refused_400(model: str) -> None:
    with pytest.raises(InvalidModelNameError) as caught:
        parse_request_body(ApiKind.COMPLETIONS, json.dumps({"model": model, "prompt": "p"}).encode())
    assert caught.value.status == 400
    assert caught.value.code == "invalid_model_name"
    assert len(caught.value.message) < 200  # the name itself is not echoed back


@pytest.mark.parametrize("model", REFUSED)
def test_the_body_based_router_answers_400_before_the_name_reaches_a_header(model: str) -> None:
    router = BodyBasedRouter()
    router.handle(RequestHeaders(()))
    [reply] = router.handle(RequestBodyChunk(json.dumps({"model": model}).encode(), end_of_stream=True))
    assert isinstance(reply, Immediate)
    assert reply.status == 400
    assert json.loads(reply.body)["error"]["code"] == "invalid_model_name"
    assert router.model is None


def _route(known: bool | None, model: str) -> RequestLabels:
    metrics = RecordingMetrics()
    machine = make_machine(make_pool("10.0.0.1:8000", undeclared=known), metrics=metrics)
    feed(machine, [request_headers(), request_body(completion(model=model), eos=True)])
    [labels] = [labels for kind, labels in metrics.events if kind == "picked"]
    assert isinstance(labels, RequestLabels)
    return labels


def test_a_name_the_pool_knows_is_its_own_label_and_others_share_one() -> None:
    assert _route(True, "known-model") == RequestLabels("llama", "known-model", "known-model")
    assert _route(None, "random-7f3a") == RequestLabels("llama", OTHER_MODELS, OTHER_MODELS)


def test_a_name_every_replica_says_it_does_not_serve_is_the_gateways_404() -> None:
    metrics = RecordingMetrics()
    machine = make_machine(make_pool("10.0.0.1:8000", undeclared=False), metrics=metrics)
    [reply] = feed(machine, [request_headers(), request_body(completion(model="nope"), eos=True)])
    assert reply.immediate_response.status.code == 404
    assert json.loads(reply.immediate_response.body)["error"]["code"] == "model_not_found"
    assert ("error", "model_not_found") in metrics.events
    assert not [kind for kind, _ in metrics.events if kind == "picked"]
