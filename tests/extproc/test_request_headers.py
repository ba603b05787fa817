"""extproc.request_headers: what the picker keeps of a request's headers, what it strips, the API,
the declared length."""

from __future__ import annotations

import pytest

from kvgate.extproc.request_headers import MAX_HEADER_BYTES, MAX_HEADERS, model_header, read_request_headers
from kvgate.policies.errors import HeadersTooLargeError, PayloadTooLargeError, UnknownPathError
from kvgate.policies.types import ApiKind


def test_system_owned_headers_are_set_aside_once_each_in_order_and_the_rest_kept() -> None:
    read = read_request_headers(
        (
            (":path", "/v1/chat/completions?x=1"),
            ("X-Kvgate-Outcome", "forged"),
            ("x-gateway-destination-endpoint", "6.6.6.6:1"),
            ("x-kvgate-outcome", "again"),
            ("Content-Type", "application/json"),
            ("x-session-id", "a"),
            ("x-session-id", "b"),
        )
    )
    assert read.strip == ("x-kvgate-outcome", "x-gateway-destination-endpoint")
    assert dict(read.headers) == {
        ":path": "/v1/chat/completions?x=1", "content-type": "application/json", "x-session-id": "b",
    }
    assert read.api is ApiKind.CHAT_COMPLETIONS


def test_the_declared_length_is_refused_only_over_the_limit() -> None:
    read = read_request_headers(((":path", "/v1/completions"), ("content-length", "1000")))
    read.refuse(1000, frozenset())
    with pytest.raises(PayloadTooLargeError, match="limit of 999 bytes"):
        read.refuse(999, frozenset())
    read_request_headers(((":path", "/v1/completions"), ("content-length", "not a number"))).refuse(
        0, frozenset())
    assert read_request_headers(()).api is ApiKind.OTHER


def test_the_model_header_is_found_by_any_case_or_is_empty() -> None:
    assert model_header((("X-Gateway-Model-Name", "llama"),)) == "llama"
    assert model_header((("x-other", "1"),)) == ""


def test_a_path_outside_the_inference_api_is_refused_unless_the_pool_opts_it_in() -> None:
    read = read_request_headers(((":method", "POST"), (":path", "/v1/load_lora_adapter")))
    with pytest.raises(UnknownPathError, match=r"Invalid URL \(POST /v1/load_lora_adapter\)"):
        read.refuse(1000, frozenset())
    read.refuse(1000, frozenset({"/v1/load_lora_adapter"}))


def test_headers_that_leave_no_room_for_the_gateways_own_are_refused_431() -> None:
    base = ((":method", "POST"), (":path", "/v1/completions"))
    many = base + tuple((f"x-{i}", "v") for i in range(MAX_HEADERS - len(base)))
    read_request_headers(many).refuse(1000, frozenset())
    with pytest.raises(HeadersTooLargeError, match="at most 92") as caught:
        read_request_headers((*many, ("x-one-more", "v"))).refuse(1000, frozenset())
    assert caught.value.status == 431
    with pytest.raises(HeadersTooLargeError, match="bytes"):
        read_request_headers((*base, ("x-big", "b" * MAX_HEADER_BYTES))).refuse(1000, frozenset())


def test_llm_ds_header_names_are_read_as_the_inference_extensions_newest_first() -> None:
    """llm-d's router renamed the request headers (x-llm-d-inference-*, then x-llm-d-router-*),
    keeping the older names as aliases: the newest given wins, as in its router."""
    read = read_request_headers((
        (":path", "/v1/completions"),
        ("x-gateway-inference-objective", "oldest"),
        ("X-LLM-D-Inference-Objective", "newer"),
        ("x-llm-d-inference-fairness-id", "tenant-a"),
        ("x-llm-d-router-slo-ttft-ms", "250"),
        ("x-llm-d-slo-ttft-ms", "900"),
        ("x-llm-d-slo-tpot-ms", "40"),
        ("x-llm-d-model-name-rewrite", "llama-lora"),
        ("x-llm-d-router-model-name-rewrite", "llama-lora-2"),
    ))
    headers = read.headers
    assert headers["x-gateway-inference-objective"] == "newer"
    assert headers["x-gateway-inference-fairness-id"] == "tenant-a"
    assert (headers["x-slo-ttft-ms"], headers["x-slo-tpot-ms"]) == ("250", "40")
    assert headers["x-gateway-model-name-rewrite"] == "llama-lora-2"
    # the picker's own input is not forwarded, under any of its names
    assert set(read.strip) == {"x-gateway-model-name-rewrite", "x-llm-d-model-name-rewrite",
                               "x-llm-d-router-model-name-rewrite"}
    plain = read_request_headers(((":path", "/v1/completions"), ("x-gateway-inference-objective", "chat")))
    assert plain.headers["x-gateway-inference-objective"] == "chat"
    assert plain.strip == ()
