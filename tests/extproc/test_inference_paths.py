"""Which paths the picker serves (``extproc.inference_paths``)."""

from __future__ import annotations

import pytest

from kvgate.extproc.inference_paths import INFERENCE_PATHS, check_path, route_of, served, stored_response_of
from kvgate.policies.errors import MethodNotAllowedError, UnknownPathError

ADMIN = [
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/sleep",
    "/wake_up",
    "/reset_prefix_cache",
    "/collective_rpc",
    "/start_profile",
    "/metrics",
    "/server_info",
    "/v1/load_lora_adapter?then=/v1/completions",
    "/v1/completions/../load_lora_adapter",
    "/v1/models/../load_lora_adapter",
    "/v1/completions/./../../v1/load_lora_adapter",
    "/v1/load%5Flora_adapter",
    "/",
    "",
]


@pytest.mark.parametrize("path", [*INFERENCE_PATHS, "/v1/chat/completions/", "/v1/completions?stream=1",
                                  "/llama/v1/chat/completions", "/v1/models/meta-llama/Llama-3.1-8B"])
def test_the_inference_api_is_served(path: str) -> None:
    assert served(route_of(path))


@pytest.mark.parametrize("path", ADMIN)
def test_the_admin_api_and_dot_segments_are_not(path: str) -> None:
    assert not served(route_of(path))
    with pytest.raises(UnknownPathError) as caught:
        check_path("POST", path)
    assert caught.value.status == 404


def test_a_pool_opts_paths_in_and_a_long_path_is_cut_in_the_message() -> None:
    assert served("/v1/load_lora_adapter", frozenset({"/v1/load_lora_adapter"}))
    with pytest.raises(UnknownPathError) as caught:
        check_path("GET", "/x" * 1000)
    assert len(caught.value.message) < 250


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/v1/completions", "POST"),
    ("PUT", "/llama/v1/chat/completions?x=1", "POST"),
    ("DELETE", "/tokenize", "POST"),
    ("POST", "/v1/models", "GET, HEAD"),
    ("DELETE", "/v1/models/meta-llama/Llama-3.1-8B", "GET, HEAD"),
])
def test_a_served_path_with_a_method_it_does_not_take_is_405_naming_the_one_it_does(
    method: str, path: str, allow: str,
) -> None:
    with pytest.raises(MethodNotAllowedError) as caught:
        check_path(method, path)
    assert caught.value.status == 405
    assert caught.value.headers == {"allow": allow}
    assert caught.value.message.startswith(f"Method Not Allowed ({method} ")


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/completions"), ("GET", "/v1/models"), ("HEAD", "/v1/models/m"),
    ("OPTIONS", "/v1/chat/completions"), ("OPTIONS", "/v1/models"),  # a CORS preflight: the server's
])
def test_the_methods_the_servers_take_pass(method: str, path: str) -> None:
    check_path(method, path)


def test_any_method_passes_on_a_pools_own_paths_and_an_unknown_path_stays_404() -> None:
    extra = frozenset({"/v1/load_lora_adapter"})
    check_path("DELETE", "/v1/load_lora_adapter", extra)
    with pytest.raises(UnknownPathError):
        check_path("GET", "/v1/unload_lora_adapter", extra)


@pytest.mark.parametrize(("path", "named"), [
    ("/v1/responses/resp_1", "resp_1"),
    ("/v1/responses/resp_1/", "resp_1"),
    ("/v1/responses/resp_1/cancel", "resp_1"),
    ("/llama/v1/responses/resp_1?stream=false", "resp_1"),
    ("/v1/responses", None),
    ("/v1/responses/resp_1/input_items", None),
    ("/v1/responses//cancel", None),
])
def test_a_stored_responses_paths_name_it(path: str, named: str | None) -> None:
    assert stored_response_of(route_of(path)) == named
    assert served(route_of(path)) is (named is not None or route_of(path) == "/v1/responses")


def test_a_stored_response_is_read_with_get_and_cancelled_with_post() -> None:
    check_path("GET", "/v1/responses/resp_1")
    check_path("POST", "/v1/responses/resp_1/cancel")
    for method, path, allow in (("POST", "/v1/responses/resp_1", "GET, HEAD"),
                                ("GET", "/v1/responses/resp_1/cancel", "POST")):
        with pytest.raises(MethodNotAllowedError) as caught:
            check_path(method, path)
        assert caught.value.headers == {"allow": allow}
    with pytest.raises(UnknownPathError):
        check_path("GET", "/v1/responses/../load_lora_adapter")
