"""The paths the picker serves: the inference API, not the model servers' admin API.

A route that sends ``/v1/`` to a pool would otherwise carry everything a model server exposes there
to anyone who reaches the gateway, vLLM's ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` among them (and ``/sleep``, ``/wake_up``, ``/reset_prefix_cache``,
``/collective_rpc``, ``/start_profile`` elsewhere). So the picker answers 404 in OpenAI's format
(``Invalid URL (POST /v1/load_lora_adapter)``) for any path outside :data:`INFERENCE_PATHS` unless
the request's pool opts it in (``kvgate.io/extra-paths``; pools file ``extraPaths``).

A path is served when, without its query and trailing slash, it is one of the list or ends with one
at a segment boundary (a route may match a prefix such as ``/llama/v1/completions`` that Envoy
rewrites after the picker has seen it), or lies under ``/v1/models/`` (retrieving one model), or is a
stored response's (``/v1/responses/{id}``, ``/v1/responses/{id}/cancel``: vLLM's response store). A path
with a ``.`` or ``..`` segment is never served: a server that resolves them could reach what the
list leaves out. A served path with a method it does not take (``GET /v1/completions``) is 405 with
the ``allow`` header, as the model servers answer it; before, it reached the body parser and was
400 "request body is empty", and a browser's CORS preflight (``OPTIONS``) was too.
"""

from __future__ import annotations

from kvgate.policies.errors import MethodNotAllowedError, UnknownPathError

INFERENCE_PATHS: tuple[str, ...] = (
    # OpenAI's API (vLLM, SGLang, TensorRT-LLM's trtllm-serve, Triton's OpenAI front end)
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/models",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/realtime",  # (a WebSocket: ``extproc.upgrades``)
    # Anthropic's Messages API (vLLM serves it)
    "/v1/messages",
    "/v1/messages/count_tokens",
    # vLLM's pooling, scoring and reranking APIs (Jina's and Cohere's shapes)
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    # vLLM's tokenizer endpoints (read-only)
    "/tokenize",
    "/detokenize",
)
MODEL_PATH_PREFIX = "/v1/models/"
RESPONSE_PATH_PREFIX = "/v1/responses/"
"""vLLM's stored responses: ``GET /v1/responses/{id}`` (retrieve) and ``POST .../{id}/cancel``."""
_EXACT = frozenset(INFERENCE_PATHS)


def route_of(path: str) -> str:
    """A request's ``:path`` without its query string and trailing slash."""
    return path.split("?", 1)[0].rstrip("/")


def served(route: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether the picker serves ``route`` (a :func:`route_of`), with a pool's ``extra`` paths."""
    if route in _EXACT or route in extra:
        return True
    if "/." in route and any(segment in (".", "..") for segment in route.split("/")):
        return False
    if MODEL_PATH_PREFIX in route or stored_response_of(route) is not None:
        return True
    return any(route.endswith(path) for path in INFERENCE_PATHS) or any(route.endswith(p) for p in extra)


def stored_response_of(route: str) -> str | None:
    """The response id a stored response's path names (``/v1/responses/{id}`` or its ``/cancel``),
    else None."""
    at = route.find(RESPONSE_PATH_PREFIX)
    if at < 0:
        return None
    rest = route[at + len(RESPONSE_PATH_PREFIX):].split("/")
    if rest[0] and (len(rest) == 1 or (len(rest) == 2 and rest[1] == "cancel")):
        return rest[0]
    return None


def allowed_methods(route: str) -> str:
    """The methods the model servers take on a served ``route`` (the ``allow`` header's value):
    listing or retrieving models or a stored response is a GET (FastAPI adds HEAD), everything else
    a POST."""
    if route.endswith(("/v1/models", "/v1/realtime")) or MODEL_PATH_PREFIX in route:
        return "GET, HEAD"
    if stored_response_of(route) is not None and not route.endswith("/cancel"):
        return "GET, HEAD"
    return "POST"


def check_path(method: str, path: str, extra: frozenset[str] = frozenset()) -> None:
    """Raise :class:`UnknownPathError` (404) unless the picker serves ``path``, and
    :class:`MethodNotAllowedError` (405) for a method the path does not take. ``OPTIONS`` passes
    (a browser's CORS preflight: the model server answers it, as vLLM's CORS middleware does), and
    so does any method on a pool's ``extra`` paths (kvgate does not know what they take)."""
    route = route_of(path)
    shown = path if len(path) <= 200 else path[:200] + "..."
    if not served(route, extra):
        raise UnknownPathError(f"Invalid URL ({method} {shown})")
    if not method or method == "OPTIONS" or route in extra or any(route.endswith(p) for p in extra):
        return
    allow = allowed_methods(route)
    if method not in allow.split(", "):
        raise MethodNotAllowedError(f"Method Not Allowed ({method} {shown}): this path takes {allow}",
                                    allow=allow)
